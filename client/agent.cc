#include "client/agent.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <thread>

#include "aggregation/secagg/wire.h"
#include "common/clock.h"
#include "common/rng.h"
#include "models/dp_sgd.h"
#include "models/update.h"
#include "models/wire_spec.h"

namespace huddle::client {

constexpr const char* kAgentVersion = "huddle-0.1";

ClientAgent::ClientAgent(std::string client_id, Trainer* trainer, bool routine_logs_at_info)
    : client_id_(std::move(client_id)),
      trainer_(trainer),
      routine_level_(routine_logs_at_info ? spdlog::level::info : spdlog::level::debug) {}

ClientAgent::ClientAgent(std::string client_id, const data::DatasetView* data,
                         bool routine_logs_at_info)
    : ClientAgent(std::move(client_id), static_cast<Trainer*>(nullptr), routine_logs_at_info) {
  builtin_ = std::make_unique<BuiltinTrainer>(data);
  trainer_ = builtin_.get();
}

wire::Message ClientAgent::MakeJoin() const {
  wire::Join join;
  join.client_id = client_id_;
  // A client with a privacy policy tells the coordinator nothing about its data.
  join.num_examples =
      guard_.reports_nothing() ? 0 : static_cast<uint64_t>(std::max<int64_t>(0, num_examples()));
  join.agent_version = kAgentVersion;
  join.job = job_;
  return wire::MakeMessage(std::move(join), 0, client_id_);
}

StatusOr<std::vector<wire::Message>> ClientAgent::Handle(const wire::Message& msg) {
  using Replies = std::vector<wire::Message>;
  switch (msg.type()) {
    case wire::MessageType::kWelcome: {
      const auto& w = std::get<wire::Welcome>(msg.body);
      HUDDLE_ASSIGN_OR_RETURN(models::ModelSpec spec, models::ModelSpecFromWire(w.model));
      if (builtin_) HUDDLE_RETURN_IF_ERROR(builtin_->SetModel(spec, w.job_name));
      JobInfo job;
      job.name = w.job_name;
      job.model_kind = w.model.kind;
      for (const TensorSpec& t : models::Layout(spec)) job.tensors.push_back({t.name, t.shape});
      try {
        trainer_->Start(job);
      } catch (const std::exception& e) {
        return absl::FailedPreconditionError(
            absl::StrCat("job '", w.job_name, "': the trainer refused it: ", e.what()));
      } catch (...) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job '", w.job_name, "': the trainer refused it (a non-standard exception)"));
      }
      model_ = std::move(spec);
      job_name_ = w.job_name;
      spdlog::log(routine_level_, "joined job '{}' ({} local examples)", w.job_name,
                  num_examples());
      return Replies{};
    }
    case wire::MessageType::kFitInstruction:
      return OnFit(msg, std::get<wire::FitInstruction>(msg.body));
    case wire::MessageType::kUploadGrant:
      return OnGrant(msg);
    case wire::MessageType::kEvaluateInstruction:
      return OnEvaluate(msg, std::get<wire::EvaluateInstruction>(msg.body));
    case wire::MessageType::kSecAggData:
      return OnSecAgg(msg);
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
  const int64_t received_ms = SteadyClock::Get()->NowMs();
  TensorList global = wire::ToTensors(msg.tensors);
  Status params_ok = models::CheckParams(*model_, global);
  if (!params_ok.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", msg.round,
                     ": global model does not match the job's model: ", params_ok.message()));
  }
  // The client's own policy decides before anything is trained (client/privacy_guard.h).
  const int64_t n = num_examples();
  RoundRequest request;
  request.job = job_name_;
  request.round = msg.round;
  request.fit = &fit;
  request.global = &global;
  request.model_values = TotalElements(LayoutOf(global));
  request.local_examples = n;
  if (fit.secure_aggregation) {
    // This client's own view of the planned session, before anything is trained: its identity,
    // how many sessions it already joined this round (at most one masked input), and what the
    // session would guarantee.
    Status refused = absl::OkStatus();
    if (pending_ && pending_->round == msg.round && pending_->masked_input_sent) {
      refused = absl::FailedPreconditionError(
          absl::StrCat("this client already sent its masked input for round ", msg.round));
    } else if (!secagg_identity_) {
      refused = absl::FailedPreconditionError(
          "this client has no identity for secure aggregation: it needs its certified signing "
          "key (its key file, `huddle certify`) and the project's public key "
          "(security.project_public_key)");
    } else if (sessions_round_ == msg.round && sessions_joined_ >= max_sessions_per_round_) {
      refused = absl::FailedPreconditionError(
          absl::StrCat("this client already joined ", sessions_joined_,
                       " secure-aggregation sessions for round ", msg.round, ", its most"));
    } else {
      request.honest_shares =
          SecAggMember::PlannedHonestShares(*fit.secure_aggregation, secagg_identity_->policy);
      if (!request.honest_shares.ok()) refused = request.honest_shares.status();
    }
    if (!refused.ok()) {
      spdlog::warn("round {}: secure aggregation refused: {}", msg.round, refused.message());
      return Replies{wire::MakeError(
          wire::ErrorCode::kRejected,
          absl::StrCat("secure aggregation refused: ", refused.message()), msg.round)};
    }
    if (sessions_round_ != msg.round) {
      sessions_round_ = msg.round;
      sessions_joined_ = 0;
    }
    ++sessions_joined_;
  }
  StatusOr<Admission> admission = guard_.Admit(request);
  if (!admission.ok()) {
    spdlog::warn("round {}: {}", msg.round, admission.status().message());
    return Replies{wire::MakeError(wire::ErrorCode::kRejected,
                                   std::string(admission.status().message()), msg.round)};
  }
  const bool local = fit.privacy.mode == wire::UpdatePrivacy::Mode::kLocal;
  // Distributed DP: the noise is this client's share, added after quantization (SecAggMember).
  const bool distributed = fit.privacy.mode == wire::UpdatePrivacy::Mode::kDistributed;
  const bool dp_sgd = fit.train.dp_sgd.has_value();
  Pending pending;
  pending.round = msg.round;
  pending.result.model_version = fit.model_version;
  pending.result.nonce = fit.nonce;
  // A new secure-aggregation session for a round whose session ended before this client's
  // masked input left (the coordinator started it again without a member that did not reveal):
  // the update trained for it is masked in the new session (with fresh noise under distributed
  // DP: the old share never left).
  const bool resumed = fit.secure_aggregation && pending_ && pending_->round == msg.round &&
                       pending_->result.model_version == fit.model_version &&
                       !pending_->masked_input_sent;
  if (resumed) {
    pending.result.num_examples = pending_->result.num_examples;
    pending.delta = pending_->delta;
  } else if (admission->again) {
    // Asked again for a release already made (the coordinator restarted, or this client rejoined
    // mid-round): the same tensors, so that no second noised version of the update exists.
    spdlog::log(routine_level_, "round {}: sending again the update released for it before",
                msg.round);
    pending.result.num_examples = static_cast<uint64_t>(std::max<int64_t>(1, n));
    pending.delta = std::move(admission->again);
  } else {
    spdlog::log(routine_level_, "round {}: training on {} examples", msg.round, n);
    StatusOr<models::Update> update = TrainAndPrivatize(msg, fit, admission->clip_norm, n, global);
    if (!update.ok()) {
      // Bad training settings or local data, a diverged run, or a result that fails its checks:
      // tell the coordinator at once (it counts the client as failed and the round need not wait
      // for it) and stay available for the next round.
      spdlog::error("round {}: local training failed: {}", msg.round, update.status().message());
      return Replies{wire::MakeError(
          wire::ErrorCode::kInternal,
          absl::StrCat("local training failed: ", update.status().message()), msg.round)};
    }
    const models::TrainStats& stats = update->train;
    if (slowdown_ > 1) {
      // A slower device's training: the rest of its time, waited out before it answers.
      const int64_t extra_ms = std::llround((slowdown_ - 1) * stats.seconds * 1000);
      if (extra_ms > 0) sleep_(extra_ms);
    }
    pending.result.num_examples = static_cast<uint64_t>(stats.examples);  // the FedAvg weight
    pending.result.train_loss = stats.loss;
    pending.result.train_accuracy = stats.accuracy;
    pending.result.train_seconds = stats.seconds * slowdown_;
    // The clip bit is what adaptive clipping noises centrally; under local or distributed DP
    // nothing noises it.
    pending.result.within_clip = !local && !distributed && !update->clipped;
    std::optional<privacy::DpEvent> dp_event;
    if (update->dp_sgd) dp_event = update->dp_sgd->event();
    pending.delta = std::make_shared<const TensorList>(std::move(update->delta));
    // Durable before the update can leave (a failure here is fatal: the spend could not be kept).
    HUDDLE_RETURN_IF_ERROR(
        guard_.Record(request, *admission, pending.delta, dp_event, noise().Describe()));
    spdlog::log(routine_level_,
                "round {}: trained on {} examples, loss {:.4f}, accuracy {:.4f}, {:.2f}s",
                msg.round, stats.examples, stats.loss, stats.accuracy, stats.seconds);
    LogSpend(msg.round, local, dp_sgd);  // distributed: when its share leaves (OnGrant)
    ++rounds_trained_;
  }
  if (local || distributed || dp_sgd || guard_.reports_nothing()) {
    // What the DP release does not cover is not sent: no example count (weights become uniform),
    // no loss, accuracy or timing, all computed from the data without noise.
    pending.result.num_examples = 1;
    pending.result.train_loss = 0;
    pending.result.train_accuracy = 0;
    pending.result.train_seconds = 0;
  }
  secagg_.reset();
  if (fit.secure_aggregation) {
    // The update is quantized and masked; the coordinator will see only the cohort's sum.
    StatusOr<SecAggMember> member = SecAggMember::Create(
        *fit.secure_aggregation, fit.nonce, *pending.delta,
        static_cast<int64_t>(pending.result.num_examples), noise(), *secagg_identity_);
    if (!member.ok()) {
      spdlog::error("round {}: {}", msg.round, member.status().message());
      return Replies{wire::MakeError(wire::ErrorCode::kInternal,
                                     std::string(member.status().message()), msg.round)};
    }
    secagg_.emplace(*std::move(member));
    if (distributed) {
      pending.fit = fit;
      pending.model_values = request.model_values;
      pending.release = ReleaseId(request);
    }
    pending_ = std::move(pending);
    HoldReply(msg.round, received_ms, fit);
    return Replies{secagg_->Advertise(msg.round, client_id_)};
  }
  pending_ = std::move(pending);
  HoldReply(msg.round, received_ms, fit);
  return Replies{
      wire::MakeMessage(wire::UploadRequest{pending_->result.num_examples, pending_->result.nonce},
                        msg.round, client_id_)};
}

void ClientAgent::set_slowdown(double factor, std::function<void(int64_t ms)> sleep) {
  slowdown_ = std::isfinite(factor) ? std::max(1.0, factor) : 1.0;
  sleep_ = std::move(sleep);
  if (!sleep_) {
    sleep_ = [](int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  }
}

void ClientAgent::set_secagg_identity(SecAggIdentity identity) {
  if (identity.policy.cache == nullptr) {
    if (!own_cache_) own_cache_ = std::make_unique<aggregation::secagg::SignatureCache>();
    identity.policy.cache = own_cache_.get();
  }
  secagg_identity_ = std::move(identity);
}

std::vector<wire::Message> ClientAgent::LeaveSecAgg(uint64_t round, const Status& why) {
  spdlog::warn("round {}: secure aggregation: {}", round, why.message());
  secagg_.reset();
  pending_.reset();
  std::vector<wire::Message> out;
  out.push_back(wire::MakeError(absl::IsFailedPrecondition(why) || absl::IsPermissionDenied(why)
                                    ? wire::ErrorCode::kRejected
                                    : wire::ErrorCode::kInvalidUpdate,
                                std::string(why.message()), round));
  return out;
}

std::vector<wire::Message> ClientAgent::OnSecAgg(const wire::Message& msg) {
  if (!secagg_ || !pending_ || pending_->round != msg.round) {
    spdlog::warn("round {}: {} but this client is not aggregating securely in that round",
                 msg.round, wire::MessageTypeName(msg.type()));
    return {};
  }
  const auto stage = std::get<wire::SecAggData>(msg.body).stage;
  StatusOr<std::vector<wire::Message>> replies = secagg_->OnMessage(msg, client_id_);
  if (!replies.ok()) return LeaveSecAgg(msg.round, replies.status());
  if (stage == static_cast<uint32_t>(aggregation::secagg::Stage::kMemberList) && pending_->fit) {
    // Distributed DP: the session's release by this client's own count, now that the member list
    // fixes it; refused before this client reveals anything.
    RoundRequest request;
    request.job = job_name_;
    request.round = msg.round;
    request.fit = &*pending_->fit;
    request.model_values = pending_->model_values;
    request.honest_shares = secagg_->guarantee()->honest_shares;
    StatusOr<privacy::LedgerEntry> entry = guard_.Distributed(request, pending_->release);
    if (!entry.ok()) return LeaveSecAgg(msg.round, entry.status());
    pending_->distributed = *std::move(entry);
  }
  if (stage == static_cast<uint32_t>(aggregation::secagg::Stage::kMask)) {
    replies->push_back(wire::MakeMessage(
        wire::UploadRequest{pending_->result.num_examples, pending_->result.nonce}, msg.round,
        client_id_));
  }
  if (secagg_->done()) {
    secagg_.reset();  // done: every secret of this round is gone with it
    pending_.reset();
  }
  return *std::move(replies);
}

void ClientAgent::HoldReply(uint64_t round, int64_t received_ms, const wire::FitInstruction& fit) {
  const ClientPrivacyPolicy& p = guard_.policy();
  if (!reply_hold_ms_) {
    reply_hold_ms_ = p.reply_after_ms           ? *p.reply_after_ms
                     : p.local || p.distributed ? static_cast<int64_t>(fit.deadline_ms) / 2
                                                : 0;
    if (*reply_hold_ms_ > 0) {
      spdlog::log(routine_level_,
                  "this job's replies are held {:.1f} s after each instruction (the reply time "
                  "does not show the data's size)",
                  static_cast<double>(*reply_hold_ms_) / 1000);
    }
  }
  const int64_t left = received_ms + *reply_hold_ms_ - SteadyClock::Get()->NowMs();
  if (left > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(left));
  } else if (*reply_hold_ms_ > 0) {
    spdlog::warn(
        "round {}: training took {:.1f} s, past the reply time {:.1f} s: this reply's "
        "time shows it took longer",
        round, static_cast<double>(*reply_hold_ms_ - left) / 1000,
        static_cast<double>(*reply_hold_ms_) / 1000);
  }
}

privacy::NoiseSource& ClientAgent::noise() {
  if (!noise_) noise_.emplace(privacy::NoiseSource::Secure());
  return *noise_;
}

int64_t ClientAgent::num_examples() const {
  try {
    return trainer_->num_examples();
  } catch (const std::exception& e) {
    spdlog::warn("the trainer's num_examples failed: {}", e.what());
  } catch (...) {
    spdlog::warn("the trainer's num_examples failed (a non-standard exception)");
  }
  return 0;
}

void ClientAgent::LogSpend(uint64_t round, bool local, bool dp_sgd) {
  const char* seeded = noise().is_private() ? "" : " [seeded noise: NOT PRIVATE]";
  if (local) {
    auto spent = guard_.LocalSpent();
    if (spent.ok()) {
      spdlog::log(
          routine_level_,
          "round {}: client-level DP release accounted; this client's data: epsilon {:.4f} at "
          "delta {:g} so far ({}){}",
          round, spent->epsilon, spent->delta, privacy::AccountantName(spent->accountant), seeded);
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
  if (secagg_) {
    if (!secagg_->masked()) {
      spdlog::warn("round {}: upload grant before the secure aggregation's mask request",
                   msg.round);
      return {};
    }
    if (pending_->fit && !pending_->distributed_recorded) {
      // Distributed DP: this client's noise share is in its ledger before it leaves.
      if (!pending_->distributed) {
        return LeaveSecAgg(msg.round, absl::InternalError("no checked release to record"));
      }
      Status recorded = guard_.RecordDistributed(*pending_->distributed, noise().Describe());
      if (!recorded.ok()) {
        spdlog::error(
            "round {}: the privacy ledger could not record this round's noise share, "
            "so the masked input is not sent: {}",
            msg.round, recorded.message());
        return LeaveSecAgg(msg.round, recorded);
      }
      pending_->distributed_recorded = true;
      LogSpend(msg.round, true, false);
    }
    // The masked input; the member stays for the unmasking (pending_ with it).
    pending_->masked_input_sent = true;
    std::vector<wire::Message> out;
    out.push_back(secagg_->MaskedInput(msg.round, pending_->result.model_version, client_id_,
                                       models::Layout(*model_)));
    return out;
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
