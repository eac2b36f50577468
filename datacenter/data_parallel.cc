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
#include <numeric>
#include <thread>

#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/flush_denormals.h"
// The workspace and the input checks are the client trainer's own (models/internal): the
// datacenter trainer runs the same forward, backward and SGD kernels, step by step.
#include "models/internal/net_workspace.h"
#include "models/internal/train_loops.h"

namespace huddle::datacenter {
namespace {

using models::internal::NetWorkspace;
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
std::vector<Bucket> PlanBuckets(const NetWorkspace& ws, int64_t first_bytes, int64_t bytes) {
  std::vector<Bucket> buckets;
  const auto kFloat = static_cast<int64_t>(sizeof(float));
  int64_t end = ws.trainable_span();
  int64_t filled = 0;
  for (size_t i = ws.num_trainable(); i-- > 0;) {
    filled += ws.param_size(i) * kFloat;
    const int64_t cap = buckets.empty() ? first_bytes : bytes;
    if (filled >= cap || i == 0) {
      const int64_t begin = ws.param_offset(i);
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
  static StatusOr<std::unique_ptr<BucketReducer>> Create(Collective& collective, NetWorkspace& ws,
                                                         std::vector<Bucket> buckets) {
    std::vector<std::unique_ptr<PreparedAllReduce>> prepared;
    for (const Bucket& b : buckets) {
      HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<PreparedAllReduce> p,
                              collective.PrepareAllReduceSum(std::span<float>(
                                  ws.grads_base() + b.begin, static_cast<size_t>(b.count))));
      prepared.push_back(std::move(p));
    }
    return std::unique_ptr<BucketReducer>(
        new BucketReducer(ws, std::move(buckets), std::move(prepared)));
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
    while (next_ < buckets_.size() && buckets_[next_].lowest_param >= ws_.first_param(layer)) {
      ++next_;
    }
    if (next_ == first_ready) return;
    // A GPU computes asynchronously: the gradients must be there before another stream reads them.
    if (ws_.backend().kind() != kernels::DeviceKind::kCpu) {
      if (Status s = ws_.backend().Synchronize(); !s.ok()) {
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
  BucketReducer(NetWorkspace& ws, std::vector<Bucket> buckets,
                std::vector<std::unique_ptr<PreparedAllReduce>> prepared)
      : ws_(ws), buckets_(std::move(buckets)), prepared_(std::move(prepared)) {
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

  NetWorkspace& ws_;
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

// SyncBatchNorm across the ranks: each batch-norm layer's sums all-reduced on the training thread,
// in the step's order of collective operations (BucketReducer::RunInOrder).
class RankBatchNormSync final : public NetWorkspace::BatchNormSync {
 public:
  RankBatchNormSync(Collective& collective, kernels::Backend& backend, BucketReducer& reducer)
      : collective_(collective), backend_(backend), reducer_(reducer) {}

  void set_global_rows(int64_t rows) { rows_ = rows; }
  int64_t global_rows() const override { return rows_; }

  // Each layer's sums buffer is prepared for repeated all-reduces on first use (the first step
  // visits the layers in the same order on every rank, so the preparations match too).
  void AllReduceSum(double* sums, int64_t count) override {
    reducer_.RunInOrder([&]() -> Status {
      // A GPU computes asynchronously: the sums must be there before the collective reads them.
      if (backend_.kind() != kernels::DeviceKind::kCpu) {
        HUDDLE_RETURN_IF_ERROR(backend_.Synchronize());
      }
      std::unique_ptr<PreparedAllReduce>& prepared = prepared_[sums];
      if (prepared == nullptr) {
        HUDDLE_ASSIGN_OR_RETURN(prepared, collective_.PrepareAllReduceSum(
                                              std::span<double>(sums, static_cast<size_t>(count))));
      }
      const auto start = SteadyTime::now();
      Status s = prepared->Run();
      seconds_ += SecondsSince(start);
      bytes_ += count * static_cast<int64_t>(sizeof(double));
      return s;
    });
  }

  double seconds() const { return seconds_; }
  int64_t bytes() const { return bytes_; }

 private:
  Collective& collective_;
  kernels::Backend& backend_;
  BucketReducer& reducer_;
  std::map<double*, std::unique_ptr<PreparedAllReduce>> prepared_;
  int64_t rows_ = 1;
  double seconds_ = 0;
  int64_t bytes_ = 0;
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
Status CheckReplicas(Collective& c, NetWorkspace& ws, Scratch& scratch, int64_t step) {
  std::vector<float> host(static_cast<size_t>(ws.params_span()));
  HUDDLE_RETURN_IF_ERROR(ws.backend().CopyToHost(
      host.data(), ws.params_base(), ws.params_span() * static_cast<int64_t>(sizeof(float))));
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

StatusOr<ResumeHeader> ShareResume(Collective& c, Scratch& scratch, NetWorkspace& ws,
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
      *refusal = ws.UploadVelocity(state.velocity);
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
    HUDDLE_RETURN_IF_ERROR(ws.EnsureVelocity());
    HUDDLE_RETURN_IF_ERROR(ws.backend().Synchronize());
    for (size_t i = 0; i < ws.num_trainable(); ++i) {
      HUDDLE_RETURN_IF_ERROR(
          c.Broadcast(std::span<std::byte>(reinterpret_cast<std::byte*>(ws.velocity(i)),
                                           static_cast<size_t>(ws.param_size(i)) * sizeof(float)),
                      0));
    }
  }
  return h;
}

using AfterStep = std::function<Status()>;
using EndEpoch =
    std::function<Status(int64_t epoch, int64_t epochs, SteadyTime::time_point start, double rows)>;

// DataParallelDpSgd's steps: the shared Poisson sample, this rank's chunks of it and rank 0's
// noise (models::internal::DpSgdStepper, the single process's step), the int64 all-reduce of
// the exact sum, the SGD step. An "epoch" in reports is ceil(n / expected_batch_size) steps.
Status RunDpSgd(Collective& c, NetWorkspace& ws, Scratch& scratch, const models::ModelSpec& spec,
                const DataParallelOptions& options, int64_t n, const AfterStep& after_step,
                const EndEpoch& end_epoch, DataParallelStats* stats) {
  const DataParallelDpSgd& dp = *options.dp_sgd;
  const int rank = c.rank(), world = c.world_size();
  HUDDLE_ASSIGN_OR_RETURN(const models::internal::DpSgdPlan plan,
                          models::internal::PlanDpSgd(spec, options.train, dp.dp, n));
  // The sampling stream's key (the single process's: the first bytes of rank 0's source) and
  // whether the noise is private, from rank 0.
  struct {
    std::array<unsigned char, 32> key;
    int64_t is_private;
  } shared{};
  if (rank == 0) {
    shared.key = models::internal::DrawSamplingKey(*dp.noise);
    shared.is_private = dp.noise->is_private() ? 1 : 0;
  }
  HUDDLE_RETURN_IF_ERROR(
      scratch.Broadcast(c, std::as_writable_bytes(std::span(&shared, 1)), /*root=*/0));
  privacy::NoiseSource sampling =
      privacy::NoiseSource::FromSharedKey(shared.key, shared.is_private != 0);
  std::fill(shared.key.begin(), shared.key.end(), 0);
  // Only rank 0's stepper draws noise.
  HUDDLE_ASSIGN_OR_RETURN(
      std::unique_ptr<models::internal::DpSgdStepper> stepper,
      models::internal::DpSgdStepper::Create(ws, plan, options.train, dp.dp,
                                             rank == 0 ? dp.noise : nullptr, rank, world));
  // The exact sum is reduced as int64 (prepared once: its buffer is the stepper's for good). A
  // GPU's chunks must be computed before NCCL, on its own stream, reads them.
  const std::span<int64_t> units(stepper->units(), static_cast<size_t>(stepper->units_count()));
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<PreparedAllReduce> reduce_units,
                          c.PrepareAllReduceSum(units));
  const bool on_gpu = ws.backend().kind() != kernels::DeviceKind::kCpu;
  stepper->set_all_reduce([&]() -> Status {
    if (on_gpu) HUDDLE_RETURN_IF_ERROR(ws.backend().Synchronize());
    const auto start = SteadyTime::now();
    HUDDLE_RETURN_IF_ERROR(reduce_units->Run());
    stats->reduce_seconds += SecondsSince(start);
    stats->bytes_reduced += static_cast<int64_t>(units.size_bytes());
    return absl::OkStatus();
  });
  stats->buckets = 1;

  const int64_t m = dp.dp.expected_batch_size;
  const int64_t steps_per_epoch = std::max<int64_t>(1, (n + m - 1) / m);
  std::vector<int64_t> rows;  // the global sample
  // A resume continues at its step (a multiple of steps_per_epoch: checkpoints follow epochs).
  const int64_t first_step = stats->steps;
  int64_t epoch = first_step / steps_per_epoch, epoch_rows = 0;
  auto epoch_start = SteadyTime::now();
  ws.ResetTotals();
  for (int64_t step = first_step; step < plan.steps; ++step) {
    models::SamplePoissonBatch(n, m, sampling, &rows);
    HUDDLE_ASSIGN_OR_RETURN(const int64_t trained, stepper->Step(rows, step));
    ++stats->steps;
    stats->examples += trained;
    epoch_rows += static_cast<int64_t>(rows.size());
    HUDDLE_RETURN_IF_ERROR(after_step());
    if ((step + 1) % steps_per_epoch == 0 || step + 1 == plan.steps) {
      HUDDLE_RETURN_IF_ERROR(end_epoch(epoch, (plan.steps + steps_per_epoch - 1) / steps_per_epoch,
                                       epoch_start, static_cast<double>(epoch_rows)));
      ++epoch;
      epoch_rows = 0;
      epoch_start = SteadyTime::now();
      ws.ResetTotals();
    }
  }
  stats->dp_event = privacy::DpEvent{static_cast<double>(m) / static_cast<double>(n),
                                     dp.dp.noise_multiplier, plan.steps};
  stats->private_noise = dp.dp.noise_multiplier > 0 && shared.is_private != 0;
  return absl::OkStatus();
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
  return models::internal::CheckTrainOptions(options.train);
}

StatusOr<DataParallelStats> TrainDataParallel(Collective& collective, const models::ModelSpec& spec,
                                              const DataParallelOptions& options,
                                              const data::DatasetView& data, TensorList* params) {
  const auto start = SteadyTime::now();
  if (params == nullptr) return absl::InvalidArgumentError("TrainDataParallel: params is null");
  HUDDLE_RETURN_IF_ERROR(ValidateDataParallelOptions(options));
  HUDDLE_RETURN_IF_ERROR(models::internal::CheckModelAndData(spec, *params, data));

  kernels::FlushDenormalsScope flush_denormals;
  std::unique_ptr<kernels::Backend> owned;
  kernels::Backend& backend = models::internal::BackendFor(options.train, &owned);
  // Gloo reduces host memory, NCCL device memory: the training device must be where they look.
  const bool on_cpu = backend.kind() == kernels::DeviceKind::kCpu;
  if ((collective.backend() == "gloo") != on_cpu) {
    return absl::InvalidArgumentError(fmt::format(
        "a {} collective cannot reduce buffers of the {} backend (Gloo needs the CPU, NCCL a GPU)",
        collective.backend(), backend.name()));
  }
  const int world = collective.world_size();
  const int rank = collective.rank();
  const int64_t n = data.size();
  const int64_t global_batch =
      options.global_batch_size > 0 ? options.global_batch_size : options.train.batch_size * world;
  // The largest slice of a global batch.
  const int64_t batch = (global_batch + world - 1) / world;
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<NetWorkspace> ws,
                          NetWorkspace::Create(backend, spec, std::min(batch, n), true));
  HUDDLE_RETURN_IF_ERROR(ws->LoadData(data));
  if (options.dp_sgd) {
    if (rank == 0 && options.dp_sgd->noise == nullptr) {
      return absl::InvalidArgumentError("DP-SGD: rank 0 needs a noise source (dp_sgd.noise)");
    }
  }
  // A checkpoint that does not fit is refused after the agreement step, so that every rank
  // learns it (ShareResume).
  Status resume_fit;
  if (rank == 0 && options.resume != nullptr) {
    if (Status st = models::internal::CheckModelAndData(spec, options.resume->params, data);
        !st.ok()) {
      resume_fit = absl::FailedPreconditionError(
          absl::StrCat("the checkpoint does not fit this model: ", st.message()));
    }
  }
  const bool resuming = rank == 0 && options.resume != nullptr && resume_fit.ok();
  ws->UploadParams(resuming ? options.resume->params : *params);
  HUDDLE_ASSIGN_OR_RETURN(Scratch scratch, Scratch::Create(backend, world));
  HUDDLE_ASSIGN_OR_RETURN(kernels::DeviceBuffer factor, backend.Allocate(sizeof(float)));
  HUDDLE_RETURN_IF_ERROR(backend.Synchronize());

  // Same model, options and data everywhere, or no step at all.
  HUDDLE_RETURN_IF_ERROR(CheckAgreement(collective, scratch, spec, options, data));
  // Rank 0's parameters, everywhere (the gaps between parameters are zero on every rank).
  HUDDLE_RETURN_IF_ERROR(collective.Broadcast(
      std::span<std::byte>(reinterpret_cast<std::byte*>(ws->params_base()),
                           static_cast<size_t>(ws->params_span()) * sizeof(float)),
      0));
  Status refusal;
  HUDDLE_ASSIGN_OR_RETURN(const ResumeHeader resume,
                          ShareResume(collective, scratch, *ws, options, n, resume_fit, &refusal));
  HUDDLE_ASSIGN_OR_RETURN(StopVote stop_vote, StopVote::Create(collective, backend, options));
  // A resume within an epoch: rank 0 carries that epoch's totals so far into its end.
  std::array<double, 2> carried{0, 0};
  if (resuming && resume.epoch_rows > 0) {
    carried = {options.resume->epoch_loss_sum, options.resume->epoch_correct};
  }

  const kernels::SgdHyper hyper{static_cast<float>(options.train.learning_rate),
                                static_cast<float>(options.train.momentum),
                                static_cast<float>(options.train.weight_decay)};
  DataParallelStats stats;
  stats.steps = resume.steps;
  HUDDLE_ASSIGN_OR_RETURN(
      std::unique_ptr<BucketReducer> reducer_owner,
      BucketReducer::Create(collective, *ws,
                            PlanBuckets(*ws, options.first_bucket_bytes, options.bucket_bytes)));
  BucketReducer& reducer = *reducer_owner;
  stats.buckets = static_cast<int64_t>(reducer.buckets().size());
  const NetWorkspace::LayerDone reduce = [&](size_t l) { reducer.LayerDone(l); };
  // Batch norm over the global batch (at world size 1 the local batch is the global one).
  RankBatchNormSync sync_bn(collective, backend, reducer);
  if (world > 1) ws->set_batch_norm_sync(&sync_bn);
  std::vector<int64_t> order(static_cast<size_t>(n));
  float last_factor = std::nanf("");

  TrainingState state;  // rank 0's EpochReport::state
  // Rank 0's state after the current step (on_epoch, on_stop).
  const auto fill_state = [&](int64_t epochs_done, double seconds) -> Status {
    state.epochs_done = epochs_done;
    state.steps = stats.steps;
    state.seed = options.seed;
    state.world_size = world;
    state.batch_size = batch;
    state.seconds = seconds;
    state.dp_sgd = options.dp_sgd.has_value();
    state.epoch_rows = 0;
    state.epoch_loss_sum = state.epoch_correct = 0;
    if (state.params.empty()) state.params = *params;  // names and shapes
    HUDDLE_RETURN_IF_ERROR(ws->DownloadParams(&state.params));
    return ws->DownloadVelocity(&state.velocity);
  };
  // The epoch being trained and the rows of it done (for a stop within it).
  int64_t current_epoch = resume.epochs_done, current_rows = 0;
  // After each step: fault injection (tests), the periodic replica check, and the stop vote.
  const auto after_step = [&]() -> Status {
    if (options.after_step_for_testing) {
      options.after_step_for_testing(stats.steps, ws->params_base(), ws->params_span());
    }
    if (options.checksum_every > 0 && stats.steps % options.checksum_every == 0) {
      HUDDLE_RETURN_IF_ERROR(CheckReplicas(collective, *ws, scratch, stats.steps));
      ++stats.checksums;
    }
    HUDDLE_ASSIGN_OR_RETURN(const bool stop, stop_vote.StopAfter(stats.steps));
    if (!stop) return absl::OkStatus();
    if (!options.dp_sgd) {
      // The epoch's totals so far, over all ranks (every rank takes part), for the resume.
      HUDDLE_ASSIGN_OR_RETURN(const kernels::LossAccumulator totals, ws->ReadTotals());
      std::array<double, 2> global{totals.loss_sum + carried[0],
                                   static_cast<double>(totals.correct) + carried[1]};
      HUDDLE_RETURN_IF_ERROR(scratch.AllReduceSum(collective, global));
      if (options.state_on_rank0 && rank == 0 && options.on_stop) {
        HUDDLE_RETURN_IF_ERROR(fill_state(current_epoch, resume.seconds + SecondsSince(start)));
        state.epoch_rows = current_rows;
        state.epoch_loss_sum = global[0];
        state.epoch_correct = global[1];
        HUDDLE_RETURN_IF_ERROR(options.on_stop(state));
      }
    }
    return absl::CancelledError(
        fmt::format("stopped on request after step {} (rank {})", stats.steps, rank));
  };
  // After each epoch (its totals over `examples` rows of all ranks): loss and accuracy, the
  // divergence check, and the caller's callback with rank 0's state.
  const auto end_epoch = [&](int64_t epoch, int64_t epochs, SteadyTime::time_point epoch_start,
                             double examples) -> Status {
    HUDDLE_ASSIGN_OR_RETURN(const kernels::LossAccumulator totals, ws->ReadTotals());
    std::array<double, 2> global{totals.loss_sum + carried[0],
                                 static_cast<double>(totals.correct) + carried[1]};
    carried = {0, 0};
    HUDDLE_RETURN_IF_ERROR(scratch.AllReduceSum(collective, global));
    stats.loss = examples > 0 ? global[0] / examples : 0.0;
    stats.accuracy = examples > 0 ? global[1] / examples : 0.0;
    if (!std::isfinite(stats.loss)) {
      return absl::FailedPreconditionError(fmt::format(
          "training diverged: non-finite loss in epoch {} (learning_rate {} is probably too high)",
          epoch, options.train.learning_rate));
    }
    if (!options.on_epoch) return absl::OkStatus();
    EpochReport report{epoch,
                       stats.steps,
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
    return options.on_epoch(report);
  };

  if (options.dp_sgd) {
    HUDDLE_RETURN_IF_ERROR(
        RunDpSgd(collective, *ws, scratch, spec, options, n, after_step, end_epoch, &stats));
  }
  for (int64_t epoch = resume.epochs_done; !options.dp_sgd && epoch < options.train.epochs;
       ++epoch) {
    const auto epoch_start = SteadyTime::now();
    std::iota(order.begin(), order.end(), int64_t{0});
    Rng rng(DeriveSeed(options.seed, static_cast<uint64_t>(epoch)));
    rng.Shuffle(order);
    HUDDLE_RETURN_IF_ERROR(ws->SetOrder(order));
    ws->ResetTotals();
    current_epoch = epoch;
    // A resume within this epoch continues at the next global batch of its order.
    const int64_t first_row = epoch == resume.epochs_done ? resume.epoch_rows : 0;
    for (int64_t begin = first_row; begin < n; begin += global_batch) {
      // This rank's slice of the global batch [begin, begin + m).
      const int64_t m = std::min(global_batch, n - begin);
      const int64_t lo = m * rank / world, hi = m * (rank + 1) / world;
      const int64_t rows = hi - lo;
      // The loss gradient of the slice's mean loss times rows / m is that of the mean loss over
      // the global batch (rows / m is exactly 1/world, a power of two for 2 or 4 ranks, when the
      // slices are equal), so the gradients' sum over ranks is the global batch's gradient, and
      // batch norm's backward pass sees the gradient of one global loss, as it must. At world
      // size 1 the factor is exactly 1 and the pass is skipped.
      const float f = static_cast<float>(static_cast<double>(rows) / static_cast<double>(m));
      if (f != last_factor) {
        backend.CopyToDevice(factor.data(), &f, sizeof f);
        last_factor = f;
      }
      sync_bn.set_global_rows(m);
      reducer.StartStep();
      // A batch-norm model's rank takes part in the statistics' all-reduces even with no rows.
      if (rows > 0 || spec.has_batch_norm()) {
        if (rows > 0) ws->Gather(begin + lo, rows);
        ws->Forward(rows, /*training=*/true);
        const size_t last = ws->num_layers() - 1;
        if (world > 1 && rows > 0) {
          backend.ScaleRows(ws->layer_grad(last), 1, rows * ws->output_size(last),
                            factor.as<float>());
        }
        if (options.overlap) {
          ws->Backward(rows, reduce);
        } else {
          ws->Backward(rows);
          for (size_t l = ws->num_layers(); l-- > 0;) reduce(l);
        }
      } else {
        // Fewer rows than ranks in the last batch: this rank contributes zeros.
        backend.Zero(ws->grads_base(), ws->params_span() * static_cast<int64_t>(sizeof(float)));
        for (size_t l = ws->num_layers(); l-- > 0;) reducer.LayerDone(l);
      }
      HUDDLE_RETURN_IF_ERROR(reducer.FinishStep(&stats.wait_seconds));
      HUDDLE_RETURN_IF_ERROR(ws->Step(hyper));
      ++stats.steps;
      stats.examples += rows;
      current_rows = begin + m;
      HUDDLE_RETURN_IF_ERROR(after_step());
    }
    HUDDLE_RETURN_IF_ERROR(
        end_epoch(epoch, options.train.epochs, epoch_start, static_cast<double>(n)));
  }
  HUDDLE_RETURN_IF_ERROR(CheckReplicas(collective, *ws, scratch, stats.steps));
  ++stats.checksums;
  HUDDLE_RETURN_IF_ERROR(ws->DownloadParams(params));
  // (DP-SGD's int64 reductions are counted there already.)
  stats.reduce_seconds += reducer.reduce_seconds() + sync_bn.seconds();
  stats.bytes_reduced += reducer.bytes_reduced() + sync_bn.bytes();
  stats.seconds = SecondsSince(start);
  return stats;
}

}  // namespace huddle::datacenter
