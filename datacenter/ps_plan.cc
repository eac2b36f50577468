#include "datacenter/ps_plan.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace huddle::datacenter {

std::vector<ShardRange> PlanShards(int64_t total, int servers) {
  std::vector<ShardRange> shards;
  for (int k = 0; k < servers; ++k) {
    const int64_t begin = total * k / servers;
    const int64_t end = total * (k + 1) / servers;
    shards.push_back(ShardRange{begin, end - begin});
  }
  return shards;
}

StatusOr<Dispatcher> Dispatcher::Create(const DispatcherOptions& o, int64_t now_ms) {
  if (o.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the parameter-server mode needs at least one worker; it has ", o.workers));
  }
  if (o.batches_per_epoch < 1 || o.epochs < 1 || o.first_epoch < 0 || o.first_version < 0) {
    return absl::InvalidArgumentError("dispatcher: batches, epochs and the start must be positive");
  }
  if (o.async && o.backup_workers != 0) {
    return absl::InvalidArgumentError("backup_workers is for mode sync");
  }
  if (o.backup_workers < 0 || o.backup_workers >= o.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup_workers is ", o.backup_workers, " with ", o.workers,
                     " workers; it must be below the workers (a step takes workers - "
                     "backup_workers gradients)"));
  }
  if (o.staleness_bound && (*o.staleness_bound < 0 || !o.async)) {
    return absl::InvalidArgumentError("staleness_bound must be >= 0, in mode async");
  }
  if (o.timeout_ms < 1) return absl::InvalidArgumentError("dispatcher: timeout_ms must be >= 1");
  return Dispatcher(o, now_ms);
}

Dispatcher::Dispatcher(const DispatcherOptions& o, int64_t now_ms)
    : options_(o), epoch_(o.first_epoch), version_(o.first_version) {
  const auto n = static_cast<size_t>(o.workers);
  clock_.assign(n, 0);
  last_heard_ms_.assign(n, now_ms);
  gated_since_ms_.assign(n, std::nullopt);
  dead_.assign(n, false);
  if (!finished()) StartEpoch();
}

void Dispatcher::StartEpoch() {
  const auto b = static_cast<size_t>(options_.batches_per_epoch);
  owner_.assign(b, -1);
  done_.assign(b, false);
  done_count_ = 0;
  epoch_complete_ = false;
  free_.clear();
  if (options_.async) {
    for (int64_t k = 0; k < options_.batches_per_epoch; ++k) free_.push_back(k);
  } else {
    next_batch_ = 0;
    OpenStep();
  }
}

void Dispatcher::OpenStep() {
  const int64_t k = std::min(options_.workers, options_.batches_per_epoch - next_batch_);
  step_batches_.clear();
  free_.clear();
  for (int64_t i = 0; i < k; ++i) {
    step_batches_.push_back(next_batch_ + i);
    free_.push_back(next_batch_ + i);
  }
  next_batch_ += k;
  step_need_ = std::min(options_.workers - options_.backup_workers, k);
  step_done_ = 0;
}

void Dispatcher::AdvanceEpoch() {
  if (!epoch_complete_) return;
  epoch_complete_ = false;
  ++epoch_;
  if (!finished()) StartEpoch();
}

int64_t Dispatcher::live_workers() const {
  return static_cast<int64_t>(std::count(dead_.begin(), dead_.end(), false));
}

int64_t Dispatcher::MinLiveClock() const {
  int64_t lowest = std::numeric_limits<int64_t>::max();
  for (size_t w = 0; w < clock_.size(); ++w) {
    if (!dead_[w]) lowest = std::min(lowest, clock_[w]);
  }
  return lowest;
}

void Dispatcher::Heard(int64_t w, int64_t now_ms) {
  if (w >= 0 && w < options_.workers) last_heard_ms_[static_cast<size_t>(w)] = now_ms;
}

Task Dispatcher::Next(int64_t w, int64_t now_ms) {
  Task t;
  if (w < 0 || w >= options_.workers) {
    t.kind = Task::Kind::kExcluded;
    return t;
  }
  const auto i = static_cast<size_t>(w);
  if (dead_[i]) {
    t.kind = Task::Kind::kExcluded;
    return t;
  }
  last_heard_ms_[i] = now_ms;
  if (finished()) {
    t.kind = Task::Kind::kFinished;
    return t;
  }
  if (epoch_complete_ || free_.empty()) return t;  // the epoch barrier, or the step is handed out
  if (options_.async && options_.staleness_bound &&
      clock_[i] > MinLiveClock() + *options_.staleness_bound) {
    if (!gated_since_ms_[i]) {
      gated_since_ms_[i] = now_ms;
      ++ssp_waits_;
    }
    t.gated = true;
    return t;
  }
  if (gated_since_ms_[i]) {
    ssp_wait_ms_ += now_ms - *gated_since_ms_[i];
    gated_since_ms_[i].reset();
  }
  const int64_t batch = free_.front();
  free_.pop_front();
  owner_[static_cast<size_t>(batch)] = w;
  t.kind = Task::Kind::kRun;
  t.epoch = epoch_;
  t.batch = batch;
  if (!options_.async) {
    t.version = version_;
    t.need = step_need_;
  }
  return t;
}

bool Dispatcher::Done(int64_t w, int64_t epoch, int64_t batch, int64_t version, int64_t now_ms) {
  if (w < 0 || w >= options_.workers) return false;
  const auto i = static_cast<size_t>(w);
  last_heard_ms_[i] = now_ms;
  ++clock_[i];  // a step completed, counted or not
  if (epoch != epoch_ || batch < 0 || batch >= options_.batches_per_epoch || finished()) {
    return false;
  }
  const auto b = static_cast<size_t>(batch);
  if (owner_[b] != w || done_[b]) return false;  // re-queued meanwhile, or reported twice
  if (!options_.async) {
    if (version != version_) return false;  // a late gradient of a closed step
    done_[b] = true;
    ++done_count_;
    if (++step_done_ < step_need_) return true;
    // The step closes: its free batches (and those still out: backups) are not run.
    for (int64_t s : step_batches_) done_[static_cast<size_t>(s)] = true;
    ++version_;
    if (next_batch_ >= options_.batches_per_epoch) {
      epoch_complete_ = true;
      free_.clear();
    } else {
      OpenStep();
    }
    return true;
  }
  done_[b] = true;
  if (++done_count_ == options_.batches_per_epoch) epoch_complete_ = true;
  return true;
}

void Dispatcher::Requeue(int64_t w) {
  for (size_t b = owner_.size(); b-- > 0;) {
    if (owner_[b] != w || done_[b]) continue;
    owner_[b] = -1;
    free_.push_front(static_cast<int64_t>(b));
    ++requeued_;
  }
}

std::vector<int64_t> Dispatcher::CheckLiveness(int64_t now_ms) {
  std::vector<int64_t> newly;
  for (size_t w = 0; w < dead_.size(); ++w) {
    if (dead_[w] || now_ms - last_heard_ms_[w] <= options_.timeout_ms) continue;
    dead_[w] = true;
    gated_since_ms_[w].reset();
    dead_order_.push_back(static_cast<int64_t>(w));
    newly.push_back(static_cast<int64_t>(w));
    if (!finished()) Requeue(static_cast<int64_t>(w));
  }
  return newly;
}

}  // namespace huddle::datacenter
