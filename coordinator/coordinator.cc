#include "coordinator/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/secure_random.h"
#include "common/tensor_io.h"
#include "coordinator/checkpoint.h"
#include "coordinator/update_check.h"
#include "models/wire_spec.h"
#include "privacy/clip.h"
#include "privacy/report.h"
#include "privacy/sampling.h"

namespace huddle::coordinator {
namespace {

using transport::PeerName;

constexpr uint64_t kInitStream = 0x696e6974;    // "init"
constexpr uint64_t kCohortStream = 0x636f686f;  // "coho"
constexpr uint64_t kClientStream = 0x636c6e74;  // "clnt"
constexpr int kMaxFitsPerRound = 2;
// Upload allowance beyond the model's tensor bytes: the FitResult header and framing.
constexpr size_t kResultOverheadBytes = size_t{64} << 10;

std::string Path(const std::string& dir, const char* file) {
  return (std::filesystem::path(dir) / file).string();
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, transport::ServerTransport* transport,
                         const Clock* clock, Evaluator evaluator, RoundCallback on_round)
    : options_(std::move(options)),
      transport_(transport),
      clock_(clock),
      evaluator_(std::move(evaluator)),
      on_round_(std::move(on_round)),
      rng_(DeriveSeed(options_.seed, kCohortStream)),
      optimizer_(options_.server) {}

Status Coordinator::Initialise() {
  HUDDLE_RETURN_IF_ERROR(ValidateOptions(options_));
  HUDDLE_RETURN_IF_ERROR(models::ValidateModelSpec(options_.model));
  if (options_.initial_model) {
    Status st = models::CheckParams(options_.model, *options_.initial_model);
    if (st.ok()) st = CheckFinite(*options_.initial_model, "the initial model's");
    if (!st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("initial model: ", st.message()));
    }
  } else if (options_.model.external()) {
    return absl::InvalidArgumentError(
        "the model is external (only its tensors are known): Huddle cannot initialise it; give "
        "its initial values (CoordinatorOptions::initial_model: model.file in the job)");
  }
  if (!options_.out_dir.empty()) HUDDLE_RETURN_IF_ERROR(MakeDirs(options_.out_dir));
  HUDDLE_RETURN_IF_ERROR(CheckOutputDir(options_));
  const std::string ckpt_path = Path(options_.out_dir, kCheckpointFile);
  HUDDLE_ASSIGN_OR_RETURN(std::optional<Checkpoint> restored, ReadResumeCheckpoint(options_));
  double checkpoint_clip_norm = 0;
  if (restored) {
    Checkpoint& ckpt = *restored;
    model_ = std::move(ckpt.model);
    model_version_ = ckpt.model_version;
    next_round_ = ckpt.completed_round + 1;
    if (!rng_.set_state(ckpt.rng_state)) {
      return absl::DataLossError(absl::StrCat(ckpt_path, ": corrupt sampling RNG state"));
    }
    HUDDLE_RETURN_IF_ERROR(optimizer_.RestoreState(std::move(ckpt.optimizer_state)));
    elapsed_before_s_ = ckpt.elapsed_s;
    checkpoint_clip_norm = ckpt.clip_norm;
    bytes_in_base_ = ckpt.bytes_in;
    bytes_out_base_ = ckpt.bytes_out;
    summary_.ResumeFrom(ckpt);
    // Drop metrics lines of rounds after the checkpoint (written just before a crash).
    for (const char* file : {kMetricsFile, privacy::kOperatorMetricsFile}) {
      HUDDLE_RETURN_IF_ERROR(
          KeepJsonLinesUpTo(Path(options_.out_dir, file), "round", ckpt.completed_round));
    }
    spdlog::info("resuming job '{}' after round {} from {}", options_.job_name,
                 ckpt.completed_round, ckpt_path);
  } else {
    model_ = options_.initial_model
                 ? *options_.initial_model
                 : models::InitModel(options_.model, DeriveSeed(options_.seed, kInitStream));
    if (!options_.out_dir.empty()) {
      // A fresh start (CheckOutputDir allowed it): nothing of an earlier job may mix with this one.
      std::error_code ec;
      for (const char* file : {kMetricsFile, privacy::kOperatorMetricsFile, kCheckpointFile,
                               "summary.json", "model.bin"}) {
        std::filesystem::remove(Path(options_.out_dir, file), ec);
      }
    }
  }
  layout_ = LayoutOf(model_);
  aggregation::AggregatorOptions agg_options = options_.aggregation;
  if (options_.max_update_norm > 0) {
    // Every folded delta has L2 norm <= the bound, so each value has |x| <= it (with a margin for
    // the float rounding of the norm): the norm, not a separate |value| limit, bounds the sum.
    agg_options.max_abs_value = options_.max_update_norm * (1 + 1e-6);
  }
  HUDDLE_ASSIGN_OR_RETURN(auto agg, aggregation::StreamingAggregator::Create(layout_, agg_options));
  aggregator_.emplace(std::move(agg));
  HUDDLE_ASSIGN_OR_RETURN(auto privacy,
                          RoundPrivacy::Open(&options_, checkpoint_clip_norm, next_round_ - 1));
  privacy_.emplace(std::move(privacy));
  if (!privacy_->private_noise()) summary_.private_noise = false;
  NoteSpend();
  return absl::OkStatus();
}

void Coordinator::NoteSpend() {
  if (!privacy_->spent()) return;
  summary_.epsilon = privacy_->spent()->epsilon;
  summary_.delta = privacy_->spent()->delta;
}

Status Coordinator::Run(const std::atomic<bool>* stop) {
  HUDDLE_RETURN_IF_ERROR(Initialise());
  started_ms_ = clock_->NowMs();
  const uint64_t first = next_round_;
  for (uint64_t r = first; r <= static_cast<uint64_t>(options_.rounds); ++r) {
    if (stop != nullptr && stop->load()) {
      return absl::CancelledError(absl::StrCat("stopped before round ", r));
    }
    HUDDLE_ASSIGN_OR_RETURN(const std::optional<std::string> over, privacy_->StopBefore(r));
    if (over) {
      spdlog::warn("{}", *over);
      summary_.stop_reason = *over;
      break;
    }
    HUDDLE_RETURN_IF_ERROR(WaitForClients(stop, /*started=*/r > first));
    HUDDLE_RETURN_IF_ERROR(RunRound(r));
    if (rounds_without_update_ >= options_.max_rounds_without_update) {
      summary_.failure = absl::StrCat(
          rounds_without_update_, " rounds in a row accepted no update (",
          absl::StrJoin(no_update_reasons_, "; "),
          "); stopping: see the warnings above (aggregation.max_update_norm clips updates instead "
          "of refusing them; coordinator.max_rounds_without_update sets this limit)");
      break;
    }
  }
  if (summary_.failure.empty() && model_version_ == 0 && summary_.rounds_completed > 0) {
    summary_.failure = "no round of the job accepted an update: the model is the initial one";
  }
  if (summary_.failure.empty() && dp() && rounds_this_run_ > 0 && results_this_run_ == 0) {
    // Decided after every round was released, so the stopping time reveals nothing; the verdict
    // itself (no client contributed at all) is for the operator.
    summary_.failure = absl::StrCat("no client's update was accepted in any of the ",
                                    rounds_this_run_, " rounds: the released models are noise");
  }
  // The released model's evaluation, when the job stopped early (a budget stop) after the last
  // evaluation: post-processing of a released model, so under DP it spends nothing.
  if (evaluator_ && options_.eval_every > 0 && evaluated_version_ != model_version_ &&
      summary_.rounds_completed > 0 && summary_.failure.empty()) {
    RoundMetrics final_eval;
    HUDDLE_RETURN_IF_ERROR(Evaluate(summary_.rounds_completed, &final_eval));
    spdlog::info("final model: test accuracy {:.4f}, loss {:.4f}", *final_eval.test_accuracy,
                 *final_eval.test_loss);
  }
  HUDDLE_RETURN_IF_ERROR(Finish());
  if (!summary_.failure.empty()) return absl::AbortedError(summary_.failure);
  return absl::OkStatus();
}

Status Coordinator::WaitForClients(const std::atomic<bool>* stop, bool started) {
  // The job starts with min_clients; later rounds go on as long as enough clients are live for
  // the round to reach its quorum, and otherwise wait for clients to come back.
  const int64_t needed =
      started ? std::max<int64_t>(1, dp() ? 1 : std::min(options_.quorum, options_.min_clients))
              : options_.min_clients;
  const int64_t give_up = clock_->NowMs() + options_.wait_for_clients_ms;
  bool announced = false;
  while (population_.LiveCount() < needed) {
    if (stop != nullptr && stop->load()) return absl::CancelledError("stopped");
    if (!announced) {
      spdlog::info("waiting for clients: {} of {} {}", population_.LiveCount(), needed,
                   started ? "needed to go on are live" : "joined");
      announced = true;
    }
    if (clock_->NowMs() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "only ", population_.LiveCount(), " of the ", needed, " required clients ",
          started ? "were live" : "joined", " within ", options_.wait_for_clients_ms / 1000,
          " s (coordinator.min_clients, round.quorum, coordinator.wait_for_clients_s)"));
    }
    Pump(100);
    ExpireSilentClients();
  }
  if (announced) spdlog::info("{} clients live", population_.LiveCount());
  if (started && population_.LiveCount() < options_.min_clients) {
    spdlog::warn("{} live clients, fewer than coordinator.min_clients {}; going on",
                 population_.LiveCount(), options_.min_clients);
  }
  return absl::OkStatus();
}

// One round, step by step:
//   1. Sample the cohort from the live enrolled clients (fixed-size or Poisson; under DP from the
//      OS CSPRNG, so that no participant can predict it; otherwise from the job seed).
//   2. Send each member a FitInstruction with the global model (one shared copy, zero-copy).
//   3. Pump messages until every member has reported or failed, or the deadline passes:
//      UploadRequest -> queue for a slot; at most upload_slots uploads are in flight;
//      FitResult     -> validate against the round spec and fold into the aggregator;
//      a member that goes silent (client_timeout_ms) fails and frees its slot.
//   4. Close: with >= quorum results, mean delta (weighted by examples) -> server optimizer;
//      otherwise the model is unchanged. Stragglers' later messages are refused as stale.
//   5. Evaluate (when due), checkpoint, append metrics, report progress.
Status Coordinator::RunRound(uint64_t number) {
  const int64_t start_ms = clock_->NowMs();
  const uint64_t in0 = transport_->bytes_in();
  const uint64_t out0 = transport_->bytes_out();
  round_ = Round{};  // (not emplace(): clang 14 rejects it for a nested struct with initializers)
  Round& round = *round_;
  round.number = number;
  round.deadline_ms = start_ms + options_.round_deadline_ms;
  round.global = std::make_shared<const TensorList>(model_);
  round.metrics.round = number;
  round.metrics.total_rounds = static_cast<uint64_t>(options_.rounds);
  round.metrics.clients_enrolled = population_.LiveCount();
  round.metrics.stale = std::exchange(pending_stale_, 0);
  round.metrics.malformed = std::exchange(pending_malformed_, 0);
  round.metrics.auth_rejected = std::exchange(pending_auth_rejected_, 0);
  if (dp()) {
    HUDDLE_RETURN_IF_ERROR(privacy_->Configure(number, &round.privacy, &*aggregator_));
  } else {
    aggregator_->Reset();
  }
  // Clients' training seeds. Under secret sampling they are fresh random numbers: a value derived
  // from the job seed (an invertible mix) would let any client recover the seed and predict every
  // cohort.
  round.client_seed = secret_sampling() ? privacy_->sampler()->NextU64()
                                        : DeriveSeed(options_.seed, kClientStream, number);

  // 1-2.
  const std::vector<std::string> cohort = SampleCohort();
  for (const std::string& id : cohort) round.members.emplace(id, MemberState::kTraining);
  round.metrics.clients_sampled = static_cast<int64_t>(round.members.size());
  round.weight_cap = WeightCap();
  bool train = true;
  if (options_.secure_aggregation.enabled) {
    HUDDLE_ASSIGN_OR_RETURN(round.secure, StartSecureRound(round, cohort));
    train = round.secure != nullptr;
  }
  for (const std::string& id : cohort) {
    if (train) {
      SendFit(id);
    } else {
      round.members[id] = MemberState::kFailed;
    }
  }

  // 3. One scheduler step per iteration (with secure aggregation, its stages: secure_round.h).
  int64_t wait_ms = 0;
  while (StepRound(round, &wait_ms)) {
    Pump(std::min<int64_t>(100, wait_ms));
    ExpireSilentClients();
    RevokeStaleGrants();
  }
  if (round.secure) {
    round.metrics.secure_aggregation = round.secure->metrics();
    if (round.secure->sum()) {
      round.metrics.results = round.secure->survivors();
      round.metrics.examples = round.secure->examples();
    }
  }

  // 4-5.
  round.metrics.duration_s = (clock_->NowMs() - start_ms) / 1000.0;
  round.metrics.bytes_in = transport_->bytes_in() - in0;
  round.metrics.bytes_out = transport_->bytes_out() - out0;
  // Transport counters since the previous round closed (so refusals between rounds count too).
  round.metrics.auth_rejected +=
      static_cast<int64_t>(transport_->auth_rejections() - auth_rejections_seen_);
  round.metrics.rate_limited =
      static_cast<int64_t>(transport_->rate_limited() - rate_limited_seen_);
  round.metrics.connections_cut =
      static_cast<int64_t>(transport_->connections_cut() - connections_cut_seen_);
  auth_rejections_seen_ = transport_->auth_rejections();
  rate_limited_seen_ = transport_->rate_limited();
  connections_cut_seen_ = transport_->connections_cut();
  slots_.Reset();
  Status st = FinishRound(round);
  round_.reset();
  return st;
}

bool Coordinator::StepRound(Round& round, int64_t* wait_ms) {
  if (round.secure) {
    if (!round.secure->Step()) return false;
    *wait_ms = round.secure->TimeoutMs();
    return true;
  }
  if (std::none_of(round.members.begin(), round.members.end(),
                   [](const auto& m) { return IsOpen(m.second); })) {
    return false;
  }
  const int64_t now = clock_->NowMs();
  if (now >= round.deadline_ms) {
    for (auto& [id, state] : round.members) {
      if (IsOpen(state)) {
        spdlog::warn("round {}: client {} missed the deadline", round.number, id);
        state = MemberState::kFailed;
      }
    }
    return false;
  }
  *wait_ms = round.deadline_ms - now;
  return true;
}

std::vector<std::string> Coordinator::SampleCohort() {
  std::vector<std::string> live = population_.LiveIds(secagg_excluded_);
  std::vector<std::string> cohort;
  if (options_.cohort.sampling == CohortOptions::Sampling::kPoisson) {
    for (const std::string& id : live) {
      const bool in = secret_sampling()
                          ? privacy::BernoulliTrial(options_.cohort.rate, *privacy_->sampler())
                          : rng_.Uniform() < options_.cohort.rate;
      if (in) cohort.push_back(id);
    }
    return cohort;
  }
  if (secret_sampling()) {
    privacy::SecretShuffle(&live, *privacy_->sampler());
  } else {
    rng_.Shuffle(live);
  }
  const size_t n = std::min(live.size(), static_cast<size_t>(options_.cohort.size));
  cohort.assign(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(n));
  std::sort(cohort.begin(), cohort.end());
  return cohort;
}

int64_t Coordinator::WeightCap() const {
  const int64_t max_weight = options_.aggregation.max_weight;
  if (dp() || options_.max_weight_ratio <= 0 || round_->members.empty()) return max_weight;
  // The median of the counts the cohort claimed when joining: a minority of liars cannot move it.
  std::vector<uint64_t> claims;
  for (const auto& [id, state] : round_->members) {
    const Population::Client* c = population_.Find(id);
    claims.push_back(c != nullptr ? c->num_examples : 0);
  }
  std::nth_element(claims.begin(), claims.begin() + claims.size() / 2, claims.end());
  const double cap = options_.max_weight_ratio * static_cast<double>(claims[claims.size() / 2]);
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(cap, 9e15)), 1, max_weight);
}

void Coordinator::SendFit(const std::string& id) {
  Round& round = *round_;
  round.fits_sent[id]++;
  wire::FitInstruction fit;
  fit.model_version = model_version_;
  fit.train = options_.train;
  fit.seed = round.client_seed;
  fit.deadline_ms =
      static_cast<uint32_t>(std::max<int64_t>(0, round.deadline_ms - clock_->NowMs()));
  // A fresh nonce per instruction: the answering request and result must carry it, so a result
  // replayed from an earlier instruction (another round, or before a rejoin) is refused.
  fit.nonce = SecureRandomBytes(wire::kNonceBytes);
  round.nonces[id] = fit.nonce;
  if (round.secure) fit.secure_aggregation = round.secure->Instruction(id);
  if (dp()) fit.privacy = privacy_->Instruction(round.privacy);
  wire::Message msg = wire::MakeMessage(fit, round.number, "coordinator");
  msg.tensors = wire::ShareAll(round.global);
  const Population::Client* c = population_.Find(id);
  Status st =
      c != nullptr ? transport_->Send(c->peer, msg) : absl::NotFoundError("it left the federation");
  if (!st.ok()) {
    spdlog::warn("round {}: cannot send the model to client {}: {}", round.number, id,
                 st.message());
    round.members[id] = MemberState::kFailed;
  }
}

void Coordinator::Pump(int64_t timeout_ms) {
  auto in = transport_->Receive(timeout_ms);
  if (!in.ok()) {
    spdlog::error("transport: {}", in.status().message());
    return;
  }
  FlushLogs();
  if (!in->has_value()) return;
  Handle(std::move(**in));
  // Drain whatever else is already queued without waiting.
  for (int i = 0; i < 256; ++i) {
    auto more = transport_->Receive(0);
    if (!more.ok() || !more->has_value()) break;
    Handle(std::move(**more));
  }
}

void Coordinator::Handle(transport::Inbound in) {
  const uint64_t current = round_ ? round_->number : 0;
  if (!in.message.ok() && absl::IsPermissionDenied(in.message.status())) {
    OnRevokedKey(in);
    return;
  }
  if (!in.message.ok()) {
    const Status& err = in.message.status();
    const std::string* known = population_.IdOf(in.peer);
    const std::string who = known != nullptr ? "client " + *known : "peer " + PeerName(in.peer);
    Warn(absl::IsFailedPrecondition(err) ? "messages of another protocol version"
                                         : "malformed messages",
         in.auth_id.empty() ? who : in.auth_id,
         [&] { return absl::StrCat(who, ": ", err.message()); });
    (round_ ? round_->metrics.malformed : pending_malformed_)++;
    const auto code = absl::IsFailedPrecondition(err) ? wire::ErrorCode::kVersionMismatch
                                                      : wire::ErrorCode::kMalformed;
    Reply(in.peer, wire::MakeError(code, std::string(err.message()), current));
    if (known != nullptr && EvaluationPending(*known)) {
      // Garbage in answer to an evaluation: the client fails for it now, not at its deadline.
      eval_->metrics.rejected++;
      FailEvaluator(*known, "sent a malformed message while evaluating");
    }
    if (round_ && known != nullptr) {
      const std::string id = *known;
      // A member holding an upload slot that sends garbage gives the slot back now, not at
      // round.upload_timeout_s: it cannot hold up the others.
      auto m = round_->members.find(id);
      if (m != round_->members.end() && m->second == MemberState::kUploading) {
        round_->metrics.rejected++;
        if (round_->first_rejection.empty()) {
          round_->first_rejection = absl::StrCat("malformed: ", err.message());
        }
        FailMember(id, "sent a malformed result");
      } else {
        OnRefusedSecAggMessage(id, absl::StrCat("malformed: ", err.message()));
      }
    }
    return;
  }
  wire::Message& msg = *in.message;
  if (msg.type() == wire::MessageType::kJoin) {
    OnJoin(in, msg);
    return;
  }
  const std::string* known = population_.IdOf(in.peer);
  if (known == nullptr) {
    Refuse(in.peer, wire::ErrorCode::kUnknownClient,
           "this connection has not joined (send Join first)", msg.round);
    return;
  }
  const std::string id = *known;
  if (transport_->authenticates() && in.auth_id != id) {
    // A connection presenting another connection's routing id: the key decides who it is.
    RefuseIdentity(in, absl::StrCat("this connection's key is enrolled as '", in.auth_id,
                                    "'; it cannot speak for client '", id, "'"));
    return;
  }
  population_.Heard(id);
  switch (msg.type()) {
    case wire::MessageType::kHeartbeat:
      Reply(in.peer, wire::MakeMessage(wire::Heartbeat{}, current, "coordinator"));
      return;
    case wire::MessageType::kUploadRequest:
      OnUploadRequest(id, msg);
      return;
    case wire::MessageType::kFitResult:
      OnFitResult(id, msg);
      return;
    case wire::MessageType::kError:
      if (EvaluationPending(id) && msg.round == eval_->round) {
        OnEvaluateError(id, msg);
      } else {
        OnClientError(id, msg);
      }
      return;
    case wire::MessageType::kEvaluateResult:
      OnEvaluateResult(id, msg);
      return;
    case wire::MessageType::kSecAggData:
    case wire::MessageType::kSecAggMaskedInput:
      OnSecAgg(id, msg);
      return;
    default: {
      Warn("messages of a type a client may not send", id, [&] {
        return absl::StrCat("client ", id, ": unexpected ", wire::MessageTypeName(msg.type()),
                            " message");
      });
      (round_ ? round_->metrics.malformed : pending_malformed_)++;
      const std::string why =
          absl::StrCat("a client may not send ", wire::MessageTypeName(msg.type()));
      Refuse(in.peer, wire::ErrorCode::kMalformed, why, msg.round);
      OnRefusedSecAggMessage(id, why);
    }
  }
}

void Coordinator::Warn(const std::string& what, const std::string& source,
                       const std::function<std::string()>& detail) {
  logs_.try_emplace(what, what).first->second.Add(clock_->NowMs(), source, detail);
}

void Coordinator::FlushLogs() {
  const int64_t now = clock_->NowMs();
  for (auto& [what, log] : logs_) log.Flush(now);
}

void Coordinator::OnJoin(const transport::Inbound& in, const wire::Message& msg) {
  const transport::PeerId& peer = in.peer;
  const auto& join = std::get<wire::Join>(msg.body);
  if (!wire::IsValidClientId(join.client_id)) {
    Warn("joins with an invalid client id", in.auth_id.empty() ? PeerName(peer) : in.auth_id, [&] {
      return absl::StrCat("peer ", PeerName(peer), ": refused join with invalid client id");
    });
    Refuse(peer, wire::ErrorCode::kRejected, "client id must be 1-128 characters of [A-Za-z0-9._-]",
           0);
    return;
  }
  if (transport_->authenticates() && join.client_id != in.auth_id) {
    RefuseIdentity(in, absl::StrCat("this connection's key is enrolled as '", in.auth_id,
                                    "'; it cannot join as '", join.client_id, "'"));
    return;
  }
  const Population::Joined joined =
      population_.Join(join.client_id, peer, join.num_examples, 2 * options_.heartbeat_interval_ms);
  const bool rejoin = joined.rejoin;
  const transport::PeerId& old_peer = joined.old_peer;
  if (joined.old_peer_live) {
    // The old connection was alive a moment ago: two agents may share this id (ids must be
    // unique). The newest connection wins; the other will be told it is unknown and rejoin.
    Warn("joins from a second live connection", join.client_id, [&] {
      return absl::StrCat("client ", join.client_id, " joined from a second connection (",
                          PeerName(peer), ") while its first (", PeerName(old_peer),
                          ") is live; client ids must be unique");
    });
  }
  // Each first join at info while the population is small (a simulation of thousands logs a
  // summary); rejoins as one flood-proof summary, so that a rejoin flood cannot flood the log.
  if (!rejoin) {
    spdlog::log(population_.size() <= 32 ? spdlog::level::info : spdlog::level::debug,
                "client {} joined ({} examples, {} live)", join.client_id, join.num_examples,
                population_.LiveCount());
  } else {
    Warn("rejoins", join.client_id, [&] {
      return absl::StrCat("client ", join.client_id, " rejoined (", join.num_examples,
                          " examples, ", population_.LiveCount(), " live)");
    });
  }
  wire::Welcome welcome;
  welcome.job_name = options_.job_name;
  welcome.model = models::ModelSpecToWire(options_.model);
  welcome.heartbeat_interval_ms = static_cast<uint32_t>(options_.heartbeat_interval_ms);
  Reply(peer, wire::MakeMessage(std::move(welcome), 0, "coordinator"));
  // A cohort member that comes back mid-round (it restarted, or lost us) gets its work again.
  if (round_) {
    auto m = round_->members.find(join.client_id);
    if (m != round_->members.end() && m->second != MemberState::kDone &&
        m->second != MemberState::kFailed) {
      if (round_->secure) {
        // Its keys and shares of this round are gone with its restart: a dropout.
        FailMember(join.client_id, "rejoined mid-round: it leaves the round's secure aggregation");
        return;
      }
      if (round_->fits_sent[join.client_id] >= kMaxFitsPerRound) {
        // The model goes to a member at most twice a round (once, and once more after a restart):
        // a rejoin flood must not multiply the bytes sent.
        FailMember(join.client_id, "rejoined again mid-round; its work is not sent a third time");
        return;
      }
      slots_.Release(join.client_id);  // its grant was for the old connection
      m->second = MemberState::kTraining;
      SendFit(join.client_id);
      GrantSlots();
    }
  }
}

void Coordinator::OnUploadRequest(const std::string& id, const wire::Message& msg) {
  const transport::PeerId peer = PeerOf(id);
  if (!round_ || msg.round != round_->number) {
    (round_ ? round_->metrics.stale : pending_stale_)++;
    Refuse(peer, wire::ErrorCode::kWrongRound,
           absl::StrCat("round ", msg.round, " is closed",
                        round_ ? absl::StrCat("; round ", round_->number, " is open") : ""),
           msg.round);
    return;
  }
  auto m = round_->members.find(id);
  // With secure aggregation the upload is the masked input, due in stage 2.
  const MemberState due = round_->secure ? MemberState::kSecAggMasking : MemberState::kTraining;
  if (m == round_->members.end() || m->second != due) {
    Refuse(peer, wire::ErrorCode::kRejected,
           absl::StrCat("client ", id, " has no pending work in round ", msg.round), msg.round);
    return;
  }
  if (std::get<wire::UploadRequest>(msg.body).nonce != round_->nonces[id]) {
    round_->metrics.rejected++;
    Warn("upload requests with a stale nonce", id, [&] {
      return absl::StrCat("client ", id, ": upload request with a stale nonce in round ",
                          msg.round);
    });
    Refuse(peer, wire::ErrorCode::kRejected,
           absl::StrCat("upload request does not answer the instruction client ", id,
                        " was last sent in round ", msg.round, " (nonce mismatch)"),
           msg.round);
    return;
  }
  m->second = MemberState::kWaitingSlot;
  slots_.Enqueue(id);
  GrantSlots();
}

void Coordinator::OnClientError(const std::string& id, const wire::Message& msg) {
  // A client declines the round it was sent (its own privacy policy refuses it, kRejected) or
  // reports that its local training failed (any other code): it fails for the round at once
  // instead of at the deadline. One message per instruction at most, so one log line each, its
  // text cut short.
  const auto& err = std::get<wire::Error>(msg.body);
  if (!round_ || msg.round != round_->number) {
    (round_ ? round_->metrics.stale : pending_stale_)++;
    return;
  }
  auto m = round_->members.find(id);
  const bool busy = m != round_->members.end() &&
                    (m->second == MemberState::kTraining || (round_->secure && IsOpen(m->second)));
  if (!busy) {
    round_->metrics.rejected++;
    return;
  }
  const bool declined = err.code == wire::ErrorCode::kRejected;
  (declined ? round_->metrics.declined : round_->metrics.failed)++;
  constexpr size_t kMaxText = 300;
  const std::string text =
      err.message.size() > kMaxText ? err.message.substr(0, kMaxText) + "..." : err.message;
  spdlog::warn("round {}: client {} {} ({}): {}", round_->number, id,
               declined ? "declined" : "could not train", wire::ErrorCodeName(err.code), text);
  FailMember(id, declined ? "declined the round" : "reported that its training failed");
}

void Coordinator::GrantSlots() {
  Round& round = *round_;
  while (std::optional<std::string> next = slots_.NextWaiting()) {
    const std::string id = *next;
    auto m = round.members.find(id);
    if (m == round.members.end() || m->second != MemberState::kWaitingSlot) continue;
    const transport::PeerId peer = PeerOf(id);
    Status st =
        transport_->Send(peer, wire::MakeMessage(wire::UploadGrant{}, round.number, "coordinator"));
    if (!st.ok()) {
      FailMember(id, "unreachable for its upload grant");
      continue;
    }
    m->second = MemberState::kUploading;
    // The transport holds undelivered bytes of this connection up to the result's size, and no
    // more (transport.h): a result (or a masked input) is the only large message a client sends.
    const size_t bytes = round.secure ? round.secure->UploadBytes()
                                      : static_cast<size_t>(TotalElements(layout_)) * sizeof(float);
    slots_.Hold(id, peer, bytes + kResultOverheadBytes);
  }
}

void Coordinator::RevokeStaleGrants() {
  // A client that holds a grant without uploading would starve the others of upload slots.
  for (const std::string& id : slots_.Stale()) {
    FailMember(id, "did not upload within round.upload_timeout_s of its grant");
  }
}

void Coordinator::OnFitResult(const std::string& id, const wire::Message& msg) {
  const transport::PeerId peer = PeerOf(id);
  if (!round_ || msg.round != round_->number) {
    (round_ ? round_->metrics.stale : pending_stale_)++;
    Warn("results after their round closed", id, [&] {
      return absl::StrCat("client ", id, ": result for round ", msg.round,
                          " arrived after it closed");
    });
    Refuse(peer, wire::ErrorCode::kWrongRound, absl::StrCat("round ", msg.round, " is closed"),
           msg.round);
    return;
  }
  Round& round = *round_;
  auto m = round.members.find(id);
  if (m == round.members.end() || m->second != MemberState::kUploading || round.secure) {
    // (With secure aggregation a plain result is never due: the upload is the masked input.)
    round.metrics.rejected++;
    Warn("unsolicited results", id, [&] {
      return absl::StrCat("client ", id, ": unsolicited result in round ", round.number);
    });
    Refuse(peer, wire::ErrorCode::kRejected,
           absl::StrCat("client ", id, " holds no upload grant in round ", round.number),
           msg.round);
    return;
  }
  slots_.Release(id);
  const auto& result = std::get<wire::FitResult>(msg.body);
  int64_t weight = 0;
  Status st = FoldResult(id, msg, result, &weight);
  if (st.ok()) {
    m->second = MemberState::kDone;
    round.metrics.results++;
    round.metrics.examples += weight;
    round.weighted_loss += result.train_loss * static_cast<double>(weight);
  } else {
    m->second = MemberState::kFailed;
    round.metrics.rejected++;
    if (round.first_rejection.empty()) round.first_rejection = std::string(st.message());
    spdlog::warn("client {}: round {}: update rejected: {}", id, round.number, st.message());
    Refuse(peer, wire::ErrorCode::kInvalidUpdate, std::string(st.message()), round.number);
  }
  GrantSlots();
}

Status Coordinator::FoldResult(const std::string& id, const wire::Message& msg,
                               const wire::FitResult& result, int64_t* weight) {
  UpdateExpectation want;
  want.round = round_->number;
  want.model_version = model_version_;
  want.nonce = round_->nonces[id];
  want.max_weight = options_.aggregation.max_weight;
  want.layout = &layout_;
  HUDDLE_ASSIGN_OR_RETURN(auto spans, CheckUpdate(msg, want));
  if (dp()) {
    // Client-level DP: every client weighs the same (weighting by examples would break the
    // sensitivity bound), and a central-mode update must respect the clip norm.
    HUDDLE_RETURN_IF_ERROR(privacy_->CheckUpdate(round_->privacy, spans));
    HUDDLE_RETURN_IF_ERROR(aggregator_->Fold(spans, 1));
    if (result.within_clip) round_->privacy.within_clip++;
    *weight = 1;
    return absl::OkStatus();
  }
  // FedAvg weighs by the claimed example count, capped relative to the cohort's claims.
  *weight = std::min(static_cast<int64_t>(result.num_examples), round_->weight_cap);
  bool clipped = false;
  const double norm = norm_bound_.enabled() ? privacy::L2Norm(spans) : 0;
  if (const double bound = norm_bound_.BoundFor(round_->number, norm); bound > 0) {
    // Norm-bounded aggregation: a delta longer than the bound is scaled down to it, not refused
    // (a refusal by size would lock honest clients out after one bad round moved the model). A
    // non-finite norm is left to Fold, which refuses it naming the element.
    if (std::isfinite(norm) && norm > bound) {
      clip_scratch_.resize(spans.size());
      for (size_t i = 0; i < spans.size(); ++i) {
        clip_scratch_[i].spec = layout_[i];
        clip_scratch_[i].data.assign(spans[i].begin(), spans[i].end());
      }
      privacy::ClipToNorm(&clip_scratch_, bound);
      for (size_t i = 0; i < spans.size(); ++i) spans[i] = clip_scratch_[i].data;
      clipped = true;
    }
  }
  HUDDLE_RETURN_IF_ERROR(aggregator_->Fold(spans, *weight));
  norm_bound_.Accepted(round_->number, norm);
  if (clipped) round_->metrics.clipped++;
  if (*weight < static_cast<int64_t>(result.num_examples)) round_->metrics.weight_capped++;
  return absl::OkStatus();
}

void Coordinator::RefuseIdentity(const transport::Inbound& in, const std::string& why) {
  (round_ ? round_->metrics.auth_rejected : pending_auth_rejected_)++;
  Warn("identity refusals", in.auth_id, [&] {
    return absl::StrCat("peer ", PeerName(in.peer), " (key enrolled as '", in.auth_id, "'): ", why);
  });
  Refuse(in.peer, wire::ErrorCode::kAuthRefused, why, 0);
}

void Coordinator::OnRevokedKey(const transport::Inbound& in) {
  (round_ ? round_->metrics.auth_rejected : pending_auth_rejected_)++;
  const std::string why(in.message.status().message());
  const Population::Client* client = population_.Find(in.auth_id);
  if (client != nullptr && client->peer == in.peer) {
    // The key was removed from the allow-list: the client leaves the population now, and its
    // work in the open round or evaluation (if any) fails.
    spdlog::warn("client {}: {}; removing it from the federation", in.auth_id, why);
    if (round_) FailMember(in.auth_id, "lost its enrollment (key revoked)");
    FailEvaluator(in.auth_id, "lost its enrollment (key revoked)");
    population_.Remove(in.auth_id, in.peer);
  } else {
    Warn("messages with a revoked key", in.auth_id,
         [&] { return absl::StrCat("peer ", PeerName(in.peer), ": ", why); });
  }
  Refuse(in.peer, wire::ErrorCode::kAuthRefused, why, 0);
}

void Coordinator::FailMember(const std::string& id, const char* why) {
  Round& round = *round_;
  auto m = round.members.find(id);
  if (m == round.members.end()) return;
  if (m->second == MemberState::kDone || m->second == MemberState::kFailed) return;
  slots_.Release(id);
  m->second = MemberState::kFailed;
  if (round.secure) round.secure->OnMemberFailed(id);  // a stage no longer waits for it
  spdlog::warn("round {}: client {} {}", round.number, id, why);
  GrantSlots();
}

transport::PeerId Coordinator::PeerOf(const std::string& id) const {
  const Population::Client* c = population_.Find(id);
  return c != nullptr ? c->peer : transport::PeerId();
}

void Coordinator::ExpireSilentClients() {
  if (!round_ || options_.client_timeout_ms <= 0) return;
  for (const auto& [id, state] : round_->members) {
    if (state == MemberState::kDone || state == MemberState::kFailed) continue;
    if (!population_.Alive(id)) FailMember(id, "went silent (client_timeout)");
  }
}

void Coordinator::Reply(const transport::PeerId& peer, const wire::Message& msg) {
  Status st = transport_->Send(peer, msg);
  if (!st.ok()) spdlog::debug("reply to {} not sent: {}", PeerName(peer), st.message());
}

void Coordinator::Refuse(const transport::PeerId& peer, wire::ErrorCode code,
                         const std::string& text, uint64_t round) {
  Reply(peer, wire::MakeError(code, text, round));
}

StatusOr<std::optional<TensorList>> Coordinator::ReleasedMean(Round& round) {
  const RoundMetrics& m = round.metrics;
  // Secure aggregation refused before unmasking, or discarded its sum.
  const bool released_nothing = round.secure && !round.secure->sum();
  if (dp()) {
    // Under DP every round releases its noised update, whatever the number of results (skipping
    // a round for want of quorum would reveal that number without noise).
    if (m.results < options_.quorum) {
      spdlog::warn(
          "round {}: {} results, below quorum {}; DP rounds release their noised "
          "update regardless",
          round.number, m.results, options_.quorum);
    }
    if (released_nothing) {
      // No update, and nothing charged unless the unmasking began (the ledger then holds the
      // round: SecureRound appended it before asking for any share).
      HUDDLE_RETURN_IF_ERROR(
          privacy_->NoRelease(round.privacy, round.secure.get(), &round.metrics));
      NoteSpend();
      return std::nullopt;
    }
  } else if (released_nothing || m.results < options_.quorum || m.results == 0) {
    spdlog::warn("round {}: {} results, quorum is {}; the model is unchanged", round.number,
                 m.results, options_.quorum);
    return std::nullopt;
  }
  // The sum: secure aggregation's unmasked one, or the aggregator's. Under DP it is noised and
  // divided by the fixed denominator; without, it is averaged by the results' weights.
  TensorList mean;
  if (dp()) {
    HUDDLE_RETURN_IF_ERROR(privacy_->Release(round.privacy, m.results, &*aggregator_,
                                             round.secure.get(), &round.metrics, &mean));
    NoteSpend();
  } else if (round.secure) {
    HUDDLE_RETURN_IF_ERROR(round.secure->Mean(&mean));
  } else {
    HUDDLE_RETURN_IF_ERROR(aggregator_->WeightedMean(&mean));
  }
  return mean;
}

Status Coordinator::FinishRound(Round& round) {
  RoundMetrics& m = round.metrics;
  m.dropped = m.clients_sampled - m.results;
  // Secure aggregation's members report no loss (and, weighing uniformly, no example count).
  if (m.results > 0 && !dp() && !round.secure && m.examples > 0) {
    m.train_loss = round.weighted_loss / static_cast<double>(m.examples);
  }
  HUDDLE_ASSIGN_OR_RETURN(std::optional<TensorList> mean, ReleasedMean(round));
  if (mean) {
    HUDDLE_RETURN_IF_ERROR(optimizer_.Apply(*mean, &model_));
    ++model_version_;
    m.updated = true;
  }
  if (m.updated) {
    // A model that is no longer finite is never checkpointed, sent or reported as trained.
    if (Status st = CheckFinite(model_, "the global model after the update"); !st.ok()) {
      return absl::DataLossError(absl::StrCat(
          "round ", round.number, ": ", st.message(),
          "; the job stops (the last checkpoint holds the model before this round; lower "
          "server.learning_rate or set aggregation.max_update_norm)"));
    }
  }
  ++rounds_this_run_;
  results_this_run_ += m.results;
  if (m.secure_aggregation) {
    const RoundMetrics::SecureAggregation& a = *m.secure_aggregation;
    ++(a.released ? summary_.secure_rounds_released : summary_.secure_rounds_refused);
    summary_.secure_restarts += a.restarts;
    for (const auto& [id, why] : a.blamed) summary_.secure_blamed.push_back(id);
  }
  // Rounds that accepted nothing, in a row. Not under DP: there every round releases its noised
  // update, and stopping on the count of results would reveal it without noise.
  if (!dp() && !m.updated) {
    ++rounds_without_update_;
    no_update_reasons_.push_back(absl::StrCat(
        "round ", round.number, ": ", m.results, " of ", m.clients_sampled, " results",
        round.first_rejection.empty() ? ""
                                      : absl::StrCat(", first refusal: ", round.first_rejection)));
  } else {
    rounds_without_update_ = 0;
    no_update_reasons_.clear();
  }
  const bool last = round.number == static_cast<uint64_t>(options_.rounds);
  const bool due = options_.eval_every > 0 &&
                   (round.number % static_cast<uint64_t>(options_.eval_every) == 0 || last);
  if (due && options_.eval_mode == CoordinatorOptions::EvalMode::kFederated) {
    // Between this round and the next, bounded by its own deadline (federated_eval.cc).
    HUDDLE_RETURN_IF_ERROR(FederatedEvaluate(round.number, &m));
  } else if (due && evaluator_) {
    HUDDLE_RETURN_IF_ERROR(Evaluate(round.number, &m));
  }
  m.elapsed_s = elapsed_before_s_ + (clock_->NowMs() - started_ms_) / 1000.0;
  summary_.rounds_completed = round.number;
  summary_.elapsed_s = m.elapsed_s;
  summary_.bytes_in = bytes_in_base_ + transport_->bytes_in();
  summary_.bytes_out = bytes_out_base_ + transport_->bytes_out();
  if (!options_.out_dir.empty()) {
    if (dp()) {
      // What the DP guarantee covers, and apart from it what only the operator may see.
      HUDDLE_RETURN_IF_ERROR(AppendLine(Path(options_.out_dir, kMetricsFile), m.PublicJson()));
      HUDDLE_RETURN_IF_ERROR(
          AppendLine(Path(options_.out_dir, privacy::kOperatorMetricsFile), m.OperatorJson()));
      HUDDLE_RETURN_IF_ERROR(privacy_->WriteReport(summary_.stop_reason));
    } else {
      HUDDLE_RETURN_IF_ERROR(AppendLine(Path(options_.out_dir, kMetricsFile), m.ToJson()));
      // DP-SGD inside the clients, if any.
      HUDDLE_RETURN_IF_ERROR(privacy_->WriteReport(summary_.stop_reason));
    }
    HUDDLE_RETURN_IF_ERROR(SaveCheckpoint());
  }
  if (on_round_) on_round_(m);
  return absl::OkStatus();
}

Status Coordinator::Evaluate(uint64_t round, RoundMetrics* m) {
  // On a worker thread, answering heartbeats and joins meanwhile: a long evaluation must not look
  // like a dead coordinator to the clients.
  auto pending = std::async(std::launch::async, [this] { return evaluator_(model_); });
  while (pending.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    Pump(20);
  }
  HUDDLE_ASSIGN_OR_RETURN(models::EvalStats eval, pending.get());
  evaluated_version_ = model_version_;
  m->test_accuracy = eval.accuracy;
  m->test_loss = eval.loss;
  summary_.final_test_accuracy = eval.accuracy;
  summary_.final_test_loss = eval.loss;
  if (!summary_.best_test_accuracy || eval.accuracy > *summary_.best_test_accuracy) {
    summary_.best_test_accuracy = eval.accuracy;
    summary_.best_round = round;
  }
  return absl::OkStatus();
}

Status Coordinator::SaveCheckpoint() {
  Checkpoint c;
  c.completed_round = summary_.rounds_completed;
  c.model_version = model_version_;
  c.seed = options_.seed;
  c.rng_state = rng_.state();
  c.optimizer_state = optimizer_.state();
  c.elapsed_s = summary_.elapsed_s;
  c.bytes_in = summary_.bytes_in;
  c.bytes_out = summary_.bytes_out;
  c.clip_norm = privacy_->clip_norm();
  c.privacy_mode = static_cast<int64_t>(options_.privacy.mode);
  const double none = std::numeric_limits<double>::quiet_NaN();
  c.final_test_accuracy = summary_.final_test_accuracy.value_or(none);
  // A diverged model's loss (inf under the server's evaluator) is recorded as unknown: the
  // checkpoint holds only values it reads back (CheckCheckpointValues).
  c.final_test_loss = summary_.final_test_loss.value_or(none);
  if (std::isinf(c.final_test_loss)) c.final_test_loss = none;
  c.best_test_accuracy = summary_.best_test_accuracy.value_or(none);
  c.best_round = summary_.best_round.value_or(0);
  c.model = std::move(model_);  // lent to the checkpoint, not copied (the model can be large)
  Status st = WriteCheckpoint(Path(options_.out_dir, kCheckpointFile), c);
  model_ = std::move(c.model);
  return st;
}

Status Coordinator::Finish() {
  for (const auto& [id, c] : population_.clients()) {
    Reply(c.peer, wire::MakeMessage(wire::Shutdown{"job complete"}, 0, "coordinator"));
  }
  if (options_.out_dir.empty()) return absl::OkStatus();
  HUDDLE_RETURN_IF_ERROR(WriteModelFile(Path(options_.out_dir, "model.bin"), model_));
  HUDDLE_RETURN_IF_ERROR(privacy_->WriteReport(summary_.stop_reason));
  return WriteFileAtomic(Path(options_.out_dir, "summary.json"), summary_.ToJson(options_));
}

}  // namespace huddle::coordinator
