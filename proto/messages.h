// Huddle's wire messages as plain C++ types. proto/codec.h maps them to and from the wire; the
// generated protobuf types never leave codec.cc.
//
// A Message is a header (type-specific body plus routing fields) and zero or more tensor payloads.
// Payloads share ownership of their bytes, so the coordinator can send one global model to a
// thousand clients, and fold a received update straight out of the ZeroMQ frame, without copies.
//
// Thread-safety: plain values. Payload bytes are immutable once shared.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/tensor.h"

namespace huddle::wire {

// Bumped on any incompatible change; peers with a different version are refused with an Error.
inline constexpr uint32_t kProtocolVersion = 5;

// Size of the per-round, per-client nonce the coordinator puts in each FitInstruction (and
// EvaluateInstruction) and expects back in the UploadRequest and FitResult (EvaluateResult) that
// answer it (binds a result to one instruction).
inline constexpr size_t kNonceBytes = 16;

// One tensor frame: its spec and its bytes (little-endian float32, row-major), kept alive by
// `owner`. `bytes` is always 4-byte aligned (the codec copies a misaligned frame).
struct TensorPayload {
  TensorSpec spec;
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;

  std::span<const float> floats() const {
    return {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)};
  }
  // An owning copy of `t`.
  static TensorPayload CopyOf(const Tensor& t);
  // A view of tensor `index` of `list` that keeps the whole list alive.
  static TensorPayload ShareOf(std::shared_ptr<const TensorList> list, size_t index);
};

// Payloads for every tensor of `list`, sharing it.
std::vector<TensorPayload> ShareAll(std::shared_ptr<const TensorList> list);
// Copies payloads into owned tensors (e.g. to keep a received model).
TensorList ToTensors(const std::vector<TensorPayload>& payloads);

// kind "mlp": input_dim, hidden, num_classes, batch_norm; kind "layers": input_shape, layers;
// kind "external": tensors (names and shapes only: a model Huddle's layers cannot describe).
struct Layer {
  std::string kind;
  int64_t out = 0, kernel = 0, stride = 0, padding = 0, groups = 0;
  double rate = 0;
  int64_t scales = 0, angles = 0;
  bool operator==(const Layer&) const = default;
};

struct ModelSpec {
  std::string kind = "mlp";
  int64_t input_dim = 0;
  std::vector<int64_t> hidden;
  int64_t num_classes = 0;
  bool batch_norm = false;
  std::vector<int64_t> input_shape;
  std::vector<Layer> layers;
  std::vector<TensorSpec> tensors;  // kind "external"
  bool operator==(const ModelSpec&) const = default;
};

// Example-level DP-SGD inside the client (models/dp_sgd.h): Poisson batches of expected size
// expected_batch_size, per-example clipping to clip_norm, noise std noise_multiplier * clip_norm
// per step; the client logs its own (epsilon, delta) at `delta`.
struct DpSgdConfig {
  double noise_multiplier = 1.0;
  double clip_norm = 1.0;
  int64_t expected_batch_size = 256;
  double delta = 1e-5;
};

// Defaults: the recipe measured best for the Fashion-MNIST MLP (85% within 8-9 FedAvg rounds).
struct TrainConfig {
  int64_t epochs = 1;
  int64_t batch_size = 32;
  double learning_rate = 0.02;
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::optional<DpSgdConfig> dp_sgd;  // absent: plain SGD
};

// Client-level DP: what the client does to its update before sending it.
struct UpdatePrivacy {
  // kDistributed: clip, then add the secure aggregation session's noise share (noise_variance)
  // to the quantized update; only with secure_aggregation.
  enum class Mode { kNone = 0, kCentral = 1, kLocal = 2, kDistributed = 3 };
  Mode mode = Mode::kNone;
  double clip_norm = 0;         // every mode: clip the update to this L2 norm
  double noise_multiplier = 0;  // local: add noise of std noise_multiplier * clip_norm
};

enum class ErrorCode {
  kUnspecified = 0,
  kVersionMismatch = 1,
  kMalformed = 2,
  kUnknownClient = 3,
  kWrongRound = 4,
  kInvalidUpdate = 5,
  kRejected = 6,
  kInternal = 7,
  kAuthRefused = 8,  // the client's key or identity is refused (revoked key, impersonation); fatal
};
const char* ErrorCodeName(ErrorCode code);

// Client -> coordinator: first message of a session (and again after losing the coordinator).
// With a service (`huddle serve`), an agent holds one session with the service itself (`job`
// empty, its data sets named in `datasets`) and one per job it takes part in (`job` set: the
// JobOffer's job; the example count is the offered data set's).
inline constexpr size_t kMaxDatasetNames = 64;
struct Join {
  std::string client_id;
  uint64_t num_examples = 0;
  std::string agent_version;
  std::string job;
  std::vector<std::string> datasets;  // at most kMaxDatasetNames
};
// Coordinator -> client: admitted; here is the job's model.
struct Welcome {
  std::string job_name;
  ModelSpec model;
  uint32_t heartbeat_interval_ms = 0;
};
// Secure aggregation of a round (aggregation/secagg/protocol.h; the codec checks sizes and ranges,
// aggregation/secagg/wire.h converts to the protocol's types).
inline constexpr size_t kSecAggSessionBytes = 32;
struct SecureAggregation {
  std::string session;  // kSecAggSessionBytes
  uint32_t index = 0;
  uint32_t members = 0;
  uint32_t threshold = 0;
  uint32_t bits = 32;
  uint64_t length = 0;
  uint32_t min_survivors = 0;
  uint64_t edge_threshold = 0;  // the graph's edge probability in 2^-32 units, in [1, 2^32]
  int32_t scale_exponent = 0;
  uint64_t noise_variance = 0;
  uint64_t weight_cap = 0;  // 0: uniform weights, no weight word
  double clip_norm = 0;
  bool operator==(const SecureAggregation&) const = default;
};

// Coordinator -> client: train from the global model in the tensor payloads.
struct FitInstruction {
  uint64_t model_version = 0;
  TrainConfig train;
  uint64_t seed = 0;
  uint32_t deadline_ms = 0;
  std::string nonce;  // kNonceBytes random bytes, echoed by the UploadRequest and FitResult
  UpdatePrivacy privacy;
  std::optional<SecureAggregation>
      secure_aggregation;  // set: the SecAgg messages replace FitResult
};
// Client -> coordinator: trained; may I upload?
struct UploadRequest {
  uint64_t num_examples = 0;
  std::string nonce;  // the FitInstruction's
};
// Coordinator -> client: upload now.
struct UploadGrant {};
// Client -> coordinator: the update (delta = local - global) in the tensor payloads.
struct FitResult {
  uint64_t num_examples = 0;
  double train_loss = 0;
  double train_accuracy = 0;
  double train_seconds = 0;
  uint64_t model_version = 0;
  std::string nonce;         // the FitInstruction's
  bool within_clip = false;  // the update's norm before clipping was <= the clip norm
};
// Coordinator -> client: evaluate the global model in the tensor payloads on local data
// (federated evaluation, between rounds; the message's round is the round whose model it is).
struct EvaluateInstruction {
  uint64_t model_version = 0;
  std::string nonce;  // kNonceBytes random bytes, echoed by the EvaluateResult
  uint32_t deadline_ms = 0;
};
// Client -> coordinator: the evaluation's example count and mean loss and accuracy (no tensors).
struct EvaluateResult {
  uint64_t num_examples = 0;
  double loss = 0;      // finite (the codec checks); >= 0 (the coordinator checks)
  double accuracy = 0;  // finite (the codec checks); in [0, 1] (the coordinator checks)
  uint64_t model_version = 0;
  std::string nonce;  // the EvaluateInstruction's
};
// Secure aggregation's stages (docs/protocol.md): every stage's message but the masked input is a
// SecAggData whose one tensor payload, a uint8 frame named "secagg", holds the stage's message in
// aggregation/secagg/wire.h's binary encoding. A member's messages echo the FitInstruction's nonce.
struct SecAggData {
  uint32_t stage = 0;  // aggregation/secagg/wire.h's Stage, 1-12 (the codec checks the range)
  std::string nonce;   // from a member: kNonceBytes; from the coordinator: empty
  bool operator==(const SecAggData&) const = default;
};
// The masked words travel as tensor payloads of dtype uint32 or uint64.
struct SecAggMaskedInput {
  std::string nonce;
  uint64_t model_version = 0;
  bool operator==(const SecAggMaskedInput&) const = default;
};

struct Heartbeat {};
struct Error {
  ErrorCode code = ErrorCode::kUnspecified;
  std::string message;
};
struct Shutdown {
  std::string reason;
};
// Service -> agent, on the agent's own session: join `job` (on a new connection), training on the
// data set the agent declared as `data`.
struct JobOffer {
  std::string job;
  std::string data;
};

using Body = std::variant<Join, Welcome, FitInstruction, UploadRequest, UploadGrant, FitResult,
                          Heartbeat, Error, Shutdown, EvaluateInstruction, EvaluateResult,
                          SecAggMaskedInput, SecAggData, JobOffer>;

// The order of Body's alternatives.
enum class MessageType {
  kJoin,
  kWelcome,
  kFitInstruction,
  kUploadRequest,
  kUploadGrant,
  kFitResult,
  kHeartbeat,
  kError,
  kShutdown,
  kEvaluateInstruction,
  kEvaluateResult,
  kSecAggMaskedInput,
  kSecAggData,
  kJobOffer,
};
const char* MessageTypeName(MessageType type);

struct Message {
  uint32_t protocol_version = kProtocolVersion;
  uint64_t round = 0;
  std::string sender;
  Body body;
  std::vector<TensorPayload> tensors;

  MessageType type() const { return static_cast<MessageType>(body.index()); }
  // Total bytes of the tensor payloads.
  size_t PayloadBytes() const;
};

// Client ids: 1-128 characters of [A-Za-z0-9._-] (safe in file names, logs and metrics).
bool IsValidClientId(const std::string& id);

// Convenience constructors.
Message MakeMessage(Body body, uint64_t round = 0, std::string sender = {});
// An Error's text is cut to kMaxErrorTextBytes (at a UTF-8 character boundary, "..." appended):
// a trainer's exception or a traceback can be longer than the codec accepts (max_text_bytes).
inline constexpr size_t kMaxErrorTextBytes = 1024;
Message MakeError(ErrorCode code, std::string text, uint64_t round = 0);

}  // namespace huddle::wire
