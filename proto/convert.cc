// Conversions between the wire messages (messages.h) and their protobuf form (huddle.proto), with
// the checks of every field a peer sent (internal/convert.h).
#include "proto/internal/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace huddle::wire::internal {

Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", what));
}

Status CheckString(const std::string& s, size_t max, absl::string_view field) {
  if (s.size() > max) {
    return Malformed(absl::StrCat(field, " is ", s.size(), " bytes, limit ", max));
  }
  return absl::OkStatus();
}

namespace {

Status CheckNonce(const std::string& nonce, absl::string_view field) {
  if (nonce.size() != kNonceBytes) {
    return Malformed(absl::StrCat(field, " is ", nonce.size(), " bytes, expected ", kNonceBytes));
  }
  return absl::OkStatus();
}

Status CheckFinite(double x, absl::string_view field) {
  if (!std::isfinite(x)) return Malformed(absl::StrCat(field, " is not finite"));
  return absl::OkStatus();
}

void ToProto(const ModelSpec& m, pb::ModelSpec* p) {
  p->set_kind(m.kind);
  p->set_input_dim(m.input_dim);
  for (int64_t h : m.hidden) p->add_hidden(h);
  p->set_num_classes(m.num_classes);
  p->set_batch_norm(m.batch_norm);
  for (int64_t d : m.input_shape) p->add_input_shape(d);
  for (const Layer& l : m.layers) {
    pb::Layer* q = p->add_layers();
    q->set_kind(l.kind);
    q->set_out(l.out);
    q->set_kernel(l.kernel);
    q->set_stride(l.stride);
    q->set_padding(l.padding);
    q->set_groups(l.groups);
    q->set_rate(l.rate);
    q->set_scales(l.scales);
    q->set_angles(l.angles);
  }
  for (const TensorSpec& t : m.tensors) {
    pb::TensorSpec* q = p->add_tensors();
    q->set_name(t.name);
    q->set_dtype(pb::DTYPE_FLOAT32);
    for (int64_t d : t.shape) q->add_shape(d);
  }
}

void ToProto(const TrainConfig& t, pb::TrainConfig* p) {
  p->set_epochs(t.epochs);
  p->set_batch_size(t.batch_size);
  p->set_learning_rate(t.learning_rate);
  p->set_momentum(t.momentum);
  p->set_weight_decay(t.weight_decay);
  if (t.dp_sgd) {
    auto* d = p->mutable_dp_sgd();
    d->set_noise_multiplier(t.dp_sgd->noise_multiplier);
    d->set_clip_norm(t.dp_sgd->clip_norm);
    d->set_expected_batch_size(t.dp_sgd->expected_batch_size);
    d->set_delta(t.dp_sgd->delta);
  }
}

}  // namespace

pb::DType DTypeToProto(DType d) {
  switch (d) {
    case DType::kFloat32:
      return pb::DTYPE_FLOAT32;
    case DType::kUint32:
      return pb::DTYPE_UINT32;
    case DType::kUint64:
      return pb::DTYPE_UINT64;
    case DType::kUint8:
      return pb::DTYPE_UINT8;
  }
  return pb::DTYPE_UNSPECIFIED;
}

namespace {

struct BodyVisitor {
  pb::Header* h;
  void operator()(const Join& b) {
    auto* p = h->mutable_join();
    p->set_client_id(b.client_id);
    p->set_num_examples(b.num_examples);
    p->set_agent_version(b.agent_version);
    p->set_job(b.job);
    for (const std::string& d : b.datasets) p->add_datasets(d);
  }
  void operator()(const Welcome& b) {
    auto* p = h->mutable_welcome();
    p->set_job_name(b.job_name);
    ToProto(b.model, p->mutable_model());
    p->set_heartbeat_interval_ms(b.heartbeat_interval_ms);
  }
  void operator()(const FitInstruction& b) {
    auto* p = h->mutable_fit_instruction();
    p->set_model_version(b.model_version);
    ToProto(b.train, p->mutable_train());
    p->set_seed(b.seed);
    p->set_deadline_ms(b.deadline_ms);
    p->set_nonce(b.nonce);
    auto* priv = p->mutable_privacy();
    priv->set_mode(static_cast<pb::UpdatePrivacy::Mode>(b.privacy.mode));
    priv->set_clip_norm(b.privacy.clip_norm);
    priv->set_noise_multiplier(b.privacy.noise_multiplier);
    if (b.secure_aggregation) {
      const SecureAggregation& a = *b.secure_aggregation;
      auto* q = p->mutable_secure_aggregation();
      q->set_session(a.session);
      q->set_index(a.index);
      q->set_members(a.members);
      q->set_threshold(a.threshold);
      q->set_bits(a.bits);
      q->set_length(a.length);
      q->set_min_survivors(a.min_survivors);
      q->set_edge_threshold(a.edge_threshold);
      q->set_scale_exponent(a.scale_exponent);
      q->set_noise_variance(a.noise_variance);
      q->set_weight_cap(a.weight_cap);
      q->set_clip_norm(a.clip_norm);
    }
  }
  void operator()(const UploadRequest& b) {
    auto* p = h->mutable_upload_request();
    p->set_num_examples(b.num_examples);
    p->set_nonce(b.nonce);
  }
  void operator()(const UploadGrant&) { h->mutable_upload_grant(); }
  void operator()(const FitResult& b) {
    auto* p = h->mutable_fit_result();
    p->set_num_examples(b.num_examples);
    p->set_train_loss(b.train_loss);
    p->set_train_accuracy(b.train_accuracy);
    p->set_train_seconds(b.train_seconds);
    p->set_model_version(b.model_version);
    p->set_nonce(b.nonce);
    p->set_within_clip(b.within_clip);
  }
  void operator()(const Heartbeat&) { h->mutable_heartbeat(); }
  void operator()(const Error& b) {
    auto* p = h->mutable_error();
    p->set_code(static_cast<pb::Error::Code>(b.code));
    p->set_message(b.message);
  }
  void operator()(const Shutdown& b) { h->mutable_shutdown()->set_reason(b.reason); }
  void operator()(const JobOffer& b) {
    auto* p = h->mutable_job_offer();
    p->set_job(b.job);
    p->set_data(b.data);
  }
  void operator()(const EvaluateInstruction& b) {
    auto* p = h->mutable_evaluate_instruction();
    p->set_model_version(b.model_version);
    p->set_nonce(b.nonce);
    p->set_deadline_ms(b.deadline_ms);
  }
  void operator()(const EvaluateResult& b) {
    auto* p = h->mutable_evaluate_result();
    p->set_num_examples(b.num_examples);
    p->set_loss(b.loss);
    p->set_accuracy(b.accuracy);
    p->set_model_version(b.model_version);
    p->set_nonce(b.nonce);
  }
  void operator()(const SecAggMaskedInput& b) {
    auto* p = h->mutable_secagg_masked_input();
    p->set_nonce(b.nonce);
    p->set_model_version(b.model_version);
  }
  void operator()(const SecAggData& b) {
    auto* p = h->mutable_secagg_data();
    p->set_stage(b.stage);
    p->set_nonce(b.nonce);
  }
};

StatusOr<ModelSpec> FromProto(const pb::ModelSpec& p, const CodecLimits& limits) {
  HUDDLE_RETURN_IF_ERROR(CheckString(p.kind(), limits.max_string_bytes, "welcome.model.kind"));
  if (p.hidden_size() > 64) return Malformed("welcome.model.hidden has more than 64 layers");
  ModelSpec m;
  m.kind = p.kind();
  m.input_dim = p.input_dim();
  m.hidden.assign(p.hidden().begin(), p.hidden().end());
  m.num_classes = p.num_classes();
  m.batch_norm = p.batch_norm();
  if (p.input_shape_size() > 3) return Malformed("welcome.model.input_shape has more than 3 dims");
  if (p.layers_size() > 256) return Malformed("welcome.model.layers has more than 256 layers");
  m.input_shape.assign(p.input_shape().begin(), p.input_shape().end());
  for (const pb::Layer& q : p.layers()) {
    HUDDLE_RETURN_IF_ERROR(
        CheckString(q.kind(), limits.max_string_bytes, "welcome.model.layers.kind"));
    HUDDLE_RETURN_IF_ERROR(CheckFinite(q.rate(), "welcome.model.layers.rate"));
    m.layers.push_back({q.kind(), q.out(), q.kernel(), q.stride(), q.padding(), q.groups(),
                        q.rate(), q.scales(), q.angles()});
  }
  // An external model's tensors: the bounds of the message's own tensor specs (count, name
  // length, dtype, rank, dimensions and element count), so that a hostile spec is refused here.
  if (static_cast<size_t>(p.tensors_size()) > limits.max_tensors) {
    return Malformed(absl::StrCat("welcome.model.tensors lists ", p.tensors_size(),
                                  " tensors, limit ", limits.max_tensors));
  }
  m.tensors.reserve(static_cast<size_t>(p.tensors_size()));
  for (int i = 0; i < p.tensors_size(); ++i) {
    const pb::TensorSpec& q = p.tensors(i);
    const std::string what =
        absl::StrCat("welcome.model.tensors ", i, " ('", q.name().substr(0, 64), "')");
    HUDDLE_RETURN_IF_ERROR(CheckString(q.name(), limits.max_string_bytes, what + " name"));
    if (q.name().empty()) {
      return Malformed(absl::StrCat("welcome.model.tensors ", i, " has an empty name"));
    }
    if (q.dtype() != pb::DTYPE_FLOAT32) {
      return Malformed(
          absl::StrCat(what, " has dtype ", static_cast<int>(q.dtype()), ", expected float32 (1)"));
    }
    std::vector<int64_t> shape(q.shape().begin(), q.shape().end());
    Status shape_ok = ValidateShape(shape, limits.max_tensor_elements, what);
    if (!shape_ok.ok()) return Malformed(std::string(shape_ok.message()));
    m.tensors.push_back(TensorSpec{q.name(), DType::kFloat32, std::move(shape)});
  }
  return m;
}

StatusOr<TrainConfig> FromProto(const pb::TrainConfig& p) {
  HUDDLE_RETURN_IF_ERROR(CheckFinite(p.learning_rate(), "fit_instruction.train.learning_rate"));
  HUDDLE_RETURN_IF_ERROR(CheckFinite(p.momentum(), "fit_instruction.train.momentum"));
  HUDDLE_RETURN_IF_ERROR(CheckFinite(p.weight_decay(), "fit_instruction.train.weight_decay"));
  TrainConfig t;
  t.epochs = p.epochs();
  t.batch_size = p.batch_size();
  t.learning_rate = p.learning_rate();
  t.momentum = p.momentum();
  t.weight_decay = p.weight_decay();
  if (p.has_dp_sgd()) {
    const auto& d = p.dp_sgd();
    for (double v : {d.noise_multiplier(), d.clip_norm(), d.delta()}) {
      if (!std::isfinite(v) || v <= 0) {
        return Malformed("fit_instruction.train.dp_sgd has a non-positive or non-finite value");
      }
    }
    if (d.expected_batch_size() < 1 || d.delta() >= 1) {
      return Malformed("fit_instruction.train.dp_sgd: expected_batch_size < 1 or delta >= 1");
    }
    t.dp_sgd = DpSgdConfig{d.noise_multiplier(), d.clip_norm(), d.expected_batch_size(), d.delta()};
  }
  return t;
}

StatusOr<UpdatePrivacy> FromProto(const pb::UpdatePrivacy& p) {
  UpdatePrivacy u;
  switch (p.mode()) {
    case pb::UpdatePrivacy::MODE_NONE:
      return u;
    case pb::UpdatePrivacy::MODE_CENTRAL:
      u.mode = UpdatePrivacy::Mode::kCentral;
      break;
    case pb::UpdatePrivacy::MODE_LOCAL:
      u.mode = UpdatePrivacy::Mode::kLocal;
      break;
    case pb::UpdatePrivacy::MODE_DISTRIBUTED:
      u.mode = UpdatePrivacy::Mode::kDistributed;
      break;
    default:
      return Malformed(
          absl::StrCat("fit_instruction.privacy.mode ", static_cast<int>(p.mode()), " is unknown"));
  }
  if (!std::isfinite(p.clip_norm()) || p.clip_norm() <= 0) {
    return Malformed("fit_instruction.privacy.clip_norm must be finite and > 0");
  }
  if (u.mode == UpdatePrivacy::Mode::kLocal &&
      (!std::isfinite(p.noise_multiplier()) || p.noise_multiplier() <= 0)) {
    return Malformed("fit_instruction.privacy.noise_multiplier must be finite and > 0");
  }
  u.clip_norm = p.clip_norm();
  u.noise_multiplier = p.noise_multiplier();
  return u;
}

StatusOr<SecureAggregation> FromProto(const pb::SecureAggregation& p) {
  constexpr absl::string_view kField = "fit_instruction.secure_aggregation";
  if (p.session().size() != kSecAggSessionBytes) {
    return Malformed(absl::StrCat(kField, ".session is ", p.session().size(), " bytes, expected ",
                                  kSecAggSessionBytes));
  }
  if (p.bits() != 32 && p.bits() != 64) {
    return Malformed(absl::StrCat(kField, ".bits ", p.bits(), " is not 32 or 64"));
  }
  if (p.members() < 2 || p.index() >= p.members() || p.threshold() < 1 ||
      p.threshold() >= p.members() || p.min_survivors() < 1 || p.min_survivors() > p.members() ||
      p.edge_threshold() < 1 || p.edge_threshold() > (uint64_t{1} << 32)) {
    return Malformed(absl::StrCat(kField, ": index ", p.index(), ", members ", p.members(),
                                  ", threshold ", p.threshold(), ", min_survivors ",
                                  p.min_survivors(), ", edge_threshold ", p.edge_threshold(),
                                  " are inconsistent"));
  }
  if (p.length() < 1 || p.length() > (uint64_t{1} << 36) || p.scale_exponent() < -1100 ||
      p.scale_exponent() > 1100 || p.noise_variance() > (uint64_t{1} << 52) ||
      !std::isfinite(p.clip_norm()) || p.clip_norm() <= 0) {
    return Malformed(absl::StrCat(kField, ": length ", p.length(), ", scale exponent ",
                                  p.scale_exponent(), ", noise variance ", p.noise_variance(),
                                  " or clip norm ", p.clip_norm(), " out of range"));
  }
  SecureAggregation a;
  a.session = p.session();
  a.index = p.index();
  a.members = p.members();
  a.threshold = p.threshold();
  a.bits = p.bits();
  a.length = p.length();
  a.min_survivors = p.min_survivors();
  a.edge_threshold = p.edge_threshold();
  a.scale_exponent = p.scale_exponent();
  a.noise_variance = p.noise_variance();
  a.weight_cap = p.weight_cap();
  a.clip_norm = p.clip_norm();
  return a;
}

}  // namespace

StatusOr<Body> BodyFromProto(const pb::Header& h, const CodecLimits& limits) {
  switch (h.body_case()) {
    case pb::Header::kJoin: {
      const auto& p = h.join();
      HUDDLE_RETURN_IF_ERROR(CheckString(p.client_id(), limits.max_string_bytes, "join.client_id"));
      HUDDLE_RETURN_IF_ERROR(
          CheckString(p.agent_version(), limits.max_string_bytes, "join.agent_version"));
      HUDDLE_RETURN_IF_ERROR(CheckString(p.job(), limits.max_string_bytes, "join.job"));
      if (static_cast<size_t>(p.datasets_size()) > kMaxDatasetNames) {
        return Malformed(absl::StrCat("join.datasets has ", p.datasets_size(),
                                      " names, limit ", kMaxDatasetNames));
      }
      std::vector<std::string> datasets;
      for (const std::string& d : p.datasets()) {
        HUDDLE_RETURN_IF_ERROR(CheckString(d, limits.max_string_bytes, "join.datasets"));
        datasets.push_back(d);
      }
      return Body(Join{p.client_id(), p.num_examples(), p.agent_version(), p.job(),
                       std::move(datasets)});
    }
    case pb::Header::kWelcome: {
      const auto& p = h.welcome();
      HUDDLE_RETURN_IF_ERROR(
          CheckString(p.job_name(), limits.max_string_bytes, "welcome.job_name"));
      HUDDLE_ASSIGN_OR_RETURN(ModelSpec model, FromProto(p.model(), limits));
      return Body(Welcome{p.job_name(), std::move(model), p.heartbeat_interval_ms()});
    }
    case pb::Header::kFitInstruction: {
      const auto& p = h.fit_instruction();
      HUDDLE_ASSIGN_OR_RETURN(TrainConfig train, FromProto(p.train()));
      HUDDLE_RETURN_IF_ERROR(CheckNonce(p.nonce(), "fit_instruction.nonce"));
      HUDDLE_ASSIGN_OR_RETURN(UpdatePrivacy privacy, FromProto(p.privacy()));
      FitInstruction fit{p.model_version(), train,   p.seed(),    p.deadline_ms(),
                         p.nonce(),         privacy, std::nullopt};
      if (p.has_secure_aggregation()) {
        HUDDLE_ASSIGN_OR_RETURN(fit.secure_aggregation, FromProto(p.secure_aggregation()));
      }
      if (privacy.mode == UpdatePrivacy::Mode::kDistributed &&
          (!fit.secure_aggregation || fit.secure_aggregation->noise_variance == 0)) {
        return Malformed(
            "fit_instruction.privacy.mode distributed without a secure_aggregation noise_variance");
      }
      return Body(std::move(fit));
    }
    case pb::Header::kUploadRequest: {
      const auto& p = h.upload_request();
      HUDDLE_RETURN_IF_ERROR(CheckNonce(p.nonce(), "upload_request.nonce"));
      return Body(UploadRequest{p.num_examples(), p.nonce()});
    }
    case pb::Header::kUploadGrant:
      return Body(UploadGrant{});
    case pb::Header::kFitResult: {
      const auto& p = h.fit_result();
      HUDDLE_RETURN_IF_ERROR(CheckFinite(p.train_loss(), "fit_result.train_loss"));
      HUDDLE_RETURN_IF_ERROR(CheckFinite(p.train_accuracy(), "fit_result.train_accuracy"));
      HUDDLE_RETURN_IF_ERROR(CheckFinite(p.train_seconds(), "fit_result.train_seconds"));
      HUDDLE_RETURN_IF_ERROR(CheckNonce(p.nonce(), "fit_result.nonce"));
      return Body(FitResult{p.num_examples(), p.train_loss(), p.train_accuracy(), p.train_seconds(),
                            p.model_version(), p.nonce(), p.within_clip()});
    }
    case pb::Header::kHeartbeat:
      return Body(Heartbeat{});
    case pb::Header::kError: {
      const auto& p = h.error();
      HUDDLE_RETURN_IF_ERROR(CheckString(p.message(), limits.max_text_bytes, "error.message"));
      const int code = static_cast<int>(p.code());
      if (code < 0 || code > static_cast<int>(ErrorCode::kAuthRefused)) {
        return Malformed(absl::StrCat("error.code ", code, " is unknown"));
      }
      return Body(Error{static_cast<ErrorCode>(code), p.message()});
    }
    case pb::Header::kJobOffer: {
      const auto& p = h.job_offer();
      HUDDLE_RETURN_IF_ERROR(CheckString(p.job(), limits.max_string_bytes, "job_offer.job"));
      HUDDLE_RETURN_IF_ERROR(CheckString(p.data(), limits.max_string_bytes, "job_offer.data"));
      return Body(JobOffer{p.job(), p.data()});
    }
    case pb::Header::kShutdown:
      HUDDLE_RETURN_IF_ERROR(
          CheckString(h.shutdown().reason(), limits.max_text_bytes, "shutdown.reason"));
      return Body(Shutdown{h.shutdown().reason()});
    case pb::Header::kEvaluateInstruction: {
      const auto& p = h.evaluate_instruction();
      HUDDLE_RETURN_IF_ERROR(CheckNonce(p.nonce(), "evaluate_instruction.nonce"));
      return Body(EvaluateInstruction{p.model_version(), p.nonce(), p.deadline_ms()});
    }
    case pb::Header::kEvaluateResult: {
      const auto& p = h.evaluate_result();
      HUDDLE_RETURN_IF_ERROR(CheckFinite(p.loss(), "evaluate_result.loss"));
      HUDDLE_RETURN_IF_ERROR(CheckFinite(p.accuracy(), "evaluate_result.accuracy"));
      HUDDLE_RETURN_IF_ERROR(CheckNonce(p.nonce(), "evaluate_result.nonce"));
      return Body(
          EvaluateResult{p.num_examples(), p.loss(), p.accuracy(), p.model_version(), p.nonce()});
    }
    case pb::Header::kSecaggMaskedInput: {
      const auto& p = h.secagg_masked_input();
      HUDDLE_RETURN_IF_ERROR(CheckNonce(p.nonce(), "secagg_masked_input.nonce"));
      return Body(SecAggMaskedInput{p.nonce(), p.model_version()});
    }
    case pb::Header::kSecaggData: {
      const auto& p = h.secagg_data();
      if (p.stage() < 1 || p.stage() > 12) {
        return Malformed(absl::StrCat("secagg_data.stage ", p.stage(), " is not 1-12"));
      }
      if (!p.nonce().empty()) HUDDLE_RETURN_IF_ERROR(CheckNonce(p.nonce(), "secagg_data.nonce"));
      return Body(SecAggData{p.stage(), p.nonce()});
    }
    case pb::Header::BODY_NOT_SET:
      break;
  }
  return Malformed("header has no message body");
}

DType DTypeFromProto(pb::DType d) {
  return d == pb::DTYPE_UINT32   ? DType::kUint32
         : d == pb::DTYPE_UINT64 ? DType::kUint64
         : d == pb::DTYPE_UINT8  ? DType::kUint8
                                 : DType::kFloat32;
}

void BodyToProto(const Body& body, pb::Header* h) { std::visit(BodyVisitor{h}, body); }

}  // namespace huddle::wire::internal
