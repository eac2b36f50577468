#include "datacenter/data_parallel.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "datacenter/internal/agreement.h"
#include "kernels/backend.h"
#include "kernels/flush_denormals.h"
// The training loop is the federated client's (models/trainer.h); this file adds the collectives:
// the gradient buckets' all-reduce, SyncBatchNorm's and DP-SGD's sums, agreement, replica checks.
#include "models/trainer.h"

namespace huddle::datacenter {
namespace {

using internal::CheckAgreement;
using internal::CheckReplicas;
using internal::ResumeHeader;
using internal::Scratch;
using internal::ShareResume;
using internal::ShareSamplingStream;
using internal::StopVote;

using SteadyTime = std::chrono::steady_clock;

double SecondsSince(SteadyTime::time_point start) {
  return std::chrono::duration<double>(SteadyTime::now() - start).count();
}

// A contiguous range of the packed gradient buffer holding parameters [lowest_param, ...).
struct Bucket {
  int64_t begin = 0;  // floats from grads_base()
  int64_t count = 0;
  size_t lowest_param = 0;
};

// Trainable parameters from the last to the first, cut into buckets of at least `first_bytes` (the
// first) and `bytes` (the others); a bucket always holds whole parameters.
std::vector<Bucket> PlanBuckets(const models::GradientLayout& layout, int64_t first_bytes,
                                int64_t bytes) {
  std::vector<Bucket> buckets;
  const auto kFloat = static_cast<int64_t>(sizeof(float));
  int64_t end = layout.span;
  int64_t filled = 0;
  for (size_t i = layout.sizes.size(); i-- > 0;) {
    filled += layout.sizes[i] * kFloat;
    const int64_t cap = buckets.empty() ? first_bytes : bytes;
    if (filled >= cap || i == 0) {
      const int64_t begin = layout.offsets[i];
      buckets.push_back(Bucket{begin, end - begin, i});
      end = begin;
      filled = 0;
    }
  }
  return buckets;
}

// All-reduces gradient buckets in the order they are handed over (the same on every rank): on a
// communication thread while the step's backward pass goes on, except the step's last buckets,
// which nothing is left to overlap with: those run on the training thread once the thread is idle
// (one wake-up less per step; with a single bucket, or without overlap, no hand-off at all).
class BucketReducer {
 public:
  // Prepares every bucket's all-reduce (collective: the same buckets in the same order on every
  // rank), then starts the communication thread.
  static StatusOr<std::unique_ptr<BucketReducer>> Create(Collective& collective,
                                                         models::Trainer& trainer,
                                                         std::vector<Bucket> buckets) {
    std::vector<std::unique_ptr<PreparedAllReduce>> prepared;
    for (const Bucket& b : buckets) {
      HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<PreparedAllReduce> p,
                              collective.PrepareAllReduceSum(trainer.gradients().subspan(
                                  static_cast<size_t>(b.begin), static_cast<size_t>(b.count))));
      prepared.push_back(std::move(p));
    }
    return std::unique_ptr<BucketReducer>(
        new BucketReducer(trainer, std::move(buckets), std::move(prepared)));
  }
  ~BucketReducer() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }

  const std::vector<Bucket>& buckets() const { return buckets_; }

  void StartStep() { next_ = 0; }

  // Layer l's gradients are enqueued: hand over every bucket whose parameters are all done.
  void LayerDone(size_t layer) {
    size_t first_ready = next_;
    while (next_ < buckets_.size() &&
           buckets_[next_].lowest_param >= trainer_.layout().first_param[layer]) {
      ++next_;
    }
    if (next_ == first_ready) return;
    // A GPU computes asynchronously: the gradients must be there before another stream reads them.
    if (trainer_.backend().kind() != kernels::DeviceKind::kCpu) {
      if (Status s = trainer_.backend().Synchronize(); !s.ok()) {
        absl::MutexLock lock(&mu_);
        if (error_.ok()) error_ = s;
      }
    }
    if (next_ == buckets_.size()) {
      // The step's last buckets: after the queued ones, here.
      absl::MutexLock lock(&mu_);
      const auto start = SteadyTime::now();
      WaitForQueue();
      wait_seconds_ += SecondsSince(start);
      for (size_t b = first_ready; b < next_; ++b) Reduce(b);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      for (size_t b = first_ready; b < next_; ++b) queue_.push_back(b);
    }
    cv_.SignalAll();
  }

  // Waits for every bucket of the step; the first error of any reduction.
  Status FinishStep(double* wait_seconds) {
    auto start = SteadyTime::now();
    absl::MutexLock lock(&mu_);
    WaitForQueue();
    *wait_seconds += SecondsSince(start) + wait_seconds_;
    wait_seconds_ = 0;
    return error_;
  }

  // Runs `op` (another collective operation of the step, e.g. SyncBatchNorm's) on the training
  // thread once the buckets handed over so far are reduced: one thread uses the collective at a
  // time, and every rank issues the operations in the same order. Its error stops the step.
  void RunInOrder(const std::function<Status()>& op) {
    absl::MutexLock lock(&mu_);
    const auto start = SteadyTime::now();
    WaitForQueue();
    wait_seconds_ += SecondsSince(start);
    if (!error_.ok()) return;
    mu_.Unlock();
    Status s = op();
    mu_.Lock();
    if (!s.ok() && error_.ok()) error_ = s;
  }

  double reduce_seconds() const {
    absl::MutexLock lock(&mu_);
    return reduce_seconds_;
  }
  int64_t bytes_reduced() const {
    absl::MutexLock lock(&mu_);
    return bytes_reduced_;
  }

 private:
  BucketReducer(models::Trainer& trainer, std::vector<Bucket> buckets,
                std::vector<std::unique_ptr<PreparedAllReduce>> prepared)
      : trainer_(trainer), buckets_(std::move(buckets)), prepared_(std::move(prepared)) {
    thread_ = std::thread([this] { Loop(); });
  }

  // Until the communication thread has reduced every bucket handed over.
  void WaitForQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!queue_.empty() || busy_) done_cv_.Wait(&mu_);
  }

  // All-reduces bucket b (unless an earlier reduction failed: a broken collective is drained
  // without reducing). Called with mu_ held; releases it during the reduction.
  void Reduce(size_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!error_.ok()) return;
    busy_ = true;
    mu_.Unlock();
    const auto start = SteadyTime::now();
    Status s = prepared_[b]->Run();
    const double took = SecondsSince(start);
    mu_.Lock();
    reduce_seconds_ += took;
    bytes_reduced_ += buckets_[b].count * static_cast<int64_t>(sizeof(float));
    if (!s.ok() && error_.ok()) error_ = s;
    busy_ = false;
  }

  void Loop() {
    absl::MutexLock lock(&mu_);
    for (;;) {
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      const size_t b = queue_.front();
      queue_.pop_front();
      Reduce(b);
      done_cv_.SignalAll();
    }
  }

  models::Trainer& trainer_;
  std::vector<Bucket> buckets_;
  std::vector<std::unique_ptr<PreparedAllReduce>> prepared_;  // one per bucket
  size_t next_ = 0;                                           // main thread only
  mutable absl::Mutex mu_;
  absl::CondVar cv_, done_cv_;
  std::deque<size_t> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Status error_ ABSL_GUARDED_BY(mu_);
  double reduce_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // The training thread waiting for the queue before its last buckets.
  double wait_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_reduced_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// The Trainer's GradientSync across the ranks: the buckets' all-reduce (BucketReducer, made once
// the trainer's gradients exist), SyncBatchNorm's per-layer sums on the training thread in the
// step's order of collective operations, and DP-SGD's int64 exact sum.
class RankSync final : public models::GradientSync {
 public:
  RankSync(Collective& collective, DataParallelStats& stats)
      : collective_(collective), stats_(stats) {}

  void set_reducer(BucketReducer* reducer, kernels::Backend* backend) {
    reducer_ = reducer;
    backend_ = backend;
  }

  void StartStep(int64_t /*global_rows*/) override { reducer_->StartStep(); }
  void LayerDone(size_t layer) override { reducer_->LayerDone(layer); }
  Status FinishStep() override { return reducer_->FinishStep(&stats_.wait_seconds); }

  // Each layer's sums buffer is prepared for repeated all-reduces on first use (the first step
  // visits the layers in the same order on every rank, so the preparations match too).
  void AllReduceBatchNormSums(double* sums, int64_t count) override {
    reducer_->RunInOrder([&]() -> Status {
      HUDDLE_RETURN_IF_ERROR(SynchronizeGpu());
      std::unique_ptr<PreparedAllReduce>& prepared = prepared_[sums];
      if (prepared == nullptr) {
        HUDDLE_ASSIGN_OR_RETURN(prepared, collective_.PrepareAllReduceSum(
                                              std::span<double>(sums, static_cast<size_t>(count))));
      }
      return Run(*prepared, count * static_cast<int64_t>(sizeof(double)));
    });
  }

  // Prepared once: the buffer is the trainer's DP-SGD stepper's for good. A GPU's chunks must be
  // computed before NCCL, on its own stream, reads them.
  Status AllReduceUnits(std::span<int64_t> units) override {
    HUDDLE_RETURN_IF_ERROR(SynchronizeGpu());
    if (units_ == nullptr) {
      HUDDLE_ASSIGN_OR_RETURN(units_, collective_.PrepareAllReduceSum(units));
    }
    return Run(*units_, static_cast<int64_t>(units.size_bytes()));
  }

 private:
  Status SynchronizeGpu() {
    // A GPU computes asynchronously: the values must be there before the collective reads them.
    if (backend_->kind() == kernels::DeviceKind::kCpu) return absl::OkStatus();
    return backend_->Synchronize();
  }
  Status Run(PreparedAllReduce& op, int64_t bytes) {
    const auto start = SteadyTime::now();
    Status s = op.Run();
    stats_.reduce_seconds += SecondsSince(start);
    stats_.bytes_reduced += bytes;
    return s;
  }

  Collective& collective_;
  DataParallelStats& stats_;
  BucketReducer* reducer_ = nullptr;
  kernels::Backend* backend_ = nullptr;
  std::map<double*, std::unique_ptr<PreparedAllReduce>> prepared_;
  std::unique_ptr<PreparedAllReduce> units_;
};

}  // namespace

Status ValidateDataParallelOptions(const DataParallelOptions& options) {
  if (options.bucket_bytes < 4) {
    return absl::InvalidArgumentError(
        fmt::format("bucket_bytes is {}; it must be at least 4", options.bucket_bytes));
  }
  if (options.first_bucket_bytes < 4) {
    return absl::InvalidArgumentError(
        fmt::format("first_bucket_bytes is {}; it must be at least 4", options.first_bucket_bytes));
  }
  if (options.global_batch_size < 0) {
    return absl::InvalidArgumentError(
        fmt::format("global_batch_size is {}; it must be >= 0", options.global_batch_size));
  }
  if (options.checksum_every < 0) {
    return absl::InvalidArgumentError(
        fmt::format("checksum_every is {}; it must be >= 0", options.checksum_every));
  }
  return models::CheckTrainOptions(options.train);
}

StatusOr<DataParallelStats> TrainDataParallel(Collective& collective, const models::ModelSpec& spec,
                                              const DataParallelOptions& options,
                                              const data::DatasetView& data, TensorList* params) {
  const auto start = SteadyTime::now();
  if (params == nullptr) return absl::InvalidArgumentError("TrainDataParallel: params is null");
  HUDDLE_RETURN_IF_ERROR(models::CheckBuiltIn(spec));
  HUDDLE_RETURN_IF_ERROR(ValidateDataParallelOptions(options));
  HUDDLE_RETURN_IF_ERROR(models::CheckParams(spec, *params));  // the data: Trainer::Create

  kernels::FlushDenormalsScope flush_denormals;
  const int world = collective.world_size();
  const int rank = collective.rank();
  if (options.dp_sgd && rank == 0 && options.dp_sgd->noise == nullptr) {
    return absl::InvalidArgumentError("DP-SGD: rank 0 needs a noise source (dp_sgd.noise)");
  }
  const int64_t n = data.size();
  DataParallelStats stats;
  RankSync sync(collective, stats);
  models::Trainer::Loop loop;
  loop.seed = options.seed;
  loop.rank = rank;
  loop.world = world;
  loop.global_batch =
      options.global_batch_size > 0 ? options.global_batch_size : options.train.batch_size * world;
  loop.sync = &sync;
  loop.overlap = options.overlap;
  if (options.dp_sgd) {
    loop.dp_sgd = options.dp_sgd->dp;
    loop.noise = rank == 0 ? options.dp_sgd->noise : nullptr;
  }
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<models::Trainer> trainer_owner,
                          models::Trainer::Create(spec, options.train, data, loop));
  models::Trainer& trainer = *trainer_owner;
  kernels::Backend& backend = trainer.backend();
  // Gloo reduces host memory, NCCL device memory: the training device must be where they look.
  const bool on_cpu = backend.kind() == kernels::DeviceKind::kCpu;
  if ((collective.backend() == "gloo") != on_cpu) {
    return absl::InvalidArgumentError(fmt::format(
        "a {} collective cannot reduce buffers of the {} backend (Gloo needs the CPU, NCCL a GPU)",
        collective.backend(), backend.name()));
  }
  // A checkpoint that does not fit is refused after the agreement step, so that every rank
  // learns it (ShareResume).
  Status resume_fit;
  if (rank == 0 && options.resume != nullptr) {
    if (Status st = models::CheckParams(spec, options.resume->params); !st.ok()) {
      resume_fit = absl::FailedPreconditionError(
          absl::StrCat("the checkpoint does not fit this model: ", st.message()));
    }
  }
  const bool resuming = rank == 0 && options.resume != nullptr && resume_fit.ok();
  trainer.UploadParams(resuming ? options.resume->params : *params);
  HUDDLE_ASSIGN_OR_RETURN(Scratch scratch, Scratch::Create(backend, world));
  HUDDLE_RETURN_IF_ERROR(backend.Synchronize());

  // Same model, options and data everywhere, or no step at all.
  HUDDLE_RETURN_IF_ERROR(CheckAgreement(collective, scratch, spec, options, data));
  // Rank 0's parameters, everywhere (the gaps between parameters are zero on every rank).
  HUDDLE_RETURN_IF_ERROR(collective.Broadcast(std::as_writable_bytes(trainer.params()), 0));
  Status refusal;
  HUDDLE_ASSIGN_OR_RETURN(const ResumeHeader resume, ShareResume(collective, scratch, trainer,
                                                                 options, n, resume_fit, &refusal));
  trainer.set_steps(resume.steps);
  HUDDLE_ASSIGN_OR_RETURN(StopVote stop_vote, StopVote::Create(collective, backend, options));
  // A resume within an epoch: rank 0 carries that epoch's totals so far into its end.
  std::array<double, 2> carried{0, 0};
  if (resuming && resume.epoch_rows > 0) {
    carried = {options.resume->epoch_loss_sum, options.resume->epoch_correct};
  }
  std::unique_ptr<BucketReducer> reducer;
  if (!options.dp_sgd) {
    HUDDLE_ASSIGN_OR_RETURN(
        reducer, BucketReducer::Create(collective, trainer,
                                       PlanBuckets(trainer.layout(), options.first_bucket_bytes,
                                                   options.bucket_bytes)));
    stats.buckets = static_cast<int64_t>(reducer->buckets().size());
  } else {
    stats.buckets = 1;  // the exact sum's one int64 all-reduce
  }
  sync.set_reducer(reducer.get(), &backend);

  TrainingState state;  // rank 0's EpochReport::state
  // Rank 0's state after the current step (on_epoch, on_stop).
  const auto fill_state = [&](int64_t epochs_done, double seconds) -> Status {
    state.epochs_done = epochs_done;
    state.steps = trainer.steps();
    state.seed = options.seed;
    state.world_size = world;
    state.batch_size = (loop.global_batch + world - 1) / world;
    state.seconds = seconds;
    state.dp_sgd = options.dp_sgd.has_value();
    state.epoch_rows = 0;
    state.epoch_loss_sum = state.epoch_correct = 0;
    if (state.params.empty()) state.params = *params;  // names and shapes
    HUDDLE_RETURN_IF_ERROR(trainer.DownloadParams(&state.params));
    return trainer.DownloadVelocity(&state.velocity);
  };
  // After each step: fault injection (tests), the periodic replica check, and the stop vote.
  const auto after_step = [&](int64_t epoch_rows) -> Status {
    const int64_t steps = trainer.steps();
    if (options.after_step_for_testing) {
      const std::span<float> p = trainer.params();
      options.after_step_for_testing(steps, p.data(), static_cast<int64_t>(p.size()));
    }
    if (options.checksum_every > 0 && steps % options.checksum_every == 0) {
      HUDDLE_RETURN_IF_ERROR(CheckReplicas(collective, trainer, scratch, steps));
      ++stats.checksums;
    }
    HUDDLE_ASSIGN_OR_RETURN(const bool stop, stop_vote.StopAfter(steps));
    if (!stop) return absl::OkStatus();
    if (!options.dp_sgd) {
      // The epoch's totals so far, over all ranks (every rank takes part), for the resume.
      HUDDLE_ASSIGN_OR_RETURN(const kernels::LossAccumulator totals, trainer.ReadTotals());
      std::array<double, 2> global{totals.loss_sum + carried[0],
                                   static_cast<double>(totals.correct) + carried[1]};
      HUDDLE_RETURN_IF_ERROR(scratch.AllReduceSum(collective, global));
      if (options.state_on_rank0 && rank == 0 && options.on_stop) {
        HUDDLE_RETURN_IF_ERROR(fill_state(trainer.epoch(), resume.seconds + SecondsSince(start)));
        state.epoch_rows = epoch_rows;
        state.epoch_loss_sum = global[0];
        state.epoch_correct = global[1];
        HUDDLE_RETURN_IF_ERROR(options.on_stop(state));
      }
    }
    return absl::CancelledError(
        fmt::format("stopped on request after step {} (rank {})", steps, rank));
  };
  // After each epoch (its totals over `rows` rows of all ranks; DP-SGD: the sampled rows): loss
  // and accuracy, the divergence check, and the caller's callback with rank 0's state. A DP-SGD
  // "epoch" is ceil(n / expected_batch_size) steps.
  const int64_t epochs = trainer.epochs();
  auto epoch_start = SteadyTime::now();
  const auto end_epoch = [&](int64_t epoch, int64_t rows) -> Status {
    const auto examples = static_cast<double>(rows);
    HUDDLE_ASSIGN_OR_RETURN(const kernels::LossAccumulator totals, trainer.ReadTotals());
    std::array<double, 2> global{totals.loss_sum + carried[0],
                                 static_cast<double>(totals.correct) + carried[1]};
    carried = {0, 0};
    HUDDLE_RETURN_IF_ERROR(scratch.AllReduceSum(collective, global));
    stats.loss = examples > 0 ? global[0] / examples : 0.0;
    stats.accuracy = examples > 0 ? global[1] / examples : 0.0;
    if (!std::isfinite(stats.loss)) return models::LossDiverged(epoch, options.train.learning_rate);
    if (!options.on_epoch) return absl::OkStatus();
    EpochReport report{epoch,
                       trainer.steps(),
                       stats.loss,
                       stats.accuracy,
                       resume.seconds + SecondsSince(start),
                       SecondsSince(epoch_start),
                       epochs,
                       epoch + 1 == epochs,
                       nullptr};
    if (options.state_on_rank0 && rank == 0) {
      HUDDLE_RETURN_IF_ERROR(fill_state(epoch + 1, report.seconds));
      report.state = &state;
    }
    const Status done = options.on_epoch(report);
    epoch_start = SteadyTime::now();  // the next epoch's time starts after the callback
    return done;
  };

  if (options.dp_sgd) {
    HUDDLE_ASSIGN_OR_RETURN(
        privacy::NoiseSource sampling,
        ShareSamplingStream(collective, scratch, options.dp_sgd->noise, &stats.private_noise));
    stats.private_noise = stats.private_noise && options.dp_sgd->dp.noise_multiplier > 0;
    // A resume continues at its step (a multiple of an epoch's steps: checkpoints follow epochs).
    HUDDLE_RETURN_IF_ERROR(trainer.TrainDpSgd(resume.steps, sampling, after_step, end_epoch));
    stats.dp_event = privacy::DpEvent{
        static_cast<double>(options.dp_sgd->dp.expected_batch_size) / static_cast<double>(n),
        options.dp_sgd->dp.noise_multiplier, trainer.dp_steps()};
  } else {
    // A resume within an epoch continues at the next global batch of its order.
    HUDDLE_RETURN_IF_ERROR(
        trainer.TrainEpochs(resume.epochs_done, resume.epoch_rows, after_step, end_epoch));
  }
  stats.steps = trainer.steps();
  stats.examples = trainer.examples();
  HUDDLE_RETURN_IF_ERROR(CheckReplicas(collective, trainer, scratch, stats.steps));
  ++stats.checksums;
  HUDDLE_RETURN_IF_ERROR(trainer.DownloadParams(params));
  if (reducer != nullptr) {
    stats.reduce_seconds += reducer->reduce_seconds();
    stats.bytes_reduced += reducer->bytes_reduced();
  }
  stats.seconds = SecondsSince(start);
  return stats;
}

}  // namespace huddle::datacenter
