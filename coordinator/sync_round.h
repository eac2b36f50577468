// The synchronous round's scheduler: the plain round of federated averaging, from the cohort's fit
// instructions to the last result folded (or the deadline), and the per-round table the round's
// parts share (Round).
//
// Owns: the handlers of a plain round's messages (upload requests, results, clients' errors), the
// granting of upload slots in request order (each folded result's upload timed from its grant:
// RoundMetrics::upload_seconds), the validation and folding of every result (FedAvg weights capped
// by the cohort's median claim, norm-bounded clipping: UpdateNormBound, whose state is job-long),
// and the end of a plain round (every member done or failed, or the deadline).
// Borrows: the job's options, the transport and clock, the population (read only: connections,
// liveness, claimed example counts), the upload slots, the aggregator and the privacy session (its
// per-round settings and update check); and its host, the coordinator, for what leaves the round
// as a refusal or a warning, and for counting stale messages. It never touches the model, the
// ledger or the checkpoint.
//
// States: between rounds (no round open: Begin() not called, or End() since) every round message
// is stale; while open each member moves through member_state.h's kTraining -> kWaitingSlot ->
// kUploading -> kDone, or to kFailed from any of them. With secure aggregation (Round::secure) the
// same handlers grant the masked inputs' slots and fail members, and SecureRound steps the round.
//
// Thread-safety: none; the round loop's thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "aggregation/streaming_aggregator.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/tensor.h"
#include "coordinator/contributions.h"
#include "coordinator/member_state.h"
#include "coordinator/options.h"
#include "coordinator/population.h"
#include "coordinator/round_metrics.h"
#include "coordinator/round_privacy.h"
#include "coordinator/secure_round.h"
#include "coordinator/update_check.h"
#include "coordinator/upload_slots.h"
#include "proto/messages.h"
#include "transport/transport.h"

namespace huddle::coordinator {

// One open round: what the round loop, the synchronous scheduler and secure aggregation share.
struct Round {
  uint64_t number = 0;
  int64_t deadline_ms = 0;
  std::shared_ptr<const TensorList> global;
  RoundMembers members;
  std::map<std::string, std::string> nonces;  // of each member's latest FitInstruction
  std::map<std::string, int> fits_sent;       // instructions (with the model) sent to each member
  double weighted_loss = 0;
  int64_t weight_cap = 0;       // largest FedAvg weight of a result (max_weight_ratio)
  std::string first_rejection;  // why the first refused result was refused
  // The participation record (participation.jsonl, operator-only): each member that left the
  // round without contributing, with its outcome ("dropped", "declined", "failed", "refused")
  // and why.
  std::map<std::string, std::pair<std::string, std::string>> outcomes;
  RoundMetrics metrics;
  PrivateRound privacy;                 // under DP (RoundPrivacy::Configure)
  uint64_t client_seed = 0;             // fit.seed of the round's instructions
  std::unique_ptr<SecureRound> secure;  // secure aggregation on (and the cohort large enough)
  // An asynchronous secure session's staleness factor s(tau) (secure_session.h): its released
  // mean is scaled by it. 1 otherwise.
  double discount = 1;
};

// The operator-only participation record, one line per round in OUT/participation.jsonl:
// {"round", "time", "sampled": [ids], "contributed": [ids], "left": {id: {"outcome", "why"}}},
// `time` ISO-8601 UTC. Under DP it names the cohort, which the accounting assumes secret: never
// publish it.
inline constexpr char kParticipationFile[] = "participation.jsonl";
std::string ParticipationJson(const Round& round, const std::string& time);

// The largest FedAvg weight of one result: `ratio` times the median of `claims` (the example
// counts clients claimed when joining: a minority of liars cannot move it), within
// [1, max_weight]; max_weight when ratio <= 0 or there are no claims.
int64_t MedianWeightCap(std::vector<uint64_t> claims, double ratio, int64_t max_weight);

// What the synchronous round asks of the coordinator.
class SyncRoundHost {
 public:
  virtual ~SyncRoundHost() = default;
  // A message for a round that is not open: counted as stale (in the open round's metrics, or in
  // the next round's).
  virtual void CountStale() = 0;
  // A warning about `source`, logged at once or summarised per kind (`what`, plural).
  virtual void Warn(const std::string& what, const std::string& source,
                    const std::function<std::string()>& detail) = 0;
  // An Error answering `peer`'s message of `round`.
  virtual void Refuse(const transport::PeerId& peer, wire::ErrorCode code, const std::string& text,
                      uint64_t round) = 0;
};

// What a round's scheduler borrows (SyncRound here, AsyncRound in async_round.h). Every pointer
// must outlive the scheduler.
struct SchedulerParts {
  const CoordinatorOptions* options = nullptr;
  transport::ServerTransport* transport = nullptr;
  const Clock* clock = nullptr;
  const Population* population = nullptr;
  UploadSlots* slots = nullptr;
  aggregation::StreamingAggregator* aggregator = nullptr;
  const RoundPrivacy* privacy = nullptr;  // SyncRound: the round's DP settings and update check
  ModelLayout layout;
  SyncRoundHost* host = nullptr;
  Rng* rng = nullptr;  // AsyncRound: the job's stream (who is drawn, each task's training seed)
  // AsyncRound under DP with private noise: who is drawn and each task's training seed, from the
  // OS CSPRNG instead of `rng` (RoundPrivacy::sampler). nullptr otherwise.
  privacy::NoiseSource* sampler = nullptr;
  // AsyncRound under DP: the participation bound (contributions.h). nullptr otherwise.
  Contributions* contributions = nullptr;
};

// Both schedulers' borrowed parts, and their one norm-bounded fold of a plain FedAvg result.
class SchedulerBase {
 protected:
  explicit SchedulerBase(SchedulerParts parts);

  // Without DP: the result `spans` (in layout order) clipped to the norm bound of round (or
  // step) `number` when longer (UpdateNormBound: scaled down, not refused, so that one bad step
  // cannot lock honest clients out), then folded with `weight` and `discount`
  // (StreamingAggregator::Fold). True when it was clipped.
  StatusOr<bool> FoldBounded(std::vector<std::span<const float>> spans, uint64_t number,
                             int64_t weight, double discount);
  // Under client-level DP: the result checked against `round`'s bound (RoundPrivacy::CheckUpdate)
  // and folded with weight 1 (weighting by examples would break the sensitivity bound) and
  // `discount` (<= 1: the sensitivity stays C); its within-clip bit counted.
  Status FoldPrivate(PrivateRound& round, std::span<const std::span<const float>> spans,
                     bool within_clip, double discount);
  bool dp() const { return privacy_->enabled(); }

  const CoordinatorOptions* options_;
  transport::ServerTransport* transport_;
  const Clock* clock_;
  const Population* population_;
  UploadSlots* slots_;
  aggregation::StreamingAggregator* aggregator_;
  const RoundPrivacy* privacy_;
  ModelLayout layout_;
  SyncRoundHost* host_;
  Rng* rng_;
  privacy::NoiseSource* sampler_;
  Contributions* contributions_;

 private:
  TensorList clip_scratch_;  // a result clipped to the bound (reused; empty until needed)
  // Without DP: the norm each FedAvg update is clipped to (fixed, automatic or off).
  UpdateNormBound norm_bound_;
};

class SyncRound : private SchedulerBase {
 public:
  using Parts = SchedulerParts;
  explicit SyncRound(Parts parts);

  // `round` (sampled, its members kTraining) is open from now on, for the global model
  // `model_version`, until End(). `round` must outlive End().
  void Begin(Round* round, uint64_t model_version);
  void End() { round_ = nullptr; }

  // Without DP: the round's cap on a result's weight, from the cohort's claimed example counts.
  int64_t WeightCap() const;
  // Sends member `id` its FitInstruction with the round's model (a failed send fails it).
  void SendFit(const std::string& id);
  // The plain round's step: false once every member is done or failed, or the deadline passed
  // (the open ones then fail); else `wait_ms` until the deadline.
  bool Step(int64_t* wait_ms);

  void OnUploadRequest(const std::string& id, const wire::Message& msg);
  void OnFitResult(const std::string& id, const wire::Message& msg);
  // A client's Error answering its instruction: it declined the round or its training failed.
  void OnClientError(const std::string& id, const wire::Message& msg);
  // Member `id` leaves the round (a no-op when it is done or failed, or no round is open): its slot
  // goes to the next in line.
  void FailMember(const std::string& id, const char* why);
  // Grants free upload slots to the members waiting for one, in request order.
  void GrantSlots();
  // Members gone silent (client_timeout) fail; so do those holding a grant past upload_timeout.
  void ExpireSilentClients();
  void RevokeStaleGrants();

 private:
  Status FoldResult(const std::string& id, const wire::Message& msg, const wire::FitResult& result,
                    int64_t* weight);

  Round* round_ = nullptr;  // the open round (nullptr between rounds)
  uint64_t model_version_ = 0;
};

}  // namespace huddle::coordinator
