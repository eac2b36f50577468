// The parameter-server mode's bookkeeping, without sockets (docs/datacenter.md, "Parameter-server
// mode"): how the flat parameter vector is cut into shards, and the Dispatcher that server 0 runs
// to hand out batches to the workers.
//
// The flat parameter vector is the model's trainable tensors concatenated in layout order.
// PlanShards cuts it into contiguous, balanced ranges, one per server.
//
// The Dispatcher owns the task queue of every epoch: the epoch's batches (batch k is rows
// [k B, min((k + 1) B, n)) of the epoch's shuffled order, the order of the all-reduce mode), who
// holds which, and which are done. An epoch ends only when all of its batches are done (an epoch
// barrier: the snapshot that is evaluated and checkpointed then has nothing in flight); the caller
// reports it and calls AdvanceEpoch.
//   - async: any free batch goes to any worker that asks, unless the SSP gate holds it: a worker
//     that completed c steps may start another only while c <= (the fewest steps completed by a
//     live worker) + staleness_bound.
//   - sync: step v is a set of (workers + backups) batches, or what is left of the epoch; each
//     worker that asks gets one of its free batches, tagged with version v and `need`, the number
//     of gradients the shards take for v (min(workers - backups, batches of the step)); the step
//     closes when `need` of its batches are done (pushed to every shard). Late ones are dropped by
//     the shards.
//   - liveness: a worker silent for timeout_ms is dead: its batches not done go back to the front
//     of the queue (or the step's free set) for the others, and it gets no more work.
// Times are passed in (now_ms) so that tests drive them.
//
// Thread-safety: none (server 0's loop).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "common/status.h"

namespace huddle::datacenter {

struct ShardRange {
  int64_t begin = 0;  // floats from the start of the flat parameter vector
  int64_t count = 0;
};

// Server k's range [total k / servers, total (k + 1) / servers): contiguous, in order, sizes that
// differ by at most one. Precondition: 1 <= servers <= total.
std::vector<ShardRange> PlanShards(int64_t total, int servers);

struct DispatcherOptions {
  int64_t workers = 1;            // worker ranks
  int64_t batches_per_epoch = 1;  // ceil(n / batch_size)
  int64_t epochs = 1;
  int64_t first_epoch = 0;    // a resume's epochs_done
  int64_t first_version = 0;  // sync: the version of the first step (a resume's steps)
  bool async = true;
  std::optional<int64_t> staleness_bound;  // async only; none: unbounded
  int64_t backup_workers = 0;              // sync only
  int64_t timeout_ms = 60000;              // a worker silent this long is dead
};

// What a worker is told to do.
struct Task {
  enum class Kind { kRun, kWait, kFinished, kExcluded };
  Kind kind = Kind::kWait;
  int64_t epoch = 0, batch = 0;
  int64_t version = 0, need = 0;  // sync: the step's version and the gradients it takes
  bool gated = false;             // kWait because of the SSP gate
};

class Dispatcher {
 public:
  // InvalidArgument naming the option when they cannot work (no workers, backups >= workers...).
  static StatusOr<Dispatcher> Create(const DispatcherOptions& options, int64_t now_ms);

  // Worker `w` asks for work (and is heard).
  Task Next(int64_t w, int64_t now_ms);
  // Worker `w` pushed batch (epoch, batch) of `version` (sync) to every shard. True when this
  // completes the batch (the first report of a batch `w` holds); false for a late or stale one.
  bool Done(int64_t w, int64_t epoch, int64_t batch, int64_t version, int64_t now_ms);
  // Worker `w` was heard from (any message).
  void Heard(int64_t w, int64_t now_ms);
  // Declares workers silent for timeout_ms dead and re-queues their batches; returns them.
  std::vector<int64_t> CheckLiveness(int64_t now_ms);

  // Every batch of the current epoch is done: report it, then AdvanceEpoch.
  bool epoch_complete() const { return epoch_complete_; }
  void AdvanceEpoch();
  bool finished() const { return epoch_ >= options_.epochs; }
  int64_t epoch() const { return epoch_; }
  int64_t version() const { return version_; }  // sync: the open step's
  int64_t live_workers() const;
  const std::vector<int64_t>& dead() const { return dead_order_; }
  int64_t clock(int64_t w) const { return clock_[static_cast<size_t>(w)]; }
  int64_t ssp_waits() const { return ssp_waits_; }
  double ssp_wait_seconds() const { return static_cast<double>(ssp_wait_ms_) / 1000.0; }
  int64_t requeued() const { return requeued_; }

 private:
  explicit Dispatcher(const DispatcherOptions& options, int64_t now_ms);
  void StartEpoch();
  void OpenStep();  // sync: the next set of batches of the epoch
  int64_t MinLiveClock() const;
  void Requeue(int64_t w);

  DispatcherOptions options_;
  int64_t epoch_ = 0;
  int64_t version_ = 0;
  bool epoch_complete_ = false;
  // The current epoch's batches: holder (-1: free), done.
  std::vector<int64_t> owner_;
  std::vector<bool> done_;
  int64_t done_count_ = 0;
  std::deque<int64_t> free_;  // async: the free batches; sync: the open step's
  // Sync: the next batch of the epoch not yet in a step, and the open step's need and progress.
  int64_t next_batch_ = 0;
  int64_t step_need_ = 0, step_done_ = 0;
  std::vector<int64_t> step_batches_;
  // Per worker.
  std::vector<int64_t> clock_, last_heard_ms_;
  std::vector<std::optional<int64_t>> gated_since_ms_;
  std::vector<bool> dead_;
  std::vector<int64_t> dead_order_;
  int64_t ssp_waits_ = 0, ssp_wait_ms_ = 0, requeued_ = 0;
};

}  // namespace huddle::datacenter
