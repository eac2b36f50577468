// Test vocabulary shared by the codec and transport tests: sample messages of every type with every
// field set to a non-default value (secure aggregation's: one SecAggData per stage, carrying the
// samples of tests/wire/secagg_samples.h), tensor payloads with recognisable values, and a
// canonical text form of a message so that two messages compare with a readable diff.
//
// The SecAggData samples call aggregation/secagg/wire.cc: a test that uses them links
// huddle_aggregation; Describe and the other samples need only huddle_wire.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "proto/messages.h"
#include "tests/wire/secagg_samples.h"

namespace huddle::wire::testutil {

// An owned payload named `name` of `shape` holding base, base + 1, base + 2, ...
inline TensorPayload Payload(std::string name, std::vector<int64_t> shape, float base = 0) {
  Tensor t(std::move(name), std::move(shape));
  std::iota(t.data.begin(), t.data.end(), base);
  return TensorPayload::CopyOf(t);
}

// Two tensors, as a global model or an update carries them.
inline std::vector<TensorPayload> SmallModel() {
  std::vector<TensorPayload> out;
  out.push_back(Payload("fc0.weight", {4, 3}, 0.5f));
  out.push_back(Payload("fc0.bias", {4}, -2.0f));
  return out;
}

// A fixed 16-byte nonce with every byte value class (zero, high bit) represented.
inline const std::string& SampleNonce() {
  static const std::string nonce("\x00\x01\x7f\x80\xff nonce-bytes!", kNonceBytes);
  return nonce;
}

inline Message SampleJoin() {
  return MakeMessage(Join{"client-17", 1234, "huddle-0.1", "job-a", {"fmnist", "clinic.csv"}}, 0,
                     "client-17");
}
inline Message SampleJobOffer() {
  return MakeMessage(JobOffer{"job-a", "fmnist"}, 0, "service");
}
inline Message SampleWelcome() {
  return MakeMessage(
      Welcome{"mnist-fedavg", ModelSpec{"mlp", 784, {128, 64}, 10, /*batch_norm=*/true}, 1500}, 3,
      "coordinator");
}
inline Message SampleFitInstruction() {
  Message m = MakeMessage(
      FitInstruction{12, TrainConfig{3, 64, 0.125, 0.9, 1e-4, DpSgdConfig{1.1, 0.5, 128, 1e-6}},
                     0xdeadbeefcafef00dull, 30000, SampleNonce(),
                     UpdatePrivacy{UpdatePrivacy::Mode::kLocal, 0.75, 1.25}},
      12, "coordinator");
  m.tensors = SmallModel();
  return m;
}
inline Message SampleUploadRequest() {
  return MakeMessage(UploadRequest{600, SampleNonce()}, 12, "client-17");
}
inline Message SampleUploadGrant() { return MakeMessage(UploadGrant{}, 12, "coordinator"); }
inline Message SampleFitResult() {
  Message m = MakeMessage(
      FitResult{600, 0.6931471805599453, 0.875, 1.25, 12, SampleNonce(), /*within_clip=*/true}, 12,
      "client-17");
  m.tensors = SmallModel();
  return m;
}
inline Message SampleHeartbeat() { return MakeMessage(Heartbeat{}, 12, "client-17"); }
inline Message SampleError() {
  return MakeError(ErrorCode::kWrongRound, "round 11 is over; the coordinator is in round 12", 12);
}
inline Message SampleShutdown() {
  return MakeMessage(Shutdown{"job finished after 40 rounds"}, 40, "coordinator");
}
inline Message SampleEvaluateInstruction() {
  Message m = MakeMessage(EvaluateInstruction{12, SampleNonce(), 25000}, 12, "coordinator");
  m.tensors = SmallModel();
  return m;
}
inline Message SampleEvaluateResult() {
  return MakeMessage(EvaluateResult{480, 0.3125, 0.9375, 12, SampleNonce()}, 12, "client-17");
}
// A Welcome of an external model: tensors only.
inline Message SampleExternalWelcome() {
  ModelSpec model;
  model.kind = "external";
  model.tensors = {TensorSpec{"conv1.weight", DType::kFloat32, {8, 1, 3, 3}},
                   TensorSpec{"conv1.bias", DType::kFloat32, {8}},
                   TensorSpec{"head/kernel:0", DType::kFloat32, {10, 8}},
                   TensorSpec{"temperature", DType::kFloat32, {}}};
  return MakeMessage(Welcome{"torch-job", std::move(model), 1000}, 0, "coordinator");
}

// Secure aggregation's session (proto/messages.h), every field set.
inline SecureAggregation SampleSecureAggregation() {
  return SecureAggregation{.session = std::string(kSecAggSessionBytes, '\x5a'),
                           .index = 3,
                           .members = 10,
                           .threshold = 4,
                           .bits = 32,
                           .length = 101771,
                           .min_survivors = 6,
                           .edge_threshold = 3006477107,  // 0.7 of 2^32
                           .scale_exponent = -7,
                           .noise_variance = 123456789,
                           .weight_cap = 4096,
                           .clip_norm = 2.5};
}
// Under distributed DP: the session's noise_variance is the client's share.
inline Message SampleSecureFitInstruction() {
  Message m = SampleFitInstruction();
  auto& fit = std::get<FitInstruction>(m.body);
  fit.secure_aggregation = SampleSecureAggregation();
  fit.privacy = UpdatePrivacy{UpdatePrivacy::Mode::kDistributed, 2.5, 0};
  return m;
}
inline Message SampleSecAggMaskedInput() {
  Message m = MakeMessage(SecAggMaskedInput{SampleNonce(), 12}, 12, "client-17");
  for (auto [name, n] : {std::pair<const char*, int64_t>{"fc0.weight", 12}, {"fc0.bias", 4}}) {
    auto words = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(n));
    std::iota(words->begin(), words->end(), 0xfffffff0u);
    TensorPayload p;
    p.spec = TensorSpec{name, DType::kUint32, {n}};
    p.bytes = std::as_bytes(std::span<const uint32_t>(*words));
    p.owner = std::move(words);
    m.tensors.push_back(std::move(p));
  }
  return m;
}
// The SecAggData of `m` (a stage message of tests/wire/secagg_samples.h) in round 12: a member's
// carries its FitInstruction's nonce, the coordinator's none.
template <class T>
Message SampleSecAggData(const T& m) {
  const bool member = secagg::FromMember(static_cast<uint32_t>(secagg::StageOf<T>()));
  return secagg::ToMessage(m, 12, member ? "client-17" : "coordinator",
                           member ? SampleNonce() : std::string());
}
// One SecAggData of every stage, in stage order (1-12).
inline std::vector<Message> SampleSecAggStages() {
  return {SampleSecAggData(SampleAdvertisement()), SampleSecAggData(SampleMemberList()),
          SampleSecAggData(SampleReveal()),        SampleSecAggData(SampleSeedList()),
          SampleSecAggData(SampleShareKeys()),     SampleSecAggData(SampleShareList()),
          SampleSecAggData(SampleVerdict()),       SampleSecAggData(SampleMaskRequest()),
          SampleSecAggData(SampleSurvivors()),     SampleSecAggData(SampleConsistency()),
          SampleSecAggData(SampleUnmaskRequest()), SampleSecAggData(SampleUnmaskResponse())};
}

// One message of every type, in Body's order.
inline std::vector<Message> SampleMessages() {
  std::vector<Message> out = {SampleJoin(),
                              SampleWelcome(),
                              SampleSecureFitInstruction(),
                              SampleUploadRequest(),
                              SampleUploadGrant(),
                              SampleFitResult(),
                              SampleHeartbeat(),
                              SampleError(),
                              SampleShutdown(),
                              SampleEvaluateInstruction(),
                              SampleEvaluateResult(),
                              SampleSecAggMaskedInput()};
  for (Message& m : SampleSecAggStages()) out.push_back(std::move(m));
  out.push_back(SampleJobOffer());
  return out;
}

inline std::string Hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

// Every header field of `m` (doubles in shortest round-trip form) and each tensor's spec, on one
// line. Payload values are compared separately (ExpectSamePayloads).
inline std::string Describe(const Message& m) {
  struct BodyText {
    std::string operator()(const Join& b) const {
      return fmt::format("Join{{client_id={} num_examples={} agent_version={} job={} datasets=[{}]}}",
                         b.client_id, b.num_examples, b.agent_version, b.job,
                         fmt::join(b.datasets, ","));
    }
    std::string operator()(const JobOffer& b) const {
      return fmt::format("JobOffer{{job={} data={}}}", b.job, b.data);
    }
    std::string operator()(const Welcome& b) const {
      std::string tensors;
      for (const TensorSpec& t : b.model.tensors) {
        tensors += fmt::format(" {}:{}:{}", t.name, DTypeName(t.dtype), ShapeString(t.shape));
      }
      return fmt::format(
          "Welcome{{job_name={} model={{kind={} input_dim={} hidden=[{}] num_classes={} "
          "batch_norm={} tensors=[{} ]}} "
          "heartbeat_interval_ms={}}}",
          b.job_name, b.model.kind, b.model.input_dim, fmt::join(b.model.hidden, ","),
          b.model.num_classes, b.model.batch_norm, tensors, b.heartbeat_interval_ms);
    }
    std::string operator()(const FitInstruction& b) const {
      const std::string dp =
          b.train.dp_sgd ? fmt::format("{{z={} C={} batch={} delta={}}}",
                                       b.train.dp_sgd->noise_multiplier, b.train.dp_sgd->clip_norm,
                                       b.train.dp_sgd->expected_batch_size, b.train.dp_sgd->delta)
                         : "none";
      std::string secure = "none";
      if (b.secure_aggregation) {
        const SecureAggregation& a = *b.secure_aggregation;
        secure = fmt::format(
            "{{session={} index={} members={} threshold={} bits={} length={} min_survivors={} "
            "edge_threshold={} scale_exponent={} noise_variance={} weight_cap={} clip_norm={}}}",
            Hex(a.session), a.index, a.members, a.threshold, a.bits, a.length, a.min_survivors,
            a.edge_threshold, a.scale_exponent, a.noise_variance, a.weight_cap, a.clip_norm);
      }
      return fmt::format(
          "FitInstruction{{model_version={} train={{epochs={} batch_size={} learning_rate={} "
          "momentum={} weight_decay={} dp_sgd={}}} seed={} deadline_ms={} nonce={} "
          "privacy={{mode={} clip_norm={} noise_multiplier={}}} secure_aggregation={}}}",
          b.model_version, b.train.epochs, b.train.batch_size, b.train.learning_rate,
          b.train.momentum, b.train.weight_decay, dp, b.seed, b.deadline_ms, Hex(b.nonce),
          static_cast<int>(b.privacy.mode), b.privacy.clip_norm, b.privacy.noise_multiplier,
          secure);
    }
    std::string operator()(const UploadRequest& b) const {
      return fmt::format("UploadRequest{{num_examples={} nonce={}}}", b.num_examples, Hex(b.nonce));
    }
    std::string operator()(const UploadGrant&) const { return "UploadGrant{}"; }
    std::string operator()(const FitResult& b) const {
      return fmt::format(
          "FitResult{{num_examples={} train_loss={} train_accuracy={} train_seconds={} "
          "model_version={} nonce={} within_clip={}}}",
          b.num_examples, b.train_loss, b.train_accuracy, b.train_seconds, b.model_version,
          Hex(b.nonce), b.within_clip);
    }
    std::string operator()(const Heartbeat&) const { return "Heartbeat{}"; }
    std::string operator()(const Error& b) const {
      return fmt::format("Error{{code={} message={}}}", ErrorCodeName(b.code), b.message);
    }
    std::string operator()(const Shutdown& b) const {
      return fmt::format("Shutdown{{reason={}}}", b.reason);
    }
    std::string operator()(const EvaluateInstruction& b) const {
      return fmt::format("EvaluateInstruction{{model_version={} nonce={} deadline_ms={}}}",
                         b.model_version, Hex(b.nonce), b.deadline_ms);
    }
    std::string operator()(const EvaluateResult& b) const {
      return fmt::format(
          "EvaluateResult{{num_examples={} loss={} accuracy={} model_version={} nonce={}}}",
          b.num_examples, b.loss, b.accuracy, b.model_version, Hex(b.nonce));
    }
    std::string operator()(const SecAggMaskedInput& b) const {
      return fmt::format("SecAggMaskedInput{{nonce={} model_version={}}}", Hex(b.nonce),
                         b.model_version);
    }
    // The stage's bytes are the payload's: ExpectSamePayloads compares them.
    std::string operator()(const SecAggData& b) const {
      return fmt::format("SecAggData{{stage={} nonce={}}}", b.stage, Hex(b.nonce));
    }
  };
  std::string out = fmt::format("v{} round={} sender={} {} tensors=[", m.protocol_version, m.round,
                                m.sender, std::visit(BodyText{}, m.body));
  for (const TensorPayload& t : m.tensors) {
    out += fmt::format(" {}:{}:{}:{}B", t.spec.name, DTypeName(t.spec.dtype),
                       ShapeString(t.spec.shape), t.bytes.size());
  }
  return out + " ]";
}

// Same count, and bitwise-equal bytes for each payload.
inline void ExpectSamePayloads(const std::vector<TensorPayload>& got,
                               const std::vector<TensorPayload>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].bytes.size(), want[i].bytes.size()) << "tensor " << i;
    EXPECT_TRUE(std::equal(got[i].bytes.begin(), got[i].bytes.end(), want[i].bytes.begin()))
        << "tensor " << i << " ('" << got[i].spec.name << "') bytes differ";
  }
}

// Passes iff `got` is an error with `code` whose message contains `needle`.
inline ::testing::AssertionResult IsError(const Status& got, absl::StatusCode code,
                                          const std::string& needle) {
  if (got.ok()) {
    return ::testing::AssertionFailure() << "got OK; expected " << absl::StatusCodeToString(code)
                                         << " containing \"" << needle << "\"";
  }
  const std::string text(got.message());
  if (got.code() != code || text.find(needle) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "got " << got.ToString() << "; expected " << absl::StatusCodeToString(code)
           << " containing \"" << needle << "\"";
  }
  return ::testing::AssertionSuccess();
}
template <typename T>
::testing::AssertionResult IsError(const StatusOr<T>& got, absl::StatusCode code,
                                   const std::string& needle) {
  return IsError(got.status(), code, needle);
}

}  // namespace huddle::wire::testutil
