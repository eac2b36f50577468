#include "client/agent.h"

#include <spdlog/spdlog.h>

#include <cmath>

#include "common/rng.h"
#include "models/dp_sgd.h"
#include "models/update.h"
#include "models/wire_spec.h"

namespace huddle::client {

constexpr const char* kAgentVersion = "huddle-0.1";

ClientAgent::ClientAgent(std::string client_id, const data::DatasetView* data,
                         bool routine_logs_at_info)
    : client_id_(std::move(client_id)),
      data_(data),
      routine_level_(routine_logs_at_info ? spdlog::level::info : spdlog::level::debug) {}

wire::Message ClientAgent::MakeJoin() const {
  wire::Join join;
  join.client_id = client_id_;
  // A client with a privacy policy tells the coordinator nothing about its data.
  join.num_examples = guard_.reports_nothing() ? 0 : static_cast<uint64_t>(data_->size());
  join.agent_version = kAgentVersion;
  return wire::MakeMessage(std::move(join), 0, client_id_);
}

StatusOr<std::vector<wire::Message>> ClientAgent::Handle(const wire::Message& msg) {
  using Replies = std::vector<wire::Message>;
  switch (msg.type()) {
    case wire::MessageType::kWelcome: {
      const auto& w = std::get<wire::Welcome>(msg.body);
      HUDDLE_ASSIGN_OR_RETURN(models::ModelSpec spec, models::ModelSpecFromWire(w.model));
      if (spec.input_dim() != data_->base->feature_dim) {
        return absl::FailedPreconditionError(
            absl::StrCat("job '", w.job_name, "' expects ", spec.input_dim(),
                         " input features; this client's data has ", data_->base->feature_dim));
      }
      model_ = spec;
      job_name_ = w.job_name;
      spdlog::log(routine_level_, "joined job '{}' ({} local examples)", w.job_name, data_->size());
      return Replies{};
    }
    case wire::MessageType::kFitInstruction:
      return OnFit(msg, std::get<wire::FitInstruction>(msg.body));
    case wire::MessageType::kUploadGrant:
      return OnGrant(msg);
    case wire::MessageType::kHeartbeat:
      return Replies{};
    case wire::MessageType::kError:
      return OnError(msg, std::get<wire::Error>(msg.body));
    case wire::MessageType::kShutdown:
      spdlog::log(routine_level_, "coordinator shut the job down: {}",
                  std::get<wire::Shutdown>(msg.body).reason);
      done_ = true;
      return Replies{};
    default:
      spdlog::warn("ignoring unexpected {} from the coordinator",
                   wire::MessageTypeName(msg.type()));
      return Replies{};
  }
}

StatusOr<std::vector<wire::Message>> ClientAgent::OnFit(const wire::Message& msg,
                                                        const wire::FitInstruction& fit) {
  using Replies = std::vector<wire::Message>;
  if (!model_) {
    spdlog::warn("round {}: fit instruction before welcome; rejoining", msg.round);
    return Replies{MakeJoin()};
  }
  TensorList global = wire::ToTensors(msg.tensors);
  Status params_ok = models::CheckParams(*model_, global);
  if (!params_ok.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", msg.round,
                     ": global model does not match the job's model: ", params_ok.message()));
  }
  // The client's own policy decides before anything is trained (client/privacy_guard.h).
  RoundRequest request;
  request.job = job_name_;
  request.round = msg.round;
  request.fit = &fit;
  request.global = &global;
  request.local_examples = data_->size();
  StatusOr<Admission> admission = guard_.Admit(request);
  if (!admission.ok()) {
    spdlog::warn("round {}: {}", msg.round, admission.status().message());
    return Replies{wire::MakeError(wire::ErrorCode::kRejected,
                                   std::string(admission.status().message()), msg.round)};
  }
  const bool local = fit.privacy.mode == wire::UpdatePrivacy::Mode::kLocal;
  const bool dp_sgd = fit.train.dp_sgd.has_value();
  Pending pending;
  pending.round = msg.round;
  pending.result.num_examples = static_cast<uint64_t>(data_->size());  // the FedAvg weight
  pending.result.model_version = fit.model_version;
  pending.result.nonce = fit.nonce;
  if (admission->again) {
    // Asked again for a release already made (the coordinator restarted, or this client rejoined
    // mid-round): the same tensors, so that no second noised version of the update exists.
    spdlog::log(routine_level_, "round {}: sending again the update released for it before",
                msg.round);
    pending.delta = std::move(admission->again);
  } else {
    spdlog::log(routine_level_, "round {}: training on {} examples", msg.round, data_->size());
    const uint64_t seed = DeriveSeed(fit.seed, StableHash(client_id_));
    StatusOr<models::Update> update = TrainAndPrivatize(fit, admission->clip_norm, seed, global);
    if (!update.ok()) {
      // Bad training settings or local data, or a diverged run: tell the coordinator at once (it
      // counts the client as failed and the round need not wait for it) and stay available for
      // the next round.
      spdlog::error("round {}: local training failed: {}", msg.round, update.status().message());
      return Replies{wire::MakeError(
          wire::ErrorCode::kInternal,
          absl::StrCat("local training failed: ", update.status().message()), msg.round)};
    }
    const models::TrainStats& stats = update->train;
    pending.result.train_loss = stats.loss;
    pending.result.train_accuracy = stats.accuracy;
    pending.result.train_seconds = stats.seconds;
    // The clip bit is what adaptive clipping noises centrally; under local DP nothing noises it.
    pending.result.within_clip = !local && !update->clipped;
    std::optional<privacy::DpEvent> dp_event;
    if (update->dp_sgd) dp_event = update->dp_sgd->event();
    pending.delta = std::make_shared<const TensorList>(std::move(update->delta));
    // Durable before the update can leave (a failure here is fatal: the spend could not be kept).
    HUDDLE_RETURN_IF_ERROR(
        guard_.Record(request, *admission, pending.delta, dp_event, noise().Describe()));
    spdlog::log(routine_level_,
                "round {}: trained {} example passes, loss {:.4f}, accuracy {:.4f}, {:.2f}s",
                msg.round, stats.examples, stats.loss, stats.accuracy, stats.seconds);
    LogSpend(msg.round, local, dp_sgd);
    ++rounds_trained_;
  }
  if (local || dp_sgd || guard_.reports_nothing()) {
    // What the DP release does not cover is not sent: no example count (weights become uniform),
    // no loss, accuracy or timing, all computed from the data without noise.
    pending.result.num_examples = 1;
    pending.result.train_loss = 0;
    pending.result.train_accuracy = 0;
    pending.result.train_seconds = 0;
  }
  pending_ = std::move(pending);
  return Replies{
      wire::MakeMessage(wire::UploadRequest{pending_->result.num_examples, pending_->result.nonce},
                        msg.round, client_id_)};
}

privacy::NoiseSource& ClientAgent::noise() {
  if (!noise_) noise_.emplace(privacy::NoiseSource::Secure());
  return *noise_;
}

StatusOr<models::Update> ClientAgent::TrainAndPrivatize(const wire::FitInstruction& fit,
                                                        double clip_norm, uint64_t seed,
                                                        const TensorList& global) {
  const wire::TrainConfig& config = fit.train;
  const wire::UpdatePrivacy& dp_update = fit.privacy;
  models::UpdateOptions options;
  options.train = models::TrainOptionsFromWire(config);
  options.train.backend = backend_;
  options.seed = seed;
  if (dp_update.mode != wire::UpdatePrivacy::Mode::kNone) options.clip_norm = clip_norm;
  if (config.dp_sgd) {
    options.dp_sgd.emplace();
    options.dp_sgd->noise_multiplier = config.dp_sgd->noise_multiplier;
    options.dp_sgd->clip_norm = config.dp_sgd->clip_norm;
    options.dp_sgd->expected_batch_size = config.dp_sgd->expected_batch_size;
    options.noise = &noise();
  }
  // Training, delta and clipping where the model lives (models/update.h), or in the silo.
  HUDDLE_ASSIGN_OR_RETURN(models::Update update,
                          silo_ != nullptr ? silo_->TrainUpdate(*model_, options, *data_, global)
                                           : models::TrainUpdate(*model_, options, *data_, global));
  if (dp_update.mode == wire::UpdatePrivacy::Mode::kLocal) {
    // Local DP: the exact discrete Gaussian, added on the host whatever the device.
    HUDDLE_ASSIGN_OR_RETURN(const privacy::NoiseGrid grid,
                            privacy::NoiseGridFor(dp_update.noise_multiplier, clip_norm,
                                                  TotalElements(models::Layout(*model_))));
    for (Tensor& t : update.delta) {
      HUDDLE_RETURN_IF_ERROR(privacy::AddDiscreteGaussianNoise(t.data, grid, noise()));
    }
  }
  return update;
}

void ClientAgent::LogSpend(uint64_t round, bool local, bool dp_sgd) {
  const char* seeded = noise().is_private() ? "" : " [seeded noise: NOT PRIVATE]";
  if (local) {
    auto spent = guard_.LocalSpent();
    if (spent.ok()) {
      spdlog::log(routine_level_,
                  "round {}: local DP release accounted; this client's data: epsilon {:.4f} at "
                  "delta {:g} so far ({}){}",
                  round, spent->epsilon, spent->delta, privacy::AccountantName(spent->accountant),
                  seeded);
    }
  }
  if (dp_sgd) {
    auto spent = guard_.DpSgdSpent();
    if (spent.ok()) {
      spdlog::log(
          routine_level_,
          "round {}: DP-SGD accounted; this client's examples: epsilon {:.4f} at delta {:g} "
          "so far ({}){}",
          round, spent->epsilon, spent->delta, privacy::AccountantName(spent->accountant), seeded);
    }
  }
}

std::vector<wire::Message> ClientAgent::OnGrant(const wire::Message& msg) {
  if (!pending_ || pending_->round != msg.round) {
    spdlog::warn("round {}: upload grant but no update is pending for that round", msg.round);
    return {};
  }
  wire::Message result = wire::MakeMessage(pending_->result, msg.round, client_id_);
  result.tensors = wire::ShareAll(pending_->delta);
  pending_.reset();
  std::vector<wire::Message> out;
  out.push_back(std::move(result));
  return out;
}

StatusOr<std::vector<wire::Message>> ClientAgent::OnError(const wire::Message& msg,
                                                          const wire::Error& err) {
  using Replies = std::vector<wire::Message>;
  switch (err.code) {
    case wire::ErrorCode::kVersionMismatch:
      return absl::FailedPreconditionError(
          absl::StrCat("coordinator refused this agent: ", err.message));
    case wire::ErrorCode::kAuthRefused:
      return absl::PermissionDeniedError(
          absl::StrCat("coordinator refused this client's identity: ", err.message));
    case wire::ErrorCode::kUnknownClient:
      spdlog::info("coordinator does not know this client ({}); joining again", err.message);
      return Replies{MakeJoin()};
    default:
      spdlog::warn("round {}: coordinator error {}: {}", msg.round, wire::ErrorCodeName(err.code),
                   err.message);
      return Replies{};
  }
}

}  // namespace huddle::client
