// make_seed_corpus OUT_DIR: writes the seed corpus of codec_fuzzer into OUT_DIR (created if
// missing; existing seeds are overwritten): one valid message of every type in the fuzzer's input
// format (fuzz/fuzz_input.h; including a Welcome of an external model and the federated
// evaluation messages, with near misses: a NaN loss, tensors on an EvaluateResult), FitResults that
// pass CheckUpdate and Fold against TheFuzzRound() (aligned and misaligned frames, the largest
// weight and values), and near misses that fail one check each (shape, NaN, inf, bound, nonce,
// round, model version, examples, tensor count, frame size, protocol version, tensors on a
// Heartbeat), and one SecAggData per secure-aggregation stage with near misses of the stage
// decoders (a count past its bound, truncation, a trailing byte, a reason or share value out of
// range, a ciphertext too long, another stage's bytes).
//
// It checks its own valid FitResults with CheckUpdate and Fold, so the corpus cannot silently drift
// away from the round the fuzzer expects. Exit status 0 on success, 1 on any error.
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "aggregation/secagg/wire.h"
#include "aggregation/streaming_aggregator.h"
#include "common/member_certificate.h"
#include "common/signing.h"
#include "coordinator/update_check.h"
#include "fuzz/fuzz_input.h"
#include "proto/codec.h"

namespace huddle::fuzz {
namespace {

namespace secagg = aggregation::secagg;

// Tensors of the fuzz round's layout holding small recognisable values (|x| < 0.1).
TensorList UpdateTensors() {
  TensorList out;
  int k = 0;
  for (const TensorSpec& spec : TheFuzzRound().layout) {
    Tensor t(spec.name, spec.shape);
    for (float& x : t.data) x = static_cast<float>(k++ % 13 - 6) * 0.015625f;
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<wire::TensorPayload> Payloads(const TensorList& tensors) {
  std::vector<wire::TensorPayload> out;
  for (const Tensor& t : tensors) out.push_back(wire::TensorPayload::CopyOf(t));
  return out;
}

wire::Message ValidFitResult(const TensorList& tensors, uint64_t num_examples = 600) {
  wire::Message m = wire::MakeMessage(
      wire::FitResult{num_examples, 0.6931471805599453, 0.875, 1.25, kModelVersion, FuzzNonce()},
      kRound, "client-17");
  m.tensors = Payloads(tensors);
  return m;
}

// The fuzzer's own acceptance path, so that a "valid" seed really is one.
Status Accepts(const wire::Message& m) {
  HUDDLE_ASSIGN_OR_RETURN(wire::Message decoded,
                          wire::Decode(wire::EncodeToFrames(m, kChunkBytes), FuzzLimits()));
  HUDDLE_ASSIGN_OR_RETURN(auto spans, coordinator::CheckUpdate(decoded, TheFuzzRound().expect));
  HUDDLE_ASSIGN_OR_RETURN(auto agg, aggregation::StreamingAggregator::Create(
                                        TheFuzzRound().layout, TheFuzzRound().options));
  return agg.Fold(spans, static_cast<int64_t>(std::get<wire::FitResult>(m.body).num_examples));
}

class SeedWriter {
 public:
  explicit SeedWriter(std::filesystem::path dir) : dir_(std::move(dir)) {}

  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream out(dir_ / name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "make_seed_corpus: cannot write %s\n", (dir_ / name).c_str());
      ok_ = false;
    }
    ++count_;
  }
  void Write(const std::string& name, const wire::Message& m, uint64_t misaligned_mask = 0) {
    Write(name, SerializeFrames(wire::EncodeToFrames(m, kChunkBytes), misaligned_mask));
  }
  // A message the codec must accept (what happens next is another decoder's).
  void WriteDecodable(const std::string& name, const wire::Message& m,
                      uint64_t misaligned_mask = 0) {
    StatusOr<wire::Message> got = wire::Decode(wire::EncodeToFrames(m, kChunkBytes), FuzzLimits());
    if (!got.ok()) {
      std::fprintf(stderr, "make_seed_corpus: seed %s does not decode: %s\n", name.c_str(),
                   got.status().ToString().c_str());
      ok_ = false;
    }
    Write(name, m, misaligned_mask);
  }
  // A FitResult that must pass CheckUpdate and Fold.
  void WriteValid(const std::string& name, const wire::Message& m, uint64_t misaligned_mask = 0) {
    const Status st = Accepts(m);
    if (!st.ok()) {
      std::fprintf(stderr, "make_seed_corpus: seed %s is refused: %s\n", name.c_str(),
                   st.ToString().c_str());
      ok_ = false;
    }
    Write(name, m, misaligned_mask);
  }

  bool ok() const { return ok_; }
  int count() const { return count_; }

 private:
  std::filesystem::path dir_;
  bool ok_ = true;
  int count_ = 0;
};

// N bytes first, first + 1, ... (mod 256).
template <size_t N>
std::array<uint8_t, N> Pattern(uint8_t first) {
  std::array<uint8_t, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = static_cast<uint8_t>(first + i);
  return out;
}

secagg::ShareRecord Record(uint32_t peer) {
  secagg::ShareRecord r;
  r.peer = peer;
  r.ciphertext.assign(120, static_cast<uint8_t>(0x30 + peer));
  r.self_mask_hash = Pattern<32>(0x01);
  r.mask_key_hash = Pattern<32>(0x21);
  r.self_mask_commitment = Pattern<32>(0x41);
  r.signature = Pattern<64>(0x61);
  return r;
}

// The SecAggData of `m` in the fuzz round: a member's with the round's nonce, the coordinator's
// without.
template <class T>
wire::Message AsStageMessage(const T& m) {
  const bool member = secagg::FromMember(static_cast<uint32_t>(secagg::StageOf<T>()));
  return secagg::ToMessage(m, kRound, member ? "client-17" : "coordinator",
                           member ? FuzzNonce() : std::string());
}

// One SecAggData per stage, and near misses of the stage decoders (a count past its bound, a
// truncated list, a trailing byte, a field outside its range, another stage's bytes).
void WriteStages(SeedWriter& w) {
  const SigningKey project = SigningKey::FromSeed(Pattern<32>(0x70));
  secagg::MemberList list;
  for (uint32_t i : {0u, 2u, 3u}) {
    MemberCertificate c;
    c.id = "client-" + std::to_string(i);
    c.transport_key = Pattern<32>(static_cast<uint8_t>(0xe0 + i));
    c.signing_key = SigningKey::FromSeed(Pattern<32>(static_cast<uint8_t>(i))).public_key();
    c.not_after = i == 0 ? 0 : 1893456000;
    list.members.push_back(
        {i, Certify(c, project), {Pattern<32>(0x10), Pattern<32>(0x30), Pattern<32>(0x50)}});
  }
  const secagg::Reveal reveal{Pattern<32>(0x90), Pattern<64>(0xa0)};
  secagg::UnmaskResponse response;
  response.self_mask_shares = {{0, secagg::Share{0, {1, 2, 3, 4, secagg::kFieldPrime - 1}}}};
  response.mask_key_shares = {{2, secagg::Share{0, {6, 7, 8, 9, 0}}}};
  const wire::Message stages[] = {
      AsStageMessage(list.members[0].keys),
      AsStageMessage(list),
      AsStageMessage(reveal),
      AsStageMessage(secagg::SeedList{{reveal, reveal, reveal}}),
      AsStageMessage(secagg::ShareKeys{Pattern<32>(0x41), {Record(0), Record(3)}}),
      AsStageMessage(secagg::ShareList{{Record(0), Record(3)}}),
      AsStageMessage(
          secagg::Verdict{{{0, secagg::Complaint::kMissing}, {3, secagg::Complaint::kWrongShare}}}),
      AsStageMessage(secagg::MaskRequest{{0, 1, 2}}),
      AsStageMessage(secagg::Survivors{{0, 1, 2}, {0, 2}}),
      AsStageMessage(secagg::Consistency{Pattern<64>(0xc0)}),
      AsStageMessage(secagg::UnmaskRequest{{{0, Pattern<64>(0xd0)}, {2, Pattern<64>(0xd2)}}}),
      AsStageMessage(response),
  };
  for (const wire::Message& m : stages) {
    const uint32_t stage = std::get<wire::SecAggData>(m.body).stage;
    const std::string name = "secagg_stage_" + std::to_string(stage);
    w.WriteDecodable(name, m);
    if (stage == 2) w.WriteDecodable(name + "_misaligned", m, ~uint64_t{0});
  }
  // Near misses, each refused by its stage's decoder (the codec accepts them).
  auto bytes = [](std::string b) { return std::make_shared<const std::string>(std::move(b)); };
  auto word = [](uint32_t v) {
    std::string out;
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
    return out;
  };
  auto coordinator = [&](secagg::Stage stage, std::string b) {
    return secagg::ToMessage(stage, bytes(std::move(b)), kRound, "coordinator");
  };
  auto member = [&](secagg::Stage stage, std::string b) {
    return secagg::ToMessage(stage, bytes(std::move(b)), kRound, "client-17", FuzzNonce());
  };
  const std::string encoded_list = secagg::Encode(list);
  w.WriteDecodable("secagg_members_over_bound",
                   coordinator(secagg::Stage::kMemberList,
                               word(static_cast<uint32_t>(secagg::kMaxMembers) + 1) + "xxxx"));
  w.WriteDecodable(
      "secagg_member_list_truncated",
      coordinator(secagg::Stage::kMemberList, encoded_list.substr(0, encoded_list.size() - 1)));
  w.WriteDecodable("secagg_member_list_trailing_byte",
                   coordinator(secagg::Stage::kMemberList, encoded_list + '\0'));
  w.WriteDecodable("secagg_member_list_as_unmask",
                   coordinator(secagg::Stage::kUnmask, encoded_list));
  w.WriteDecodable("secagg_complaint_reason_5",
                   member(secagg::Stage::kVerdict, word(1) + word(3) + word(5)));
  secagg::UnmaskResponse outside = response;
  outside.mask_key_shares[0].share.y[4] = secagg::kFieldPrime;
  w.WriteDecodable("secagg_share_outside_field",
                   member(secagg::Stage::kUnmaskResponse, secagg::Encode(outside)));
  secagg::ShareList long_ciphertext{{Record(0)}};
  long_ciphertext.shares[0].ciphertext.assign(257, 0x33);
  w.WriteDecodable("secagg_ciphertext_257",
                   coordinator(secagg::Stage::kShareList, secagg::Encode(long_ciphertext)));
}

void WriteOtherTypes(SeedWriter& w) {
  using namespace wire;
  w.Write("join", MakeMessage(Join{"client-17", 1234, "huddle-0.1"}, 0, "client-17"));
  w.Write("welcome", MakeMessage(Welcome{"fuzz-job", ModelSpec{"mlp", 6, {5}, 3}, 1500}, kRound,
                                 "coordinator"));
  Message instruction =
      MakeMessage(FitInstruction{kModelVersion, TrainConfig{1, 32, 0.02, 0.9, 1e-4},
                                 0xdeadbeefcafef00dull, 30000, FuzzNonce()},
                  kRound, "coordinator");
  instruction.tensors = Payloads(UpdateTensors());
  w.Write("fit_instruction", instruction);
  w.Write("fit_instruction_misaligned", instruction, ~uint64_t{0});
  w.Write("upload_request", MakeMessage(UploadRequest{600, FuzzNonce()}, kRound, "client-17"));
  w.Write("upload_grant", MakeMessage(UploadGrant{}, kRound, "coordinator"));
  w.Write("heartbeat", MakeMessage(Heartbeat{}, kRound, "client-17"));
  w.Write("error", MakeError(ErrorCode::kWrongRound,
                             "round 6 is over; the coordinator is in round 7", kRound));
  w.Write("shutdown", MakeMessage(Shutdown{"job finished after 40 rounds"}, 40, "coordinator"));
  // An external model (tensors only), and federated evaluation's two messages.
  ModelSpec external;
  external.kind = "external";
  external.tensors = {TensorSpec{"conv1.weight", DType::kFloat32, {8, 1, 3, 3}},
                      TensorSpec{"conv1.bias", DType::kFloat32, {8}},
                      TensorSpec{"head/kernel:0", DType::kFloat32, {10, 8}},
                      TensorSpec{"scale", DType::kFloat32, {}}};
  w.Write("welcome_external", MakeMessage(Welcome{"fuzz-job", external, 1500}, 0, "coordinator"));
  Message evaluate =
      MakeMessage(EvaluateInstruction{kModelVersion, FuzzNonce(), 30000}, kRound, "coordinator");
  evaluate.tensors = Payloads(UpdateTensors());
  w.Write("evaluate_instruction", evaluate);
  w.Write("evaluate_result",
          MakeMessage(EvaluateResult{500, 0.4375, 0.875, kModelVersion, FuzzNonce()}, kRound,
                      "client-17"));
  w.Write("evaluate_result_nan_loss",
          MakeMessage(EvaluateResult{500, std::numeric_limits<double>::quiet_NaN(), 0.875,
                                     kModelVersion, FuzzNonce()},
                      kRound, "client-17"));
  Message result_with_tensors = MakeMessage(
      EvaluateResult{500, 0.4375, 0.875, kModelVersion, FuzzNonce()}, kRound, "client-17");
  result_with_tensors.tensors = Payloads(UpdateTensors());
  w.Write("evaluate_result_with_tensors", result_with_tensors);

  // Secure aggregation (version 5): the session, the masked input, and one SecAggData per stage.
  Message secure = instruction;
  std::get<FitInstruction>(secure.body).secure_aggregation =
      SecureAggregation{.session = std::string(kSecAggSessionBytes, '\x42'),
                        .index = 1,
                        .members = 5,
                        .threshold = 2,
                        .bits = 32,
                        .length = 83,
                        .min_survivors = 3,
                        .edge_threshold = uint64_t{1} << 31,
                        .scale_exponent = 10,
                        .noise_variance = 4096,
                        .weight_cap = 100,
                        .clip_norm = 1.0};
  w.Write("fit_instruction_secagg", secure);
  for (DType dtype : {DType::kUint32, DType::kUint64}) {
    Message masked =
        MakeMessage(SecAggMaskedInput{FuzzNonce(), kModelVersion}, kRound, "client-17");
    for (TensorPayload p : Payloads(UpdateTensors())) {
      const int64_t words = p.spec.NumElements();
      auto bytes = std::make_shared<std::vector<std::byte>>(
          static_cast<size_t>(words) * DTypeSize(dtype), std::byte{0x5a});
      p.spec.dtype = dtype;
      p.bytes = std::span<const std::byte>(*bytes);
      p.owner = bytes;
      masked.tensors.push_back(std::move(p));
    }
    w.Write(dtype == DType::kUint32 ? "secagg_masked_input_32" : "secagg_masked_input_64", masked);
  }
  WriteStages(w);

  Message old_version = MakeMessage(Heartbeat{}, kRound, "client-17");
  old_version.protocol_version = 1;
  w.Write("heartbeat_version_1", old_version);
  Message heartbeat_with_tensor = MakeMessage(Heartbeat{}, kRound, "client-17");
  heartbeat_with_tensor.tensors = Payloads(UpdateTensors());
  w.Write("heartbeat_with_tensors", heartbeat_with_tensor);
}

void WriteFitResults(SeedWriter& w) {
  const TensorList tensors = UpdateTensors();
  w.WriteValid("fit_result", ValidFitResult(tensors));
  w.WriteValid("fit_result_misaligned", ValidFitResult(tensors), ~uint64_t{0});
  TensorList extreme = tensors;
  for (Tensor& t : extreme) {
    for (size_t i = 0; i < t.data.size(); ++i) {
      t.data[i] = static_cast<float>(i % 2 == 0 ? kMaxAbsValue : -kMaxAbsValue);
    }
  }
  w.WriteValid("fit_result_extreme", ValidFitResult(extreme, kMaxWeight));

  TensorList wrong_shape = tensors;
  wrong_shape[0].spec.shape = {6, 5};
  w.Write("fit_result_wrong_shape", ValidFitResult(wrong_shape));
  TensorList with_nan = tensors;
  with_nan[3].data[1] = std::numeric_limits<float>::quiet_NaN();
  w.Write("fit_result_nan", ValidFitResult(with_nan));
  TensorList with_inf = tensors;
  with_inf[2].data[7] = -std::numeric_limits<float>::infinity();
  w.Write("fit_result_inf", ValidFitResult(with_inf));
  TensorList too_large = tensors;
  too_large[0].data[29] = std::nextafter(static_cast<float>(kMaxAbsValue), 2048.0f);
  w.Write("fit_result_above_bound", ValidFitResult(too_large));
  TensorList missing = tensors;
  missing.pop_back();
  w.Write("fit_result_missing_tensor", ValidFitResult(missing));

  wire::Message m = ValidFitResult(tensors);
  std::get<wire::FitResult>(m.body).nonce[0] ^= 1;
  w.Write("fit_result_wrong_nonce", m);
  m = ValidFitResult(tensors);
  m.round = kRound - 1;
  w.Write("fit_result_wrong_round", m);
  m = ValidFitResult(tensors);
  std::get<wire::FitResult>(m.body).model_version = kModelVersion + 1;
  w.Write("fit_result_wrong_version", m);
  w.Write("fit_result_zero_examples", ValidFitResult(tensors, 0));
  w.Write("fit_result_too_many_examples", ValidFitResult(tensors, kMaxWeight + 1));

  // A tensor frame one byte short of what its spec says.
  std::vector<wire::Frame> frames = wire::EncodeToFrames(ValidFitResult(tensors), kChunkBytes);
  frames[2].bytes = frames[2].bytes.first(frames[2].bytes.size() - 1);
  w.Write("fit_result_short_frame", SerializeFrames(frames));
}

}  // namespace
}  // namespace huddle::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 1;
  }
  std::error_code ec;
  std::filesystem::create_directories(argv[1], ec);
  if (ec) {
    std::fprintf(stderr, "make_seed_corpus: cannot create %s: %s\n", argv[1], ec.message().c_str());
    return 1;
  }
  huddle::fuzz::SeedWriter writer(argv[1]);
  huddle::fuzz::WriteOtherTypes(writer);
  huddle::fuzz::WriteFitResults(writer);
  if (!writer.ok()) return 1;
  std::printf("make_seed_corpus: wrote %d seeds to %s\n", writer.count(), argv[1]);
  return 0;
}
