// The coordinator: runs rounds of federated averaging over a ServerTransport.
//
// It keeps the enrolled population (clients that joined, with their liveness), samples a cohort
// each round, sends the global model, grants upload slots, validates every result against the
// round's spec and folds it into an exact, order-independent streaming aggregator (memory
// O(model), whatever the number of clients), applies the server optimizer, evaluates, writes
// metrics and a checkpoint. See RunRound() in coordinator.cc for the round state machine, and
// docs/protocol.md for the messages.
//
// The model may be external (models::ModelSpec::External: only its tensors are known): every step
// above only sees tensors, so it runs unchanged; its initial values come from
// CoordinatorOptions::initial_model, and it is evaluated, if at all, by the clients (federated
// evaluation, FederatedEvaluate() in federated_eval.cc: between rounds, with its own deadline).
//
// Nothing a client sends can crash it or stall a round past its deadline: malformed, wrong-round,
// wrong-shaped, non-finite or unsolicited messages are answered with an Error (or dropped),
// logged with the peer's identity and counted in the round's metrics; the model never changes
// because of them.
//
// Thread-safety: Run() on one thread; the object is not shared.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "aggregation/server_optimizer.h"
#include "aggregation/streaming_aggregator.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/rng.h"
#include "coordinator/async_round.h"
#include "coordinator/job_summary.h"
#include "coordinator/member_state.h"
#include "coordinator/options.h"
#include "coordinator/population.h"
#include "coordinator/round_metrics.h"
#include "coordinator/round_privacy.h"
#include "coordinator/secure_round.h"
#include "coordinator/secure_session.h"
#include "coordinator/sync_round.h"
#include "coordinator/update_check.h"
#include "coordinator/upload_slots.h"
#include "models/model.h"
#include "privacy/budget.h"
#include "privacy/job_ledger.h"
#include "privacy/ledger.h"
#include "privacy/noise.h"
#include "transport/transport.h"

namespace huddle::coordinator {

// Server-side evaluation of a global model (e.g. on the Fashion-MNIST test set).
using Evaluator = std::function<StatusOr<models::EvalStats>(const TensorList& model)>;
// Called after every round (live progress).
using RoundCallback = std::function<void(const RoundMetrics&)>;

class Coordinator : private SecureRoundHost, private SyncRoundHost {
 public:
  // `transport` and `clock` must outlive the coordinator. `evaluator` may be empty.
  Coordinator(CoordinatorOptions options, transport::ServerTransport* transport, const Clock* clock,
              Evaluator evaluator = {}, RoundCallback on_round = {});

  // Runs (or resumes) the job to its last round, then shuts the clients down and writes the
  // final model and summary to out_dir. Returns the first unrecoverable error (bad options, an
  // output directory holding another job's outputs, no clients by wait_for_clients_ms, I/O failure
  // writing outputs), or Aborted when the job trained nothing: max_rounds_without_update rounds in
  // a row accepted no update, or no round of the job updated the model (summary.json says why).
  Status Run(const std::atomic<bool>* stop = nullptr);

  const TensorList& model() const { return model_; }
  const JobSummary& summary() const { return summary_; }

 private:
  Status Initialise();
  // `started`: a round of this run has already run (min_clients then no longer applies).
  Status WaitForClients(const std::atomic<bool>* stop, bool started);
  Status RunRound(uint64_t number);
  // Buffered asynchronous training (async:, coordinator/async_round.h): one server step (a
  // flush): open, keep `concurrency` clients training, fold results as they arrive until `buffer`
  // are in, close, then the same release, step, evaluation, metrics and checkpoint as a round
  // (FinishRound). When no update was accepted for max_rounds_without_update x round.deadline_s
  // it sets summary_.failure instead (the job then ends); Cancelled when `stop` is set meanwhile.
  Status RunFlush(uint64_t number, const std::atomic<bool>* stop);
  // Buffered asynchronous training with secure aggregation (secure_session.h, async_secure.cc):
  // step `number` is session `number`. Keeps async.concurrency / async.buffer sessions in flight
  // (started in order, each on the current model with async.buffer idle eligible clients), steps
  // each one's secure aggregation, and when session `number` is over applies it as a round
  // (FinishRound), its mean scaled by its staleness factor. Ends the job (summary_) when no
  // session can start, as RunFlush does; Cancelled when `stop` is set (the sessions are dropped).
  Status RunSecureStep(uint64_t number, const std::atomic<bool>* stop);
  bool secure_async() const {
    return options_.async.enabled && options_.secure_aggregation.enabled;
  }
  int64_t SessionsInFlight() const;
  SecureSession* SessionFor(uint64_t number);
  SecureSession* SessionOf(const std::string& id);
  // Clients a session `number` may take: live, not excluded, in no session, not yet sent the
  // current model, and (DP) allowed by the participation bound.
  std::vector<std::string> SessionCandidates(uint64_t number) const;
  // Starts session `number` with async.buffer of them (`partial`: with 2 or more): false when
  // there are too few.
  StatusOr<bool> StartSession(uint64_t number, bool partial);
  // One step of session `number`'s secure aggregation (or of its failed cohort); once over, its
  // members are free. `wait_ms` lowered to its stage's deadline.
  void StepSession(uint64_t number, SecureSession& s, int64_t* wait_ms);
  // The round's or the flush's common start: metrics, counters carried from between rounds.
  void BeginRound(Round& round, uint64_t number);
  // Its common end: durations, traffic and the transport's counters into its metrics.
  void EndRoundMetrics(Round& round, int64_t start_ms, uint64_t in0, uint64_t out0);
  // One step of the round's scheduler (step 3 of RunRound): the secure aggregation's stage, or the
  // plain round's deadline. False once the round is over; `wait_ms`: how long to wait for
  // messages before the next step.
  bool StepRound(Round& round, int64_t* wait_ms);
  std::vector<std::string> SampleCohort();
  void Pump(int64_t timeout_ms);
  void Handle(transport::Inbound in);
  void OnJoin(const transport::Inbound& in, const wire::Message& msg);
  void OnRevokedKey(const transport::Inbound& in);
  void RefuseIdentity(const transport::Inbound& in, const std::string& why);
  // A warning about `source` (a client id or a peer): logged at once, or counted into one summary
  // line per kind (`what`, plural) every 10 s when they come faster (LogSummary).
  void Warn(const std::string& what, const std::string& source,
            const std::function<std::string()>& detail) override;
  void FlushLogs();
  void FailMember(const std::string& id, const char* why) override;
  void Reply(const transport::PeerId& peer, const wire::Message& msg);
  void Refuse(const transport::PeerId& peer, wire::ErrorCode code, const std::string& text,
              uint64_t round) override;
  // SyncRoundHost: a round message outside the open round.
  void CountStale() override;
  // The round's released update by its one path (nullopt: none, the model stays): the sum of
  // secure aggregation or of the aggregator; under DP noised over the fixed denominator
  // (RoundPrivacy::Release; a secure round that released nothing is NoRelease), else the weighted
  // mean when the quorum is met.
  StatusOr<std::optional<TensorList>> ReleasedMean(Round& round);
  Status FinishRound(Round& round);
  // Secure aggregation (coordinator/secure_round.h): its session for the cohort (nullptr when
  // the cohort is too small to hide anyone: the round then trains nothing).
  // `host`: the round's (nullptr: the coordinator, for its synchronous round); `enough`:
  // SecureRoundSettings::enough.
  StatusOr<std::unique_ptr<SecureRound>> StartSecureRound(Round& round,
                                                          const std::vector<std::string>& cohort,
                                                          SecureRoundHost* host = nullptr,
                                                          int64_t enough = 0);
  // A client's message of a secure aggregation stage (SecAggData, or its masked input), to the
  // open round or to its asynchronous session.
  void OnSecAgg(const std::string& id, const wire::Message& msg);
  // The round a client's message of round `number` belongs to, with its scheduler and upload
  // slots: the synchronous round, or an asynchronous secure session. All nullptr when none.
  struct RoundRef {
    Round* round = nullptr;
    SyncRound* sched = nullptr;
    UploadSlots* slots = nullptr;
    uint64_t model_version = 0;
  };
  RoundRef RoundOf(uint64_t number);
  // Member `id` sent a message refused before it reached the session (malformed, or of a type no
  // client may send): if a secure-aggregation stage awaits its answer (a SecAggData, or in stage 4
  // its upload request or masked input), it is a dropout now, so the stage ends as soon as the
  // others due have answered instead of at stage_timeout. `why` names what it sent.
  void OnRefusedSecAggMessage(const std::string& id, const std::string& why);
  // SecureRoundHost: what the round's secure aggregation asks of the coordinator.
  Status SendToMember(const std::string& id, const wire::Message& msg) override;
  void SendFit(const std::string& id, int64_t deadline_ms) override;
  StatusOr<std::pair<privacy::Spend, bool>> WouldSpend(const privacy::LedgerEntry& entry) override;
  Status Account(const privacy::LedgerEntry& entry) override;
  // DP (coordinator/round_privacy.h): the job's privacy session, the only ledger appender.
  bool dp() const { return privacy_ && privacy_->enabled(); }
  // Cohorts and client seeds come from the OS CSPRNG (secret sampling) rather than the job seed:
  // under DP with private noise.
  bool secret_sampling() const { return privacy_ && privacy_->secret_sampling(); }
  // The privacy session's spend into the summary (after it changed).
  void NoteSpend();
  Status SaveCheckpoint();
  // The global model after `round`, on the evaluator: into *metrics and the summary.
  Status Evaluate(uint64_t round, RoundMetrics* metrics);
  Status NoteEvaluation(uint64_t round, const models::EvalStats& eval, RoundMetrics* metrics);
  // Federated evaluation (coordinator/federated_eval.cc): the global model after `round` sent to
  // up to federated_eval.clients live clients, their answers validated and averaged (weights
  // capped) until all answered or the evaluation's deadline: into *metrics and the summary.
  Status FederatedEvaluate(uint64_t round, RoundMetrics* metrics);
  std::vector<std::string> SampleEvaluators(uint64_t round) const;
  void OnEvaluateResult(const std::string& id, const wire::Message& msg);
  // Whether the open evaluation is waiting for an answer from `id`.
  bool EvaluationPending(const std::string& id) const;
  // `id` fails for the open evaluation (its Error, a malformed or refused answer, silence).
  void FailEvaluator(const std::string& id, const char* why);
  // Its Error answering the evaluation: declined (kRejected) or failed.
  void OnEvaluateError(const std::string& id, const wire::Message& msg);
  Status Finish();

  CoordinatorOptions options_;
  transport::ServerTransport* transport_;
  const Clock* clock_;
  Evaluator evaluator_;
  RoundCallback on_round_;

  TensorList model_;
  ModelLayout layout_;
  uint64_t model_version_ = 0;
  uint64_t next_round_ = 1;
  Rng rng_;
  std::optional<aggregation::StreamingAggregator> aggregator_;
  aggregation::ServerOptimizer optimizer_;

  Population population_{clock_, options_.client_timeout_ms};
  UploadSlots slots_{transport_, clock_, options_.upload_slots, options_.upload_timeout_ms};
  std::optional<Round> round_;
  // The synchronous round's scheduler (sync_round.h), from Initialise on: the plain round's
  // handlers, its upload grants and failures.
  std::optional<SyncRound> sync_;
  // The asynchronous scheduler, with async: enabled without secure aggregation (from Initialise
  // on).
  std::optional<AsyncRound> async_;
  // With async: and secure_aggregation: the sessions in flight by number (the step each will
  // be), each member's session, and the model version each client was last sent.
  std::map<uint64_t, std::unique_ptr<SecureSession>> sessions_;
  std::map<std::string, uint64_t> session_of_;
  std::map<std::string, uint64_t> session_version_;
  bool warned_small_population_ = false;
  // An open federated evaluation (between rounds).
  enum class EvalState { kPending, kAnswered, kFailed };
  struct EvalAnswer {
    uint64_t examples = 0;  // as claimed, in [1, aggregation.max_weight]
    double loss = 0;
    double accuracy = 0;
  };
  struct EvalRun {
    uint64_t round = 0;
    uint64_t model_version = 0;
    int64_t deadline_ms = 0;
    std::map<std::string, EvalState> members;
    std::map<std::string, std::string> nonces;
    std::map<std::string, EvalAnswer> answers;
    RoundMetrics::FederatedEval metrics;
  };
  std::optional<EvalRun> eval_;
  // Counters for messages that arrive between rounds, added to the next round's metrics.
  int64_t pending_stale_ = 0;
  int64_t pending_malformed_ = 0;
  int64_t pending_auth_rejected_ = 0;
  uint64_t auth_rejections_seen_ = 0;  // transport counters already attributed to a round
  uint64_t rate_limited_seen_ = 0;
  uint64_t connections_cut_seen_ = 0;
  int64_t rounds_without_update_ = 0;  // in a row, this run
  int64_t rounds_this_run_ = 0;
  int64_t rounds_below_quorum_ = 0;  // DP rounds of this run with fewer results than the quorum
  int64_t results_this_run_ = 0;
  std::vector<std::string> no_update_reasons_;  // of those rounds
  uint64_t evaluated_version_ = UINT64_MAX;     // model version of the last evaluation
  std::set<std::string> secagg_excluded_;       // clients found lying in secure aggregation
  std::map<std::string, LogSummary> logs_;      // Warn()'s, by kind

  std::optional<RoundPrivacy> privacy_;  // from Initialise on
  // Asynchronous training under DP: who contributed to which step (the participation bound).
  std::optional<Contributions> contributions_;

  double elapsed_before_s_ = 0;  // from a resumed checkpoint
  int64_t started_ms_ = 0;
  uint64_t bytes_in_base_ = 0;
  uint64_t bytes_out_base_ = 0;
  JobSummary summary_;
};

}  // namespace huddle::coordinator
