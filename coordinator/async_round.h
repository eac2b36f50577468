// The buffered asynchronous scheduler (FedBuff, Nguyen et al., AISTATS 2022): the second
// scheduler beside the synchronous round (sync_round.h), chosen by `async:` (AsyncOptions).
//
// Instead of lock-step rounds, `concurrency` clients train at all times. A task is one client's
// local training on the model version it was sent; each result is checked as in a synchronous
// round (its instruction's round, model version and nonce; shapes; finite values, the norm bound;
// the weight cap) and folded into the aggregator as it arrives, scaled by s(staleness), where the
// staleness is the number of server steps taken since its model was sent; a result staler than
// max_staleness is refused. The aggregator is the only buffer: memory stays O(model) whatever K
// (the results are never stored), and a flush is one server step on its weighted mean
// (sum_k n_k s_k delta_k / sum_k n_k). The coordinator runs the flushes (Coordinator::RunFlush):
// Open a flush, TopUp and pump until Full (or Starved), Close, release, step, evaluate, checkpoint.
//
// Rules:
//  - A client has at most one task at a time, and at most one per model version: a client that
//    finished is not sent the same model again (it would train on nothing new; the next server
//    step makes it eligible again). So one flush holds at most one result per client and version.
//    The exception: when a step has no result and nothing can be sent, the clients whose task on
//    this version failed are sent it again (AllowRetries; the coordinator allows this
//    max_rounds_without_update times a step, as many rounds in a row as a synchronous job may
//    fail).
//  - Clients are drawn uniformly from the idle eligible ones (live, not excluded) by the job's
//    seeded stream; under DP with private noise by the OS CSPRNG (as are the tasks' seeds).
//  - Under client-level DP (RoundPrivacy, with privacy.max_participations: contributions.h) a
//    client is eligible only while the participation bound allows it, each result is checked
//    against the step's clip norm and folded with weight 1 (discounted by its staleness, so its
//    sensitivity stays C), and the step's noised sum is divided by `buffer` (RoundPrivacy).
//  - A task ends with its result folded or refused, its client's Error (declined, training
//    failed), silence (client_timeout), a grant unused for upload_timeout, or its deadline
//    (round.deadline_s after dispatch); its client is then idle again.
//  - Once the flush is full, and between Close and the next Open (the step, its evaluation, the
//    checkpoint), no upload slot is granted; a result whose upload was granted before and arrives
//    then is kept and folded when the next flush opens (at most upload_slots of them: each held
//    a slot).
//
// Borrows what the synchronous round borrows (options, transport, clock, population, upload
// slots, aggregator) and reports to the same host (SyncRoundHost); it never touches the model,
// the ledger or the checkpoint.
//
// Thread-safety: none; the round loop's thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/streaming_aggregator.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/tensor.h"
#include "coordinator/member_state.h"
#include "coordinator/options.h"
#include "coordinator/population.h"
#include "coordinator/sync_round.h"
#include "coordinator/update_check.h"
#include "coordinator/upload_slots.h"
#include "proto/messages.h"
#include "transport/transport.h"

namespace huddle::coordinator {

class AsyncRound : private SchedulerBase {
 public:
  using Parts = SchedulerParts;  // with `rng`; under DP `privacy`, `contributions`, `sampler`
  explicit AsyncRound(Parts parts);

  // Flush `flush` (its number set; the aggregator empty) is open from now on, for the global
  // model `global` of version `model_version`, until Close(). Results kept while no flush was
  // open are folded now. `flush` must outlive Close().
  void Open(Round* flush, uint64_t model_version, std::shared_ptr<const TensorList> global);
  // The open flush closes: its metrics' async section is filled in; tasks go on training.
  void Close();

  // Dispatches tasks to idle eligible clients (drawn uniformly; not in `excluded`) until
  // `concurrency` are in flight or none is eligible.
  void TopUp(const std::set<std::string>& excluded);
  // The open flush holds `buffer` results.
  bool Full() const;
  // No task is in flight and no client could be sent one: the open flush cannot grow until a
  // client joins (or, when every live client already trained on this version, ever).
  bool Starved(const std::set<std::string>& excluded) const;
  int64_t in_flight() const { return static_cast<int64_t>(tasks_.size()); }
  // Under DP, with no task in flight: every live client has contributed max_participations times
  // (`ever`: the job has done all that its participation bound allows), or may not contribute to
  // the open step (!ever: also those within min_separation of their last contribution).
  bool Bounded(const std::set<std::string>& excluded, bool ever) const;
  // Clients whose task on the current model version ended without a result (failed, declined,
  // refused, silent, late) may be sent it again: for a step that is starved with no result at
  // all, so that a passing failure of every client does not stall the job. True when any became
  // eligible.
  bool AllowRetries();
  // Milliseconds until the earliest task deadline (at most `cap`).
  int64_t WaitMs(int64_t cap) const;
  // Tasks past their deadline, members gone silent and grants unused for upload_timeout fail.
  void Expire();

  void OnUploadRequest(const std::string& id, const wire::Message& msg);
  void OnFitResult(const std::string& id, const wire::Message& msg);
  void OnClientError(const std::string& id, const wire::Message& msg);
  // `id`'s task ends without a result (a no-op when it has none).
  void FailMember(const std::string& id, const char* why);
  // Whether `id` is uploading a result (a malformed message from it then ends its task).
  bool Uploading(const std::string& id) const;

 private:
  struct Task {
    uint64_t round = 0;          // the flush open when it was dispatched: its messages' round
    uint64_t model_version = 0;  // of the model it was sent
    std::string nonce;
    MemberState state = MemberState::kTraining;  // kTraining, kWaitingSlot or kUploading
    int64_t deadline_ms = 0;
  };
  void SendTask(const std::string& id);
  void GrantSlots();
  // Folds a result (checked against its task); staleness and weight out.
  Status FoldResult(const std::string& id, const Task& task, const wire::Message& msg,
                    uint64_t* staleness, double* discount, int64_t* weight);
  void Accept(const std::string& id, const Task& task, const wire::Message& msg);
  // `id`'s task on model `task_version` ended without a result: recorded in the open flush (or
  // the next one).
  void EndTask(const std::string& id, uint64_t task_version, const std::string& outcome,
               const std::string& why);
  int64_t WeightCap() const;
  bool Eligible(const std::string& id, const std::set<std::string>& excluded) const;

  Round* flush_ = nullptr;  // the open flush (nullptr between Close and Open)
  uint64_t model_version_ = 0;
  std::shared_ptr<const TensorList> global_;
  int64_t weight_cap_ = 0;
  std::map<std::string, Task> tasks_;  // in flight, by client
  // Each client's newest task's model version: one task per client and version.
  std::map<std::string, uint64_t> last_version_;
  // Clients whose task on the current version ended without a result (AllowRetries).
  std::set<std::string> failed_on_version_;
  // Results whose upload was granted before Close, arrived while no flush was open.
  std::vector<std::pair<std::string, wire::Message>> kept_;
  // Outcomes of tasks that ended while no flush was open: recorded into the next.
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> ended_between_;
  uint64_t tasks_sent_ = 0;  // this run: each task's training seed stream
  // The open flush's staleness statistics.
  double staleness_sum_ = 0;
  double discount_sum_ = 0;
  int64_t staleness_max_ = 0;
  int64_t refused_stale_ = 0;
};

}  // namespace huddle::coordinator
