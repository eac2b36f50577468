// The secure aggregation of one round (aggregation/secagg/protocol.h; docs/protocol.md): the
// protocol's server side, driven through the round's members from the sampled cohort to the
// released sum, which is the survivors' (weighted) updates decoded exactly as they rounded them.
//
// Owns: the session (secagg::Server) and its restarts, the cohort's indices and member-list
// positions, the quantization plan (bits, scale, noise share), the stage and its deadline, the
// members a stage awaits, the decoded sum and its weight, why it released nothing, the round's
// distributed-DP ledger entry, and the session's metrics.
// Borrows: the round's member table (member_state.h), in which it moves members between kTraining,
// kSecAgg, kSecAggMasking and kDone; the set of clients found lying (job-long: it adds to it); and
// its host, the scheduler running the round, for everything that leaves the session: messages,
// fit instructions, failing a member, the ledger. It never touches the population, upload slots,
// the aggregator or the model.
//
// States (the stage), each ended by Step():
//   0. Start(): the cohort (sorted ids: cohort index = position) gets a session planned for it
//      (threshold, graph, minimum survivors, word width, scale and, for distributed DP, each
//      member's noise share: aggregation/secagg/quantize.h), sent in each FitInstruction
//      (Instruction()). Members train, then advertise their keys. The stage ends when no member is
//      still training, or at the training deadline.
//   1. Every advertiser gets the member list, each member with its certificate (the one the
//      project key gave it, from SecureAggregationOptions::certificates), and reveals its
//      randomness, signed. A member that did not reveal blocks the graph: the session starts
//      again (a new session id, a new FitInstruction) with those that did, up to 3 times.
//   2. Every member gets every reveal (one list, encoded once) and sends its sealed shares.
//   3. Each gets the records its neighbours sealed to it and answers with its complaints.
//   4. The members whose secrets enough others hold (U2) get U2, mask their input and ask for an
//      upload slot (the host grants it); their masked words (SecAggMaskedInput, one uint32/uint64
//      tensor per model tensor, then the weight word) are added to the sum as they arrive,
//      O(model) memory, each upload timed from its grant (OnUploadGranted).
//   5. Each survivor gets U2 and S and signs them (the consistency round).
//   6. Under distributed DP the release is accounted now (SecureRoundHost::Account), before any
//      unmasking share is asked for; each survivor gets the signatures and answers with its
//      shares; the server rebuilds the secrets, removes the masks, and the sum is decoded.
//   7. Over: sum() holds the release, or failure() says why there is none.
//
// Stages 1-6 each end when every member due answered or stage_timeout passed. A member that fails
// at any point (silence, an error, a refused message, one of a type no client may send) is a
// dropout, no longer awaited (the host calls OnMemberFailed): its stage ends as soon as the others
// due have answered. One found lying is named in the metrics and added to the excluded set; the
// round completes while the protocol's minimum and threshold hold, and otherwise releases nothing.
// Every refusal names the client and what is wrong.
//
// Thread-safety: none; the round loop's thread only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/secagg/protocol.h"
#include "aggregation/secagg/quantize.h"
#include "aggregation/secagg/wire.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/tensor.h"
#include "coordinator/member_state.h"
#include "coordinator/options.h"
#include "coordinator/round_metrics.h"
#include "privacy/budget.h"
#include "privacy/ledger.h"
#include "proto/messages.h"

namespace huddle::coordinator {

// What a secure round asks of the scheduler that runs it.
class SecureRoundHost {
 public:
  virtual ~SecureRoundHost() = default;
  // Sends `msg` to member `id`: NotFound when it has left the federation (its key was revoked),
  // another error when it is unreachable.
  virtual Status SendToMember(const std::string& id, const wire::Message& msg) = 0;
  // Member `id` leaves the round (a no-op when it is done or failed); the host then calls
  // SecureRound::OnMemberFailed.
  virtual void FailMember(const std::string& id, const char* why) = 0;
  // Sends member `id` a FitInstruction with the round's model and Instruction(id) (a restarted
  // session), by at least `deadline_ms` (the training stage's new deadline).
  virtual void SendFit(const std::string& id, int64_t deadline_ms) = 0;
  // Distributed DP: the spend `entry` would take the job to, and whether that is past its budget.
  virtual StatusOr<std::pair<privacy::Spend, bool>> WouldSpend(
      const privacy::LedgerEntry& entry) = 0;
  // Distributed DP: records the release durably, before any unmasking share is asked for.
  virtual Status Account(const privacy::LedgerEntry& entry) = 0;
};

// The round's settings a session is planned from.
struct SecureRoundSettings {
  uint64_t round = 0;
  int64_t deadline_ms = 0;  // training's (stage 0)
  std::string job_name;     // in the ledger entry
  const SecureAggregationOptions* options = nullptr;
  ModelLayout layout;
  int64_t quorum = 1;  // the fewest survivors the job accepts (1 under DP)
  // Client-level DP: none, local (each value carries its client's noise) or distributed (the
  // members' noise shares carry the sum's).
  bool dp = false;
  bool distributed = false;
  double clip_norm = 0;  // C every member's update is clipped to (max_update_norm without DP)
  double noise_multiplier = 0;  // z accounted for the round (under DP)
  int64_t weight_cap = 0;       // FedAvg: the largest weight (without DP, weight_by_examples)
  // > 0: the training stage ends as soon as this many members have trained (advertised their
  // keys); those still training are dropped from the session (an over-selected asynchronous
  // session, secure_session.h). 0: it waits for every member, until the deadline.
  int64_t enough = 0;
};

class SecureRound {
 public:
  // The round's session for `cohort` (sorted ids), or nullptr when the cohort is too small to hide
  // anyone (fewer than 2, or too few honest noise shares): the round then trains nothing. An error
  // when the settings admit no session (named with the round), or under distributed DP when the
  // members' shares would take the job past its budget. `members`, `excluded`, `host` and `clock`
  // must outlive the session.
  static StatusOr<std::unique_ptr<SecureRound>> Start(SecureRoundSettings settings,
                                                      const std::vector<std::string>& cohort,
                                                      RoundMembers* members,
                                                      std::set<std::string>* excluded,
                                                      SecureRoundHost* host, const Clock* clock);

  // Ends the current stage when every member due answered or its deadline passed, and sends the
  // next stage's messages: false once the protocol is over (released or refused).
  bool Step();
  // How long the loop may wait for messages before the current stage's deadline.
  int64_t TimeoutMs() const;

  // A member's SecAggData, or its masked input (SecAggMaskedInput, under its upload grant: on OK
  // the host releases the slot). `nonce`: of the member's latest FitInstruction; `model_version`:
  // the round's. An error names what is wrong; the host refuses the message and fails the member.
  Status OnMessage(const std::string& id, const wire::Message& msg, const std::string& nonce,
                   uint64_t model_version);
  // Member `id` failed: no stage awaits it any more.
  void OnMemberFailed(const std::string& id) { awaiting_.erase(id); }
  // Whether a stage awaits an answer from member `id` in `state` (a SecAggData, or in stage 4 its
  // upload request or masked input). A member still training is waited for as in a round without
  // secure aggregation, until the training deadline.
  bool Awaits(const std::string& id, MemberState state) const;

  // The fields of member `id`'s FitInstruction.
  wire::SecureAggregation Instruction(const std::string& id) const;
  // The bytes of one masked input (for the transport's allowance).
  size_t UploadBytes() const;
  // Member `id` was granted its upload slot now (by the host's scheduler): once its masked input
  // is accepted, the seconds since (the session's clock) are appended to `*upload_seconds`, the
  // round's operator-only upload durations (RoundMetrics::upload_seconds), which must outlive the
  // session.
  void OnUploadGranted(const std::string& id, std::vector<double>* upload_seconds);
  // Over and released: the survivors' decoded (weighted) sum; nullopt otherwise.
  const std::optional<TensorList>& sum() const { return sum_; }
  // The released sum as the survivors' FedAvg mean (weighted: cap x sum / sum of weights;
  // uniform: the sum over the survivors).
  Status Mean(TensorList* mean) const;
  // The members whose input the sum holds, and its weights' total (-1: uniform weights, the
  // coordinator knows no example count). Meaningful once released.
  int64_t survivors() const;
  int64_t examples() const;
  const std::string& failure() const { return failure_; }
  // The session's settings, counts and blames as of the latest stage change.
  const RoundMetrics::SecureAggregation& metrics() const { return metrics_; }

  // Distributed DP: the round's ledger entry (the sum's noise multiplier, tau and dimension), and
  // whether it is in the ledger (appended before unmasking).
  const std::optional<privacy::LedgerEntry>& distributed() const { return distributed_; }
  bool accounted() const { return accounted_; }
  // Distributed DP: the std of the noise the honest shares guarantee in the sum, per value, in the
  // model's units.
  double SumNoiseStddev() const;

 private:
  SecureRound(SecureRoundSettings settings, RoundMembers* members, std::set<std::string>* excluded,
              SecureRoundHost* host, const Clock* clock);

  // A SecAggData from member `id` (its stage's message decoded and handed to the server).
  Status OnData(const std::string& id, const wire::Message& msg, const std::string& nonce);
  Status OnMaskedInput(const std::string& id, const wire::Message& msg, const std::string& nonce,
                       uint64_t model_version);
  // Member `id`'s masked input was accepted: its upload's duration, since its grant.
  void UploadReceived(const std::string& id);
  // Ends the session with `why`: nothing is released; members still in it fail. False.
  bool Refuse(const Status& why);
  // Starts the session again, with a new session id, for the members that revealed their
  // randomness: they get a new FitInstruction and mask the update they trained. False (refused)
  // when no restart is left or too few members remain.
  bool Restart(const Status& why);
  // Sends the same encoded bytes of `stage` to each member in `ids` (a failed send fails it).
  void Broadcast(aggregation::secagg::Stage stage, std::shared_ptr<const std::string> bytes,
                 const std::vector<std::string>& ids);
  // Stage 5 under distributed DP: the entry by the count the members make now, into the ledger.
  Status AccountRelease();
  // Stage 6: the unmasked words decoded and checked into sum_.
  bool Release(const std::vector<uint64_t>& words);
  // DataLoss when the unmasked sum is longer than its survivors' clipped inputs (and noise) can
  // make: some member's input was out of range.
  Status CheckSum(const TensorList& sum) const;
  std::vector<std::string> InState(std::initializer_list<MemberState> states) const;
  // The session's settings, counts and blames into metrics_; blamed members into the excluded set.
  void Record();

  SecureRoundSettings settings_;
  RoundMembers* members_;
  std::set<std::string>* excluded_;
  SecureRoundHost* host_;
  const Clock* clock_;

  std::optional<aggregation::secagg::Server> server_;
  std::vector<std::string> ids_;              // cohort index -> client id (the sorted cohort)
  std::map<std::string, uint32_t> index_;     // client id -> cohort index
  std::vector<std::string> listed_;           // member-list position -> client id
  std::map<std::string, uint32_t> position_;  // client id -> member-list position
  aggregation::secagg::QuantizePlan plan_;
  uint64_t weight_cap_ = 0;  // 0: uniform weights, no weight word
  int stage_ = 0;
  int64_t stage_deadline_ms_ = 0;
  int restarts_ = 0;
  std::set<std::string> awaiting_;  // members whose answer to the current stage is due
  std::optional<TensorList> sum_;
  uint64_t total_weight_ = 0;  // the weight word's sum (weighted rounds)
  std::string failure_;        // why it released nothing ("" when it did)
  // Distributed DP: the fewest honest members whose noise shares an unmasked sum holds (by the
  // coordinator's count, graph.h's HonestShares), and the round's ledger entry.
  int64_t noise_members_ = 0;
  std::optional<privacy::LedgerEntry> distributed_;
  bool accounted_ = false;
  RoundMetrics::SecureAggregation metrics_;
  // Stage 4: when each member granted an upload slot got it, until its masked input arrives; where
  // the durations go (OnUploadGranted).
  std::map<std::string, int64_t> upload_granted_ms_;
  std::vector<double>* upload_seconds_ = nullptr;
  // A masked input's words, gathered from its tensors (64-bit sessions; 32-bit ones).
  std::vector<uint64_t> scratch64_;
  std::vector<uint32_t> scratch32_;
};

}  // namespace huddle::coordinator
