#include "datacenter/data_parallel.h"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "kernels/backend.h"
#include "kernels/flush_denormals.h"
// The training loop is the federated client's (models/trainer.h); this file adds the collectives:
// the gradient buckets' all-reduce, SyncBatchNorm's and DP-SGD's sums, agreement, replica checks.
#include "models/trainer.h"

namespace huddle::datacenter {
namespace {

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
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
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
        std::lock_guard lock(mu_);
        if (error_.ok()) error_ = s;
      }
    }
    if (next_ == buckets_.size()) {
      // The step's last buckets: after the queued ones, here.
      std::unique_lock lock(mu_);
      const auto start = SteadyTime::now();
      done_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
      wait_seconds_ += SecondsSince(start);
      for (size_t b = first_ready; b < next_; ++b) Reduce(b, lock);
      return;
    }
    {
      std::lock_guard lock(mu_);
      for (size_t b = first_ready; b < next_; ++b) queue_.push_back(b);
    }
    cv_.notify_all();
  }

  // Waits for every bucket of the step; the first error of any reduction.
  Status FinishStep(double* wait_seconds) {
    auto start = SteadyTime::now();
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    *wait_seconds += SecondsSince(start) + wait_seconds_;
    wait_seconds_ = 0;
    return error_;
  }

  // Runs `op` (another collective operation of the step, e.g. SyncBatchNorm's) on the training
  // thread once the buckets handed over so far are reduced: one thread uses the collective at a
  // time, and every rank issues the operations in the same order. Its error stops the step.
  void RunInOrder(const std::function<Status()>& op) {
    std::unique_lock lock(mu_);
    const auto start = SteadyTime::now();
    done_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    wait_seconds_ += SecondsSince(start);
    if (!error_.ok()) return;
    lock.unlock();
    Status s = op();
    lock.lock();
    if (!s.ok() && error_.ok()) error_ = s;
  }

  double reduce_seconds() const { return reduce_seconds_; }
  int64_t bytes_reduced() const { return bytes_reduced_; }

 private:
  BucketReducer(models::Trainer& trainer, std::vector<Bucket> buckets,
                std::vector<std::unique_ptr<PreparedAllReduce>> prepared)
      : trainer_(trainer), buckets_(std::move(buckets)), prepared_(std::move(prepared)) {
    thread_ = std::thread([this] { Loop(); });
  }

  // All-reduces bucket b (unless an earlier reduction failed: a broken collective is drained
  // without reducing). Called with `lock` held; releases it during the reduction.
  void Reduce(size_t b, std::unique_lock<std::mutex>& lock) {
    if (!error_.ok()) return;
    busy_ = true;
    lock.unlock();
    const auto start = SteadyTime::now();
    Status s = prepared_[b]->Run();
    const double took = SecondsSince(start);
    lock.lock();
    reduce_seconds_ += took;
    bytes_reduced_ += buckets_[b].count * static_cast<int64_t>(sizeof(float));
    if (!s.ok() && error_.ok()) error_ = s;
    busy_ = false;
  }

  void Loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const size_t b = queue_.front();
      queue_.pop_front();
      Reduce(b, lock);
      done_cv_.notify_all();
    }
  }

  models::Trainer& trainer_;
  std::vector<Bucket> buckets_;
  std::vector<std::unique_ptr<PreparedAllReduce>> prepared_;  // one per bucket
  size_t next_ = 0;                                           // main thread only
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<size_t> queue_;
  bool busy_ = false;
  bool stop_ = false;
  Status error_;
  double reduce_seconds_ = 0;
  double wait_seconds_ = 0;  // the training thread waiting for the queue before its last buckets
  int64_t bytes_reduced_ = 0;
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

// Small host-side collectives (loss totals, digests) through a scratch buffer on the training
// device, which is where the collective's buffers live.
class Scratch {
 public:
  static StatusOr<Scratch> Create(kernels::Backend& backend, int world_size) {
    Scratch s(backend);
    HUDDLE_ASSIGN_OR_RETURN(s.buffer_, backend.Allocate(64 * (world_size + 1)));
    return s;
  }

  Status AllReduceSum(Collective& c, std::span<double> values) {
    const int64_t bytes = static_cast<int64_t>(values.size_bytes());
    backend_->CopyToDevice(buffer_.data(), values.data(), bytes);
    HUDDLE_RETURN_IF_ERROR(backend_->Synchronize());
    HUDDLE_RETURN_IF_ERROR(c.AllReduceSum(std::span<double>(buffer_.as<double>(), values.size())));
    return backend_->CopyToHost(values.data(), buffer_.data(), bytes);
  }

  // At most 64 bytes, from `root`.
  Status Broadcast(Collective& c, std::span<std::byte> data, int root) {
    const auto bytes = static_cast<int64_t>(data.size());
    backend_->CopyToDevice(buffer_.data(), data.data(), bytes);
    HUDDLE_RETURN_IF_ERROR(backend_->Synchronize());
    HUDDLE_RETURN_IF_ERROR(
        c.Broadcast(std::span<std::byte>(buffer_.as<std::byte>(), data.size()), root));
    return backend_->CopyToHost(data.data(), buffer_.data(), bytes);
  }

  // in: at most 64 bytes.
  Status AllGather(Collective& c, std::span<const std::byte> in, std::span<std::byte> out) {
    const auto bytes = static_cast<int64_t>(in.size());
    auto* device = buffer_.as<std::byte>();
    backend_->CopyToDevice(device, in.data(), bytes);
    HUDDLE_RETURN_IF_ERROR(backend_->Synchronize());
    HUDDLE_RETURN_IF_ERROR(c.AllGather(std::span<const std::byte>(device, in.size()),
                                       std::span<std::byte>(device + 64, out.size())));
    return backend_->CopyToHost(out.data(), device + 64, static_cast<int64_t>(out.size()));
  }

 private:
  explicit Scratch(kernels::Backend& backend) : backend_(&backend) {}
  kernels::Backend* backend_;
  kernels::DeviceBuffer buffer_;
};

constexpr size_t kDigestBytes = 16;
using Digest = std::array<std::byte, kDigestBytes>;

// The ranks whose digest differs from rank 0's (all-gathered).
StatusOr<std::vector<int>> RanksDiffering(Collective& c, Scratch& scratch, const Digest& digest) {
  std::vector<std::byte> all(kDigestBytes * static_cast<size_t>(c.world_size()));
  HUDDLE_RETURN_IF_ERROR(scratch.AllGather(c, digest, all));
  std::vector<int> differ;
  for (int r = 1; r < c.world_size(); ++r) {
    if (std::memcmp(all.data() + r * kDigestBytes, all.data(), kDigestBytes) != 0) {
      differ.push_back(r);
    }
  }
  return differ;
}

// What every rank must agree on before the first step: the model and the options that shape the
// trajectory or the order of collectives.
Digest ConfigDigest(const models::ModelSpec& spec, const DataParallelOptions& o) {
  crypto_generichash_state h;
  crypto_generichash_init(&h, nullptr, 0, kDigestBytes);
  auto add = [&](const auto& v) {
    crypto_generichash_update(&h, reinterpret_cast<const unsigned char*>(&v), sizeof v);
  };
  for (int64_t d : spec.input) add(d);
  add(spec.input.size());
  for (const models::LayerSpec& l : spec.layers) {
    add(l.kind);
    add(l.out);
    add(l.kernel);
    add(l.stride);
    add(l.padding);
    add(l.groups);
    add(l.rate);
    add(l.scales);
    add(l.angles);
  }
  add(spec.layers.size());
  add(o.train.epochs);
  add(o.train.batch_size);
  add(o.train.learning_rate);
  add(o.train.momentum);
  add(o.train.weight_decay);
  add(o.seed);
  add(o.global_batch_size);
  add(o.bucket_bytes);
  add(o.first_bucket_bytes);
  add(o.checksum_every);
  add(o.stop_check_every);
  if (o.dp_sgd) {
    add(o.dp_sgd->dp.noise_multiplier);
    add(o.dp_sgd->dp.clip_norm);
    add(o.dp_sgd->dp.expected_batch_size);
  } else {
    add(int64_t{-1});
  }
  Digest d;
  crypto_generichash_final(&h, reinterpret_cast<unsigned char*>(d.data()), d.size());
  return d;
}

// The data itself, in the view's order: its size and shape, then each example's features (their
// bytes) and label. A rank with poisoned data of the right shape differs here.
Digest DataDigest(const data::DatasetView& data) {
  crypto_generichash_state h;
  crypto_generichash_init(&h, nullptr, 0, kDigestBytes);
  auto add = [&](const void* p, size_t bytes) {
    crypto_generichash_update(&h, static_cast<const unsigned char*>(p), bytes);
  };
  const int64_t n = data.size();
  const int64_t dim = n > 0 ? data.base->feature_dim : 0;
  add(&n, sizeof n);
  add(&dim, sizeof dim);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = data.row(i);
    add(data.base->row_features(row), static_cast<size_t>(dim) * sizeof(float));
    add(&data.base->labels[static_cast<size_t>(row)], sizeof(int32_t));
  }
  Digest d;
  crypto_generichash_final(&h, reinterpret_cast<unsigned char*>(d.data()), d.size());
  return d;
}

// Same model, options and data on every rank (one all-gather of both digests), or an error on
// every rank naming the ranks that differ from rank 0 and what differs.
Status CheckAgreement(Collective& c, Scratch& scratch, const models::ModelSpec& spec,
                      const DataParallelOptions& o, const data::DatasetView& data) {
  std::array<std::byte, 2 * kDigestBytes> mine;
  const Digest config = ConfigDigest(spec, o), values = DataDigest(data);
  std::memcpy(mine.data(), config.data(), kDigestBytes);
  std::memcpy(mine.data() + kDigestBytes, values.data(), kDigestBytes);
  std::vector<std::byte> all(mine.size() * static_cast<size_t>(c.world_size()));
  HUDDLE_RETURN_IF_ERROR(scratch.AllGather(c, mine, all));
  std::vector<int> other_config, other_data;
  for (int r = 1; r < c.world_size(); ++r) {
    const std::byte* theirs = all.data() + static_cast<size_t>(r) * mine.size();
    if (std::memcmp(theirs, all.data(), kDigestBytes) != 0) other_config.push_back(r);
    if (std::memcmp(theirs + kDigestBytes, all.data() + kDigestBytes, kDigestBytes) != 0) {
      other_data.push_back(r);
    }
  }
  if (!other_config.empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "rank(s) {} have a different model, training options or seed than rank 0; every rank "
        "must run the same configuration",
        fmt::join(other_config, ", ")));
  }
  if (!other_data.empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "rank(s) {} hold different training data than rank 0 (the digest of every example's "
        "features and label differs); every rank must load the same data",
        fmt::join(other_data, ", ")));
  }
  return absl::OkStatus();
}

// The stop agreement (DataParallelOptions::stop): every `every` steps the ranks sum their stop
// flags, so that all of them stop after the same step. Deadlock-free: every rank votes at the
// same step counts, whatever its flag.
class StopVote {
 public:
  static StatusOr<StopVote> Create(Collective& c, kernels::Backend& backend,
                                   const DataParallelOptions& o) {
    StopVote v;
    v.flag_ = o.stop;
    v.every_ = std::max<int64_t>(1, o.stop_check_every);
    v.backend_ = &backend;
    if (v.flag_ != nullptr && c.world_size() > 1) {
      HUDDLE_ASSIGN_OR_RETURN(v.buffer_, backend.Allocate(sizeof(double)));
      HUDDLE_ASSIGN_OR_RETURN(v.reduce_,
                              c.PrepareAllReduceSum(std::span<double>(v.buffer_.as<double>(), 1)));
    }
    return v;
  }

  // After step `steps` (counted from the run's start): whether every rank stops now.
  StatusOr<bool> StopAfter(int64_t steps) {
    if (flag_ == nullptr || steps % every_ != 0) return false;
    const double mine = flag_->load() ? 1.0 : 0.0;
    if (reduce_ == nullptr) return mine > 0;
    double sum = 0;
    backend_->CopyToDevice(buffer_.data(), &mine, sizeof mine);
    HUDDLE_RETURN_IF_ERROR(backend_->Synchronize());
    HUDDLE_RETURN_IF_ERROR(reduce_->Run());
    HUDDLE_RETURN_IF_ERROR(backend_->CopyToHost(&sum, buffer_.data(), sizeof sum));
    return sum > 0;
  }

 private:
  const std::atomic<bool>* flag_ = nullptr;
  int64_t every_ = 1;
  kernels::Backend* backend_ = nullptr;
  kernels::DeviceBuffer buffer_;
  std::unique_ptr<PreparedAllReduce> reduce_;
};

// Compares a BLAKE2b digest of every rank's parameters; DataLoss naming the ranks that differ
// from rank 0.
Status CheckReplicas(Collective& c, models::Trainer& trainer, Scratch& scratch, int64_t step) {
  const std::span<float> params = trainer.params();
  std::vector<float> host(params.size());
  HUDDLE_RETURN_IF_ERROR(trainer.backend().CopyToHost(host.data(), params.data(),
                                                      static_cast<int64_t>(params.size_bytes())));
  Digest digest;
  crypto_generichash(reinterpret_cast<unsigned char*>(digest.data()), digest.size(),
                     reinterpret_cast<const unsigned char*>(host.data()),
                     host.size() * sizeof(float), nullptr, 0);
  HUDDLE_ASSIGN_OR_RETURN(const std::vector<int> differ, RanksDiffering(c, scratch, digest));
  if (differ.empty()) return absl::OkStatus();
  return absl::DataLossError(fmt::format(
      "replicas diverged at step {}: the parameters of rank(s) {} differ from rank 0's (checked "
      "on rank {}); stopping rather than train inconsistent models",
      step, fmt::join(differ, ", "), c.rank()));
}

// Rank 0's resume state (or a fresh start), on every rank: the parameters are already uploaded on
// rank 0; this broadcasts the position and the momentum. Rank 0 checks the state first and, if it
// does not fit, every rank stops with the reason (on rank 0) or a pointer to rank 0's log.
struct ResumeHeader {
  int64_t refused = 0;
  int64_t epochs_done = 0;
  int64_t steps = 0;
  int64_t has_velocity = 0;
  double seconds = 0;
  int64_t epoch_rows = 0;  // a stop within epoch epochs_done: the rows of it already trained
};

StatusOr<ResumeHeader> ShareResume(Collective& c, Scratch& scratch, models::Trainer& trainer,
                                   const DataParallelOptions& options, int64_t n, const Status& fit,
                                   Status* refusal) {
  static_assert(sizeof(ResumeHeader) <= 64, "Scratch::Broadcast moves at most 64 bytes");
  ResumeHeader h;
  if (c.rank() == 0 && options.resume != nullptr) {
    const TrainingState& state = *options.resume;
    if (!fit.ok()) {
      *refusal = fit;
    } else if (state.dp_sgd != options.dp_sgd.has_value()) {
      *refusal = absl::FailedPreconditionError(
          state.dp_sgd ? "the checkpoint was written by a DP-SGD run; this run is not DP-SGD"
                       : "the checkpoint was written without DP-SGD; this run uses DP-SGD");
    } else if (state.seed != options.seed) {
      *refusal = absl::FailedPreconditionError(
          fmt::format("the checkpoint was written with seed {}, this run has seed {}: resuming "
                      "would not continue the same run",
                      state.seed, options.seed));
    } else if (state.epochs_done < 0 || state.steps < 0) {
      *refusal = absl::DataLossError("the checkpoint's position is negative");
    } else if (state.epoch_rows < 0 || state.epoch_rows > n ||
               (state.dp_sgd && state.epoch_rows != 0)) {
      *refusal = absl::FailedPreconditionError(
          fmt::format("the checkpoint stopped {} rows into an epoch; this data set has {} rows",
                      state.epoch_rows, n));
    } else {
      *refusal = trainer.UploadVelocity(state.velocity);
    }
    h.refused = refusal->ok() ? 0 : 1;
    h.epochs_done = state.epochs_done;
    h.steps = state.steps;
    h.has_velocity = state.velocity.empty() ? 0 : 1;
    h.seconds = state.seconds;
    h.epoch_rows = state.epoch_rows;
  }
  HUDDLE_RETURN_IF_ERROR(
      scratch.Broadcast(c, std::as_writable_bytes(std::span<ResumeHeader>(&h, 1)), /*root=*/0));
  if (h.refused != 0) {
    if (c.rank() == 0) return *refusal;
    return absl::FailedPreconditionError(
        "rank 0 refused to resume from its checkpoint (its log says why)");
  }
  if (h.has_velocity != 0) {
    HUDDLE_RETURN_IF_ERROR(trainer.EnsureVelocity());
    HUDDLE_RETURN_IF_ERROR(trainer.backend().Synchronize());
    for (size_t i = 0; i < trainer.layout().sizes.size(); ++i) {
      HUDDLE_RETURN_IF_ERROR(c.Broadcast(std::as_writable_bytes(trainer.velocity(i)), 0));
    }
  }
  return h;
}

// DataParallelDpSgd's sampling stream on every rank: the single process's (its key is the first
// bytes of rank 0's noise source), broadcast from rank 0 with whether the noise is private.
StatusOr<privacy::NoiseSource> ShareSamplingStream(Collective& c, Scratch& scratch,
                                                   privacy::NoiseSource* noise,
                                                   bool* private_noise) {
  struct {
    std::array<unsigned char, 32> key;
    int64_t is_private;
  } shared{};
  if (c.rank() == 0) {
    shared.key = models::Trainer::DrawSamplingKey(*noise);
    shared.is_private = noise->is_private() ? 1 : 0;
  }
  HUDDLE_RETURN_IF_ERROR(
      scratch.Broadcast(c, std::as_writable_bytes(std::span(&shared, 1)), /*root=*/0));
  privacy::NoiseSource sampling =
      privacy::NoiseSource::FromSharedKey(shared.key, shared.is_private != 0);
  std::fill(shared.key.begin(), shared.key.end(), 0);
  *private_noise = shared.is_private != 0;
  return sampling;
}

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
