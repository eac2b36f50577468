#include "coordinator/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/tensor_io.h"
#include "common/time_format.h"
#include "coordinator/checkpoint.h"
#include "coordinator/update_check.h"
#include "privacy/report.h"
#include "privacy/sampling.h"

namespace huddle::coordinator {
namespace {

constexpr uint64_t kInitStream = 0x696e6974;    // "init"
constexpr uint64_t kCohortStream = 0x636f686f;  // "coho"
constexpr uint64_t kClientStream = 0x636c6e74;  // "clnt"

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
    for (const char* file : {kMetricsFile, privacy::kOperatorMetricsFile, kParticipationFile}) {
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
      for (const char* file : {kMetricsFile, privacy::kOperatorMetricsFile, kParticipationFile,
                               kCheckpointFile, "summary.json", "model.bin"}) {
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
  sync_.emplace(SyncRound::Parts{&options_, transport_, clock_, &population_, &slots_,
                                 &*aggregator_, &*privacy_, layout_, this});
  if (options_.async.enabled) {
    if (dp()) {
      // The participation bound (privacy.max_participations, contributions.h); a resume recounts
      // every released step's contributors.
      HUDDLE_ASSIGN_OR_RETURN(
          auto contributions,
          Contributions::Open(options_.out_dir, options_.resume,
                              *options_.privacy.max_participations, options_.privacy.min_separation,
                              privacy_->releases()));
      contributions_.emplace(std::move(contributions));
    }
    // (With secure aggregation the steps are sessions instead: RunSecureStep.)
    if (!secure_async()) {
      async_.emplace(AsyncRound::Parts{
          &options_, transport_, clock_, &population_, &slots_, &*aggregator_, &*privacy_, layout_,
          this, &rng_, privacy_->sampler(), contributions_ ? &*contributions_ : nullptr});
    }
  }
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
  summary_.virtual_clock = clock_->simulated();
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
    HUDDLE_RETURN_IF_ERROR(secure_async() ? RunSecureStep(r, stop)
                           : async_       ? RunFlush(r, stop)
                                          : RunRound(r));
    if (!summary_.stop_reason.empty()) break;  // (a step may end the job: RunFlush)
    if (!summary_.failure.empty()) break;
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
    sync_->ExpireSilentClients();
  }
  // Said when the job's first round of this run starts too: its clients are there.
  if (announced || !started) spdlog::info("{} clients live", population_.LiveCount());
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
void Coordinator::BeginRound(Round& round, uint64_t number) {
  round.number = number;
  round.global = std::make_shared<const TensorList>(model_);
  round.metrics.round = number;
  round.metrics.total_rounds = static_cast<uint64_t>(options_.rounds);
  round.metrics.clients_enrolled = population_.LiveCount();
  round.metrics.stale = std::exchange(pending_stale_, 0);
  round.metrics.malformed = std::exchange(pending_malformed_, 0);
  round.metrics.auth_rejected = std::exchange(pending_auth_rejected_, 0);
}

void Coordinator::EndRoundMetrics(Round& round, int64_t start_ms, uint64_t in0, uint64_t out0) {
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
}

Status Coordinator::RunRound(uint64_t number) {
  const int64_t start_ms = clock_->NowMs();
  const uint64_t in0 = transport_->bytes_in();
  const uint64_t out0 = transport_->bytes_out();
  round_.emplace();
  Round& round = *round_;
  sync_->Begin(&round, model_version_);
  BeginRound(round, number);
  round.deadline_ms = start_ms + options_.round_deadline_ms;
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
  round.weight_cap = sync_->WeightCap();
  bool train = true;
  if (options_.secure_aggregation.enabled) {
    HUDDLE_ASSIGN_OR_RETURN(round.secure, StartSecureRound(round, cohort));
    train = round.secure != nullptr;
  }
  for (const std::string& id : cohort) {
    if (train) {
      sync_->SendFit(id);
    } else {
      round.members[id] = MemberState::kFailed;
      round.outcomes[id] = {"dropped", "the cohort is too small for secure aggregation"};
    }
  }

  // 3. One scheduler step per iteration (with secure aggregation, its stages: secure_round.h).
  int64_t wait_ms = 0;
  while (StepRound(round, &wait_ms)) {
    Pump(std::min<int64_t>(100, wait_ms));
    sync_->ExpireSilentClients();
    sync_->RevokeStaleGrants();
  }
  if (round.secure) {
    round.metrics.secure_aggregation = round.secure->metrics();
    if (round.secure->sum()) {
      round.metrics.results = round.secure->survivors();
      round.metrics.examples = round.secure->examples();
    }
  }

  // 4-5.
  EndRoundMetrics(round, start_ms, in0, out0);
  slots_.Reset();
  Status st = FinishRound(round);
  sync_->End();
  round_.reset();
  return st;
}

bool Coordinator::StepRound(Round& round, int64_t* wait_ms) {
  if (!round.secure) return sync_->Step(wait_ms);
  if (!round.secure->Step()) return false;
  *wait_ms = round.secure->TimeoutMs();
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

void Coordinator::FailMember(const std::string& id, const char* why) {
  if (secure_async()) {
    if (SecureSession* session = SessionOf(id)) session->sched->FailMember(id, why);
    return;
  }
  if (async_) {
    async_->FailMember(id, why);
  } else {
    sync_->FailMember(id, why);
  }
}

StatusOr<std::optional<TensorList>> Coordinator::ReleasedMean(Round& round) {
  const RoundMetrics& m = round.metrics;
  // Secure aggregation refused before unmasking, or discarded its sum.
  const bool released_nothing = round.secure && !round.secure->sum();
  if (dp()) {
    // Under DP every round releases its noised update, whatever the number of results (skipping
    // a round for want of quorum would reveal that number without noise).
    if (m.results < options_.quorum) {
      // Said once, then counted: a small cohort can fall below the quorum every round, and the
      // job's summary line gives the count.
      if (rounds_below_quorum_++ == 0) {
        spdlog::warn(
            "round {}: {} results, below quorum {}; DP rounds release their noised update "
            "regardless (later rounds below the quorum are counted, not logged)",
            round.number, m.results, options_.quorum);
      } else {
        spdlog::debug("round {}: {} results, below quorum {}", round.number, m.results,
                      options_.quorum);
      }
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
    if (contributions_) {
      // Who contributed, durably, before the ledger holds the release (contributions.h).
      std::vector<std::string> contributors;
      for (const auto& [id, state] : round.members) {
        if (state == MemberState::kDone) contributors.push_back(id);
      }
      HUDDLE_RETURN_IF_ERROR(contributions_->Record(round.number, contributors));
    }
    HUDDLE_RETURN_IF_ERROR(privacy_->Release(round.privacy, m.results, &*aggregator_,
                                             round.secure.get(), &round.metrics, &mean));
    NoteSpend();
  } else if (round.secure) {
    HUDDLE_RETURN_IF_ERROR(round.secure->Mean(&mean));
  } else {
    HUDDLE_RETURN_IF_ERROR(aggregator_->WeightedMean(&mean));
  }
  if (round.discount != 1) {
    // An asynchronous secure session's staleness (secure_session.h): post-processing.
    for (Tensor& t : mean) {
      for (float& v : t.data) v = static_cast<float>(v * round.discount);
    }
  }
  return mean;
}

Status Coordinator::FinishRound(Round& round) {
  RoundMetrics& m = round.metrics;
  if (!async_) m.dropped = m.clients_sampled - m.results;  // (a flush counts its own: Close)
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
  m.wall_ms = clock_->WallMs();  // the rows' `time`
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
    HUDDLE_RETURN_IF_ERROR(AppendLine(Path(options_.out_dir, kParticipationFile),
                                      ParticipationJson(round, Iso8601Utc(m.wall_ms))));
    HUDDLE_RETURN_IF_ERROR(SaveCheckpoint());
  }
  if (on_round_) on_round_(m);
  return absl::OkStatus();
}

Status Coordinator::Evaluate(uint64_t round, RoundMetrics* m) {
  // On a worker thread, answering heartbeats and joins meanwhile: a long evaluation must not look
  // like a dead coordinator to the clients. On a simulated clock it takes no virtual time and
  // receives nothing (what arrives meanwhile would depend on how long it ran in real time).
  if (clock_->simulated()) {
    HUDDLE_ASSIGN_OR_RETURN(models::EvalStats eval, evaluator_(model_));
    return NoteEvaluation(round, eval, m);
  }
  auto pending = std::async(std::launch::async, [this] { return evaluator_(model_); });
  while (pending.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    Pump(20);
  }
  HUDDLE_ASSIGN_OR_RETURN(models::EvalStats eval, pending.get());
  return NoteEvaluation(round, eval, m);
}

Status Coordinator::NoteEvaluation(uint64_t round, const models::EvalStats& eval, RoundMetrics* m) {
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
  summary_.SaveTo(&c);
  c.model_version = model_version_;
  c.seed = options_.seed;
  c.rng_state = rng_.state();
  c.optimizer_state = optimizer_.state();
  c.clip_norm = privacy_->clip_norm();
  c.privacy_mode = static_cast<int64_t>(options_.privacy.mode);
  c.model = std::move(model_);  // lent to the checkpoint, not copied (the model can be large)
  Status st = WriteCheckpoint(Path(options_.out_dir, kCheckpointFile), c);
  model_ = std::move(c.model);
  return st;
}

Status Coordinator::Finish() {
  if (rounds_below_quorum_ > 1) {
    spdlog::warn(
        "{} rounds of this run had fewer results than round.quorum {} (under DP each "
        "released its noised update)",
        rounds_below_quorum_, options_.quorum);
  }
  for (const auto& [id, c] : population_.clients()) {
    Reply(c.peer, wire::MakeMessage(wire::Shutdown{"job complete"}, 0, "coordinator"));
  }
  summary_.not_private_because = privacy_->NotPrivateBecause();
  if (options_.out_dir.empty()) return absl::OkStatus();
  HUDDLE_RETURN_IF_ERROR(WriteModelFile(Path(options_.out_dir, "model.bin"), model_));
  HUDDLE_RETURN_IF_ERROR(privacy_->WriteReport(summary_.stop_reason));
  return WriteFileAtomic(Path(options_.out_dir, "summary.json"), summary_.ToJson(options_));
}

}  // namespace huddle::coordinator
