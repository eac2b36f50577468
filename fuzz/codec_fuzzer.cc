// libFuzzer target over the wire decoder (proto/codec.h), secure aggregation's stage decoders
// (aggregation/secagg/wire.h) and the update validator (coordinator/update_check.h +
// aggregation/streaming_aggregator.h): everything a coordinator or member does with the bytes of
// an incoming message before its round logic.
//
// Input: a multipart message as a sequence of frames, each [u32 little-endian word][bytes]; the
// word's low 31 bits are the frame's length (a length larger than what remains takes the rest) and
// bit 31 places the frame at an odd address. At most 300 frames; the rest is ignored. Details in
// fuzz/fuzz_input.h; fuzz/make_seed_corpus writes valid messages of every type in this format.
//
// Properties checked (a violation aborts, which libFuzzer reports as a crash with the input):
//   1. Decode never crashes and fails only as proto/codec.h documents: InvalidArgument
//      "malformed message: ..." or FailedPrecondition "protocol version mismatch ...".
//   2. A decoded message keeps the codec's promises: protocol version, every extra frame a chunk of
//      a tensor (fuzz inputs use kChunkBytes = 32, so small inputs reach multi-chunk tensors and
//      their reassembly), tensors only on FitInstruction/FitResult/EvaluateInstruction (float32),
//      SecAggMaskedInput (all uint32 or all uint64) and SecAggData (exactly one one-dimensional
//      uint8 frame named "secagg"), valid and 4-byte aligned tensors whose bytes equal their
//      frames', string limits (and an external model's tensor specs within the tensor limits),
//      16-byte nonces (a SecAggData's: empty or 16 bytes), a 32-byte secure-aggregation session
//      within its ranges, a SecAggData stage in 1-12, finite doubles, a known error code.
//   3. Round trip: EncodeToFrames then Decode succeeds and gives a message equal in every field
//      (doubles and tensor bytes bitwise), and encodes to the same header bytes again.
//   4. For a FitResult: CheckUpdate against TheFuzzRound() never crashes; if it passes, the spans
//      match the layout, and Fold into a StreamingAggregator holding one known update either
//      succeeds (the weighted mean is then within the documented precision of the exact mean and
//      inside +-max_abs_value) or fails leaving the aggregator bitwise unchanged (rollback).
//   5. For a SecAggData: PayloadOf gives its frame, and the Decode<T> of its stage
//      (aggregation/secagg/wire.h) either refuses the bytes with InvalidArgument
//      "malformed secure-aggregation ..." or decodes a message that re-encodes to exactly the same
//      bytes (the encoding is canonical).
//
// Reproduce a finding: build-fuzz/fuzz/codec_fuzzer build-fuzz/artifacts/crash-<sha1>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "aggregation/secagg/wire.h"
#include "aggregation/streaming_aggregator.h"
#include "coordinator/update_check.h"
#include "fuzz/fuzz_input.h"
#include "proto/codec.h"

namespace huddle::fuzz {
namespace {

namespace secagg = aggregation::secagg;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "codec_fuzzer: property violated: %s\n", what.c_str());
  std::abort();
}

// Messages are literals so that a passing check costs nothing; failures that need to show values
// call Fail directly.
void Require(bool ok, const char* what) {
  if (!ok) Fail(what);
}

bool SameDouble(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}

// Field-by-field equality of two bodies of the same alternative.
struct SameFields {
  bool operator()(const wire::Join& a, const wire::Join& b) const {
    return a.client_id == b.client_id && a.num_examples == b.num_examples &&
           a.agent_version == b.agent_version && a.job == b.job && a.datasets == b.datasets;
  }
  bool operator()(const wire::Welcome& a, const wire::Welcome& b) const {
    return a.job_name == b.job_name && a.model == b.model &&
           a.heartbeat_interval_ms == b.heartbeat_interval_ms;
  }
  bool operator()(const wire::FitInstruction& a, const wire::FitInstruction& b) const {
    return a.model_version == b.model_version && a.train.epochs == b.train.epochs &&
           a.train.batch_size == b.train.batch_size &&
           SameDouble(a.train.learning_rate, b.train.learning_rate) &&
           SameDouble(a.train.momentum, b.train.momentum) &&
           SameDouble(a.train.weight_decay, b.train.weight_decay) && a.seed == b.seed &&
           a.deadline_ms == b.deadline_ms && a.nonce == b.nonce &&
           a.secure_aggregation == b.secure_aggregation;  // its double is finite (the codec)
  }
  bool operator()(const wire::UploadRequest& a, const wire::UploadRequest& b) const {
    return a.num_examples == b.num_examples && a.nonce == b.nonce;
  }
  bool operator()(const wire::UploadGrant&, const wire::UploadGrant&) const { return true; }
  bool operator()(const wire::FitResult& a, const wire::FitResult& b) const {
    return a.num_examples == b.num_examples && SameDouble(a.train_loss, b.train_loss) &&
           SameDouble(a.train_accuracy, b.train_accuracy) &&
           SameDouble(a.train_seconds, b.train_seconds) && a.model_version == b.model_version &&
           a.nonce == b.nonce;
  }
  bool operator()(const wire::Heartbeat&, const wire::Heartbeat&) const { return true; }
  bool operator()(const wire::Error& a, const wire::Error& b) const {
    return a.code == b.code && a.message == b.message;
  }
  bool operator()(const wire::Shutdown& a, const wire::Shutdown& b) const {
    return a.reason == b.reason;
  }
  bool operator()(const wire::JobOffer& a, const wire::JobOffer& b) const {
    return a.job == b.job && a.data == b.data;
  }
  bool operator()(const wire::EvaluateInstruction& a, const wire::EvaluateInstruction& b) const {
    return a.model_version == b.model_version && a.nonce == b.nonce &&
           a.deadline_ms == b.deadline_ms;
  }
  bool operator()(const wire::EvaluateResult& a, const wire::EvaluateResult& b) const {
    return a.num_examples == b.num_examples && SameDouble(a.loss, b.loss) &&
           SameDouble(a.accuracy, b.accuracy) && a.model_version == b.model_version &&
           a.nonce == b.nonce;
  }
  // Secure aggregation's bodies: integers and bytes only, compared as values.
  template <typename A>
  bool operator()(const A& a, const A& b) const {
    return a == b;
  }
  template <typename A, typename B>
  bool operator()(const A&, const B&) const {
    return false;  // different alternatives
  }
};

bool SameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// Empty if equal, else the first difference.
std::string Difference(const wire::Message& a, const wire::Message& b) {
  if (a.protocol_version != b.protocol_version) return "protocol_version";
  if (a.round != b.round) return "round";
  if (a.sender != b.sender) return "sender";
  if (a.type() != b.type()) return "type";
  if (!std::visit(SameFields{}, a.body, b.body)) {
    return std::string(wire::MessageTypeName(a.type())) + " body";
  }
  if (a.tensors.size() != b.tensors.size()) return "tensor count";
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].spec != b.tensors[i].spec) return "tensor " + std::to_string(i) + " spec";
    if (!SameBytes(a.tensors[i].bytes, b.tensors[i].bytes)) {
      return "tensor " + std::to_string(i) + " bytes";
    }
  }
  return {};
}

// Property 1: only the documented errors.
void CheckRejection(const Status& status) {
  const bool malformed = status.code() == absl::StatusCode::kInvalidArgument &&
                         absl::StartsWith(status.message(), "malformed message: ");
  const bool version = status.code() == absl::StatusCode::kFailedPrecondition &&
                       absl::StartsWith(status.message(), "protocol version mismatch");
  if (!malformed && !version) {
    Fail("Decode failed with an undocumented error: " + status.ToString());
  }
}

// Property 2: what Decode promises about a message it accepts.
void CheckDecoded(const wire::Message& m, std::span<const wire::Frame> frames) {
  const wire::CodecLimits limits = FuzzLimits();
  Require(m.protocol_version == wire::kProtocolVersion, "accepted another protocol version");
  size_t tensor_frames = 0;
  for (const wire::TensorPayload& t : m.tensors) {
    tensor_frames += wire::ChunkCount(t.bytes.size(), kChunkBytes);
  }
  Require(tensor_frames + 1 == frames.size(), "tensor chunks != frames - 1");
  Require(m.sender.size() <= limits.max_string_bytes, "sender over the limit");
  const bool masked = m.type() == wire::MessageType::kSecAggMaskedInput;
  const bool stage = m.type() == wire::MessageType::kSecAggData;
  const bool carries = m.type() == wire::MessageType::kFitInstruction ||
                       m.type() == wire::MessageType::kFitResult ||
                       m.type() == wire::MessageType::kEvaluateInstruction || masked || stage;
  Require(carries || m.tensors.empty(), "tensors on a message type that carries none");
  Require(!stage || (m.tensors.size() == 1 && m.tensors[0].spec.name == "secagg" &&
                     m.tensors[0].spec.shape.size() == 1),
          "a secagg_data without exactly one one-dimensional frame named 'secagg'");
  size_t next_frame = 1;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const wire::TensorPayload& t = m.tensors[i];
    Require(!t.spec.name.empty() && t.spec.name.size() <= limits.max_string_bytes,
            "tensor name empty or over the limit");
    if (masked) {
      Require(t.spec.dtype == m.tensors[0].spec.dtype &&
                  (t.spec.dtype == DType::kUint32 || t.spec.dtype == DType::kUint64),
              "masked input words not all uint32 or all uint64");
    } else if (stage) {
      Require(t.spec.dtype == DType::kUint8, "secagg_data frame is not uint8");
    } else {
      Require(t.spec.dtype == DType::kFloat32, "tensor dtype is not float32");
    }
    Require(ValidateShape(t.spec.shape, limits.max_tensor_elements, "tensor").ok(),
            "tensor shape invalid");
    Require(static_cast<int64_t>(t.bytes.size()) == t.spec.ByteLength(),
            "tensor byte length differs from its shape's");
    Require(reinterpret_cast<uintptr_t>(t.bytes.data()) % alignof(float) == 0,
            "tensor payload not 4-byte aligned");
    size_t offset = 0;
    for (size_t c = 0; c < wire::ChunkCount(t.bytes.size(), kChunkBytes); ++c) {
      const std::span<const std::byte> part = frames[next_frame++].bytes;
      Require(part.size() <= t.bytes.size() - offset, "a chunk runs past its tensor");
      Require(SameBytes(t.bytes.subspan(offset, part.size()), part),
              "tensor payload differs from its frames");
      offset += part.size();
    }
    Require(offset == t.bytes.size(), "tensor chunks do not cover the tensor");
    Require(t.owner != nullptr || t.bytes.empty(), "tensor payload without an owner");
  }
  struct Body {
    const wire::CodecLimits& limits;
    void operator()(const wire::Join& b) const {
      Require(b.client_id.size() <= limits.max_string_bytes, "join.client_id over the limit");
      Require(b.agent_version.size() <= limits.max_string_bytes,
              "join.agent_version over the limit");
      Require(b.job.size() <= limits.max_string_bytes, "join.job over the limit");
      Require(b.datasets.size() <= wire::kMaxDatasetNames, "join.datasets over the limit");
      for (const std::string& d : b.datasets) {
        Require(d.size() <= limits.max_string_bytes, "join.datasets name over the limit");
      }
    }
    void operator()(const wire::JobOffer& b) const {
      Require(b.job.size() <= limits.max_string_bytes, "job_offer.job over the limit");
      Require(b.data.size() <= limits.max_string_bytes, "job_offer.data over the limit");
    }
    void operator()(const wire::Welcome& b) const {
      Require(b.job_name.size() <= limits.max_string_bytes, "welcome.job_name over the limit");
      Require(b.model.kind.size() <= limits.max_string_bytes, "welcome.model.kind over the limit");
      Require(b.model.hidden.size() <= 64, "welcome.model.hidden over 64 layers");
      Require(b.model.layers.size() <= 256, "welcome.model.layers over 256 layers");
      Require(b.model.tensors.size() <= limits.max_tensors, "welcome.model.tensors over the limit");
      for (const TensorSpec& t : b.model.tensors) {
        Require(!t.name.empty() && t.name.size() <= limits.max_string_bytes,
                "welcome.model.tensors name empty or over the limit");
        Require(t.dtype == DType::kFloat32, "welcome.model.tensors dtype is not float32");
        Require(ValidateShape(t.shape, limits.max_tensor_elements, "tensor").ok(),
                "welcome.model.tensors shape invalid");
      }
    }
    void operator()(const wire::FitInstruction& b) const {
      Require(b.nonce.size() == wire::kNonceBytes, "fit_instruction.nonce size");
      if (b.secure_aggregation) {
        const wire::SecureAggregation& a = *b.secure_aggregation;
        Require(a.session.size() == wire::kSecAggSessionBytes && (a.bits == 32 || a.bits == 64) &&
                    a.members >= 2 && a.index < a.members && a.threshold >= 1 &&
                    a.threshold < a.members && a.min_survivors >= 1 &&
                    a.min_survivors <= a.members && a.edge_threshold >= 1 &&
                    a.edge_threshold <= (uint64_t{1} << 32) && a.length >= 1 &&
                    a.length <= (uint64_t{1} << 36) && a.scale_exponent >= -1100 &&
                    a.scale_exponent <= 1100 && a.noise_variance <= (uint64_t{1} << 52) &&
                    std::isfinite(a.clip_norm) && a.clip_norm > 0,
                "fit_instruction.secure_aggregation out of range");
      }
      Require(b.privacy.mode != wire::UpdatePrivacy::Mode::kDistributed ||
                  (b.secure_aggregation && b.secure_aggregation->noise_variance > 0),
              "fit_instruction.privacy.mode distributed without a noise share");
      Require(std::isfinite(b.train.learning_rate) && std::isfinite(b.train.momentum) &&
                  std::isfinite(b.train.weight_decay),
              "fit_instruction.train has a non-finite double");
    }
    void operator()(const wire::UploadRequest& b) const {
      Require(b.nonce.size() == wire::kNonceBytes, "upload_request.nonce size");
    }
    void operator()(const wire::FitResult& b) const {
      Require(b.nonce.size() == wire::kNonceBytes, "fit_result.nonce size");
      Require(std::isfinite(b.train_loss) && std::isfinite(b.train_accuracy) &&
                  std::isfinite(b.train_seconds),
              "fit_result has a non-finite double");
    }
    void operator()(const wire::Error& b) const {
      Require(b.message.size() <= limits.max_text_bytes, "error.message over the limit");
      Require(static_cast<int>(b.code) >= 0 &&
                  static_cast<int>(b.code) <= static_cast<int>(wire::ErrorCode::kAuthRefused),
              "unknown error code");
    }
    void operator()(const wire::Shutdown& b) const {
      Require(b.reason.size() <= limits.max_text_bytes, "shutdown.reason over the limit");
    }
    void operator()(const wire::EvaluateInstruction& b) const {
      Require(b.nonce.size() == wire::kNonceBytes, "evaluate_instruction.nonce size");
    }
    void operator()(const wire::EvaluateResult& b) const {
      Require(b.nonce.size() == wire::kNonceBytes, "evaluate_result.nonce size");
      Require(std::isfinite(b.loss) && std::isfinite(b.accuracy),
              "evaluate_result has a non-finite double");
    }
    void operator()(const wire::UploadGrant&) const {}
    void operator()(const wire::Heartbeat&) const {}
    void operator()(const wire::SecAggMaskedInput& b) const {
      Require(b.nonce.size() == wire::kNonceBytes, "secagg_masked_input.nonce size");
    }
    void operator()(const wire::SecAggData& b) const {
      Require(secagg::IsStage(b.stage), "secagg_data.stage outside 1-12");
      Require(b.nonce.empty() || b.nonce.size() == wire::kNonceBytes, "secagg_data.nonce size");
    }
  };
  std::visit(Body{limits}, m.body);
}

// Property 3.
void CheckRoundTrip(const wire::Message& m) {
  const std::vector<wire::Frame> frames = wire::EncodeToFrames(m, kChunkBytes);
  StatusOr<wire::Message> again = wire::Decode(frames, FuzzLimits());
  if (!again.ok()) Fail("re-encoded message does not decode: " + again.status().ToString());
  const std::string diff = Difference(m, *again);
  if (!diff.empty()) Fail("re-encoded message differs in " + diff);
  Require(wire::EncodeHeader(*again) == wire::EncodeHeader(m), "header encoding is not stable");
}

// Property 5: a stage's bytes decoded with the Decode<T> of that stage, and encoded again.
template <class T>
StatusOr<std::string> DecodeAndEncode(std::span<const std::byte> bytes) {
  HUDDLE_ASSIGN_OR_RETURN(T m, secagg::Decode<T>(bytes));
  return secagg::Encode(m);
}
StatusOr<std::string> Reencode(uint32_t stage, std::span<const std::byte> bytes) {
  switch (static_cast<secagg::Stage>(stage)) {
    case secagg::Stage::kAdvertise:
      return DecodeAndEncode<secagg::Advertisement>(bytes);
    case secagg::Stage::kMemberList:
      return DecodeAndEncode<secagg::MemberList>(bytes);
    case secagg::Stage::kReveal:
      return DecodeAndEncode<secagg::Reveal>(bytes);
    case secagg::Stage::kSeeds:
      return DecodeAndEncode<secagg::SeedList>(bytes);
    case secagg::Stage::kShares:
      return DecodeAndEncode<secagg::ShareKeys>(bytes);
    case secagg::Stage::kShareList:
      return DecodeAndEncode<secagg::ShareList>(bytes);
    case secagg::Stage::kVerdict:
      return DecodeAndEncode<secagg::Verdict>(bytes);
    case secagg::Stage::kMask:
      return DecodeAndEncode<secagg::MaskRequest>(bytes);
    case secagg::Stage::kSurvivors:
      return DecodeAndEncode<secagg::Survivors>(bytes);
    case secagg::Stage::kConsistency:
      return DecodeAndEncode<secagg::Consistency>(bytes);
    case secagg::Stage::kUnmask:
      return DecodeAndEncode<secagg::UnmaskRequest>(bytes);
    case secagg::Stage::kUnmaskResponse:
      return DecodeAndEncode<secagg::UnmaskResponse>(bytes);
  }
  Fail(absl::StrFormat("the codec accepted secagg_data.stage %d", stage));
}

void CheckStagePayload(const wire::Message& m) {
  const uint32_t stage = std::get<wire::SecAggData>(m.body).stage;
  StatusOr<std::span<const std::byte>> payload = secagg::PayloadOf(m);
  if (!payload.ok())
    Fail("PayloadOf refused a decoded secagg_data: " + payload.status().ToString());
  // An exactly-sized copy: the payload may be a view into a larger reassembly buffer, and ASan
  // must see a read past the message's end.
  const std::vector<std::byte> bytes(payload->begin(), payload->end());
  StatusOr<std::string> again = Reencode(stage, bytes);
  if (!again.ok()) {
    if (again.status().code() != absl::StatusCode::kInvalidArgument ||
        !absl::StartsWith(again.status().message(), "malformed secure-aggregation ")) {
      Fail("a stage's decoder failed with an undocumented error: " + again.status().ToString());
    }
    return;
  }
  if (again->size() != bytes.size() ||
      (!bytes.empty() && std::memcmp(again->data(), bytes.data(), bytes.size()) != 0)) {
    Fail(absl::StrFormat("stage %d: %d bytes decode but re-encode to %d other bytes", stage,
                         bytes.size(), again->size()));
  }
}

// The aggregator of property 4, holding exactly one known update (kBaseWeight x BaseUpdate()).
constexpr int64_t kBaseWeight = 1;

const std::vector<std::vector<float>>& BaseUpdate() {
  static const auto* const base = [] {
    auto* b = new std::vector<std::vector<float>>;
    int k = 0;
    for (const TensorSpec& spec : TheFuzzRound().layout) {
      std::vector<float>& t = b->emplace_back(static_cast<size_t>(spec.NumElements()));
      for (float& x : t) x = std::ldexp(static_cast<float>(k++ % 17 - 8), -3);  // -1 .. 1
    }
    return b;
  }();
  return *base;
}

std::vector<std::span<const float>> Spans(const std::vector<std::vector<float>>& tensors) {
  return {tensors.begin(), tensors.end()};
}

aggregation::StreamingAggregator& Aggregator() {
  static auto* const agg = [] {
    StatusOr<aggregation::StreamingAggregator> a =
        aggregation::StreamingAggregator::Create(TheFuzzRound().layout, TheFuzzRound().options);
    if (!a.ok()) Fail("cannot create the aggregator: " + a.status().ToString());
    return new aggregation::StreamingAggregator(std::move(*a));
  }();
  return *agg;
}

// Folds the base update into an empty aggregator.
void ResetToBase(aggregation::StreamingAggregator& agg) {
  agg.Reset();
  const auto spans = Spans(BaseUpdate());
  const Status st = agg.Fold(spans, kBaseWeight);
  if (!st.ok()) Fail("folding the base update failed: " + st.ToString());
}

const TensorList& BaseMean() {
  static const auto* const mean = [] {
    auto* out = new TensorList;
    ResetToBase(Aggregator());
    const Status st = Aggregator().WeightedMean(out);
    if (!st.ok()) Fail("mean of the base update failed: " + st.ToString());
    return out;
  }();
  return *mean;
}

bool SameTensors(const TensorList& a, const TensorList& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].spec != b[i].spec || a[i].data.size() != b[i].data.size() ||
        std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

// Property 4.
void CheckUpdateAndFold(const wire::Message& m) {
  const FuzzRound& round = TheFuzzRound();
  StatusOr<std::vector<std::span<const float>>> spans = coordinator::CheckUpdate(m, round.expect);
  if (!spans.ok()) {
    if (spans.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("CheckUpdate failed with a non-InvalidArgument error: " + spans.status().ToString());
    }
    return;
  }
  Require(spans->size() == round.layout.size(), "CheckUpdate returned a wrong tensor count");
  for (size_t i = 0; i < spans->size(); ++i) {
    Require(static_cast<int64_t>((*spans)[i].size()) == round.layout[i].NumElements(),
            "CheckUpdate returned a span of the wrong size");
  }
  const int64_t weight = static_cast<int64_t>(std::get<wire::FitResult>(m.body).num_examples);

  const TensorList& base_mean = BaseMean();
  aggregation::StreamingAggregator& agg = Aggregator();
  ResetToBase(agg);
  const Status folded = agg.Fold(*spans, weight);
  TensorList mean;
  const Status st = agg.WeightedMean(&mean);
  if (!st.ok()) Fail("weighted mean failed: " + st.ToString());
  if (!folded.ok()) {
    if (folded.code() != absl::StatusCode::kInvalidArgument) {
      Fail("Fold failed with a non-InvalidArgument error: " + folded.ToString());
    }
    if (agg.count() != 1 || agg.total_weight() != kBaseWeight || !SameTensors(mean, base_mean)) {
      Fail("a rejected fold changed the aggregator: " + folded.ToString());
    }
    return;
  }
  Require(agg.count() == 2 && agg.total_weight() == kBaseWeight + weight,
          "count or total weight wrong after a fold");
  // Each term is within 2^-(S+1) of w * x, so the mean of two is within 2^-S of the exact mean
  // before the final rounding to float (half an ulp, < 2^-24 relative).
  const double tolerance = std::ldexp(1.0, -agg.fraction_bits());
  for (size_t t = 0; t < mean.size(); ++t) {
    const std::span<const float> x = (*spans)[t];
    for (size_t i = 0; i < x.size(); ++i) {
      const double exact = (static_cast<double>(BaseUpdate()[t][i]) * kBaseWeight +
                            static_cast<double>(x[i]) * static_cast<double>(weight)) /
                           static_cast<double>(kBaseWeight + weight);
      const double got = mean[t].data[i];
      Require(std::fabs(got) <= kMaxAbsValue, "mean outside +-max_abs_value");
      if (!(std::fabs(got - exact) <= tolerance + std::fabs(exact) * 0x1p-23)) {
        Fail(absl::StrFormat("mean of tensor %d element %d is %.9g; exact %.17g, weight %d", t, i,
                             got, exact, weight));
      }
    }
  }
}

}  // namespace
}  // namespace huddle::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace huddle;
  const std::vector<wire::Frame> frames = fuzz::ParseFrames(std::span<const uint8_t>(data, size));
  StatusOr<wire::Message> msg = wire::Decode(frames, fuzz::FuzzLimits());
  if (!msg.ok()) {
    fuzz::CheckRejection(msg.status());
    return 0;
  }
  fuzz::CheckDecoded(*msg, frames);
  fuzz::CheckRoundTrip(*msg);
  if (msg->type() == wire::MessageType::kFitResult) fuzz::CheckUpdateAndFold(*msg);
  if (msg->type() == wire::MessageType::kSecAggData) fuzz::CheckStagePayload(*msg);
  return 0;
}
