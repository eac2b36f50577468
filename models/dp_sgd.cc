// DP-SGD: Poisson sampling, per-example clipping without per-example gradients, exact discrete
// Gaussian noise.
#include "models/dp_sgd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>

#include "kernels/backend.h"
#include "kernels/flush_denormals.h"
#include "models/internal/net_workspace.h"
#include "models/internal/train_loops.h"
#include "models/trainer.h"

namespace huddle::models {
namespace {

using internal::NetWorkspace;

// Turns the per-example squared norms of the mean loss left by ws.BackwardForNorms into the sum
// over the batch of the per-example gradients clipped to clip_norm, in ws.grad(): the factors are
// batch * min(1, clip_norm / norm_i) (batch undoes the mean's 1/batch).
void ClippedGradientSum(NetWorkspace& ws, int64_t batch, const double* squared, double clip_norm,
                        float* factors) {
  const auto b = static_cast<double>(batch);
  ws.backend().ClipFactors(squared, batch, {b, clip_norm, b}, factors);
  ws.ClippedGradientSum(batch, factors);
}

Status Diverged(int64_t step, double learning_rate, const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat("training diverged: ", what, " at step ", step,
                                                    " (learning_rate ", learning_rate,
                                                    " is probably too high)"));
}

Status CheckDpOptions(const DpSgdOptions& dp, int64_t n) {
  if (!(dp.noise_multiplier >= 0.0 && std::isfinite(dp.noise_multiplier))) {
    return absl::InvalidArgumentError(
        absl::StrCat("noise_multiplier is ", dp.noise_multiplier, "; it must be finite and >= 0"));
  }
  if (!(dp.clip_norm > 0.0 && std::isfinite(dp.clip_norm))) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip_norm is ", dp.clip_norm, "; it must be positive and finite"));
  }
  if (dp.expected_batch_size < 1 || dp.expected_batch_size > n) {
    return absl::InvalidArgumentError(absl::StrCat("expected_batch_size is ",
                                                   dp.expected_batch_size, "; it must be in [1, ",
                                                   n, "] (the number of examples)"));
  }
  return absl::OkStatus();
}

}  // namespace

void SamplePoissonBatch(int64_t n, int64_t expected, privacy::NoiseSource& noise,
                        std::vector<int64_t>* rows) {
  rows->clear();
  if (expected <= 0) return;
  if (expected >= n) {
    for (int64_t i = 0; i < n; ++i) rows->push_back(i);
    return;
  }
  // Each trial compares a uniform U in [0, 1), revealed one random byte at a time, with
  // p = expected / n written in base 256: U < p iff at the first byte where they differ U's is
  // smaller. p's first byte is floor(256 p); after a tie its next byte comes from the long
  // division's remainder. A trial almost always ends at its first byte (a tie has probability
  // 1/256), so the sample costs ~1 keystream byte per example instead of a 32-bit draw.
  using u128 = unsigned __int128;
  const auto un = static_cast<u128>(n);
  const auto first_digit = static_cast<uint32_t>(u128{256} * static_cast<u128>(expected) / un);
  const u128 first_rest = u128{256} * static_cast<u128>(expected) - u128{first_digit} * un;
  // A tie's further bytes come from their own words (they are as random as any others).
  uint64_t tie_word = 0;
  int tie_bytes = 0;
  auto tie_byte = [&] {
    if (tie_bytes == 0) {
      tie_word = noise.NextU64();
      tie_bytes = 8;
    }
    const auto byte = static_cast<uint32_t>(tie_word & 0xff);
    tie_word >>= 8;
    --tie_bytes;
    return byte;
  };
  for (int64_t begin = 0; begin < n; begin += 8) {
    uint64_t word = noise.NextU64();
    const int64_t end = std::min(n, begin + 8);
    for (int64_t i = begin; i < end; ++i, word >>= 8) {
      uint32_t byte = static_cast<uint32_t>(word & 0xff);
      if (byte != first_digit) {
        if (byte < first_digit) rows->push_back(i);
        continue;
      }
      uint32_t digit = first_digit;
      u128 rest = first_rest;  // p's remaining fraction is rest / n, in units of this byte
      while (byte == digit && rest != 0) {
        digit = static_cast<uint32_t>(u128{256} * rest / un);
        rest = u128{256} * rest - u128{digit} * un;
        byte = tie_byte();
      }
      // A tie with nothing left of p (rest == 0) means U >= p: no success.
      if (byte < digit) rows->push_back(i);
    }
  }
}

StatusOr<int64_t> DpSgdSteps(int64_t epochs, int64_t n, int64_t expected_batch_size) {
  const int64_t m = expected_batch_size;
  if (m < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected_batch_size is ", m, "; it must be >= 1"));
  }
  // round(epochs * n / m), half up; 128-bit so that no epochs * n overflows.
  const __int128 rounded = (static_cast<__int128>(epochs) * n + m / 2) / m;
  if (rounded > std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("epochs is ", epochs, "; the number of steps overflows"));
  }
  return std::max<int64_t>(1, static_cast<int64_t>(rounded));
}

Status CheckDpSgdModel(const ModelSpec& spec) {
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  if (!spec.has_batch_norm()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "DP-SGD cannot train a model with a batch_norm layer: batch normalization mixes the examples "
      "of a "
      "batch, so clipping each example's gradient would not bound its influence; use group_norm "
      "(per example) instead, or train without DP-SGD");
}

namespace internal {

namespace {

constexpr double k2To62 = 4611686018427387904.0;  // 2^62
// Per-example gradient norms the grid of a run WITHOUT noise assumes at most (its clip norm when
// smaller): a clip norm of 1e30 ("no clipping") must not make that grid useless.
constexpr double kNoiselessNormBound = 256.0;

// Whether the sum of a chunk of at most `rows` clipped gradients of L2 norm at most `norm` (so at
// most rows * norm on any coordinate) fits `limit` units of the grid 2^exponent with a factor 4
// to spare: for the float error of the chunk's GEMM sums (below a third of the sum of the terms'
// magnitudes for up to 2^22 rows) and the rounding of the clip factors.
bool ChunkFits(int64_t rows, double norm, int exponent, double limit) {
  const long double worst =
      std::ldexp(4.0L * static_cast<long double>(rows) * static_cast<long double>(norm), -exponent);
  return worst <= static_cast<long double>(limit);
}

}  // namespace

StatusOr<DpSgdPlan> PlanDpSgd(const ModelSpec& spec, const TrainOptions& options,
                              const DpSgdOptions& dp, int64_t n) {
  TrainOptions checked = options;
  checked.batch_size = 1;  // unused here: the batch is Poisson-sampled
  HUDDLE_RETURN_IF_ERROR(CheckTrainOptions(checked));
  HUDDLE_RETURN_IF_ERROR(CheckDpOptions(dp, n));
  HUDDLE_RETURN_IF_ERROR(CheckDpSgdModel(spec));
  const int64_t m = dp.expected_batch_size;
  DpSgdPlan plan;
  plan.n = n;
  plan.chunks = (m + kDpSgdChunkRows - 1) / kDpSgdChunkRows;  // <= ceil(n / 256) <= n
  plan.chunk_limit = k2To62 / static_cast<double>(plan.chunks);
  plan.add_noise = dp.noise_multiplier > 0.0;
  const int64_t dim = TotalElements(Layout(spec));
  const int64_t chunk_rows = (n + plan.chunks - 1) / plan.chunks;  // the longest chunk range
  if (plan.add_noise) {
    // Every chunk's rounding may change between neighbouring data sets: 2K roundings.
    HUDDLE_ASSIGN_OR_RETURN(
        plan.grid, privacy::NoiseGridFor(dp.noise_multiplier, dp.clip_norm, dim, 2 * plan.chunks));
    if (!ChunkFits(chunk_rows, dp.clip_norm, plan.grid.exponent, plan.chunk_limit)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "noise_multiplier is ", dp.noise_multiplier, "; for ", n,
          " examples it must be larger: on its noise grid 2^", plan.grid.exponent,
          " the exact sum of a step could need more than 63 bits (n / noise_multiplier must stay "
          "below about 2^35)"));
    }
  } else {
    // The finest grid on which the chunks' sums fit.
    const double norm = std::min(dp.clip_norm, kNoiselessNormBound);
    const double ratio = 4.0 * static_cast<double>(chunk_rows) * norm / plan.chunk_limit;
    int e = ratio > 0 ? std::max(-1100, std::ilogb(ratio)) : -1100;
    while (!ChunkFits(chunk_rows, norm, e, plan.chunk_limit)) ++e;
    while (ChunkFits(chunk_rows, norm, e - 1, plan.chunk_limit)) --e;
    if (e < -1000 || e > 1000) {
      return absl::InvalidArgumentError(absl::StrCat(
          "clip_norm is ", dp.clip_norm, "; its exact-sum grid 2^", e, " is out of range"));
    }
    plan.grid.exponent = e;
  }
  HUDDLE_ASSIGN_OR_RETURN(plan.steps, DpSgdSteps(options.epochs, n, m));
  // Room for a chunk's sample in all but ~1e-9 of steps (6 standard deviations and slack); a
  // larger one grows the buffers: a sample is never truncated, which would void the guarantee.
  const double per_chunk = static_cast<double>(m) / static_cast<double>(plan.chunks);
  const auto cap = static_cast<int64_t>(per_chunk + 6.0 * std::sqrt(per_chunk) + 16.0);
  plan.capacity = std::min(cap, chunk_rows);
  return plan;
}

std::array<unsigned char, 32> DrawSamplingKey(privacy::NoiseSource& noise) {
  std::array<unsigned char, 32> key{};
  for (size_t w = 0; w < 4; ++w) {
    const uint64_t bits = noise.NextU64();
    for (size_t i = 0; i < 8; ++i) key[8 * w + i] = static_cast<unsigned char>(bits >> (8 * i));
  }
  return key;
}

DpSgdStepper::DpSgdStepper(NetWorkspace& ws, const DpSgdPlan& plan, const TrainOptions& options,
                           const DpSgdOptions& dp, privacy::NoiseSource* noise, int rank, int world)
    : ws_(&ws),
      plan_(plan),
      noise_(plan.add_noise && rank == 0 ? noise : nullptr),
      world_(world),
      first_chunk_(plan.chunks * rank / world),
      end_chunk_(plan.chunks * (rank + 1) / world),
      span_(ws.trainable_span()),
      clip_norm_(dp.clip_norm),
      divisor_(static_cast<double>(dp.expected_batch_size)),
      learning_rate_(options.learning_rate),
      hyper_{static_cast<float>(options.learning_rate), static_cast<float>(options.momentum),
             static_cast<float>(options.weight_decay)} {}

StatusOr<std::unique_ptr<DpSgdStepper>> DpSgdStepper::Create(
    NetWorkspace& ws, const DpSgdPlan& plan, const TrainOptions& options, const DpSgdOptions& dp,
    privacy::NoiseSource* noise, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("DP-SGD rank ", rank, " of ", world));
  }
  if (plan.add_noise && rank == 0 && noise == nullptr) {
    return absl::InvalidArgumentError("DP-SGD: rank 0 needs a noise source");
  }
  std::unique_ptr<DpSgdStepper> stepper(
      new DpSgdStepper(ws, plan, options, dp, noise, rank, world));
  kernels::Backend& backend = ws.backend();
  const auto kUnit = static_cast<int64_t>(sizeof(int64_t));
  HUDDLE_ASSIGN_OR_RETURN(stepper->units_, backend.Allocate((stepper->span_ + 1) * kUnit));
  if (stepper->noise_ != nullptr) {
    HUDDLE_ASSIGN_OR_RETURN(const privacy::DiscreteGaussian gaussian,
                            privacy::DiscreteGaussian::Create(plan.grid.variance));
    stepper->gaussian_ = gaussian;
    HUDDLE_ASSIGN_OR_RETURN(stepper->noise_units_, backend.Allocate(stepper->span_ * kUnit));
    stepper->noise_host_.assign(static_cast<size_t>(stepper->span_), 0);
    stepper->noise_next_.assign(static_cast<size_t>(stepper->span_), 0);
  }
  HUDDLE_RETURN_IF_ERROR(stepper->Reserve(plan.capacity));
  return stepper;
}

DpSgdStepper::~DpSgdStepper() {
  if (prefetch_.joinable()) prefetch_.join();
}

void DpSgdStepper::DrawNoise(std::vector<int64_t>& out) {
  for (size_t i = 0; i < ws_->num_trainable(); ++i) {
    int64_t* param = out.data() + ws_->param_offset(i);
    for (int64_t k = 0; k < ws_->param_size(i); ++k) param[k] = gaussian_->Sample(*noise_);
  }
}

Status DpSgdStepper::Reserve(int64_t rows) {
  if (rows <= capacity_) return absl::OkStatus();
  kernels::Backend& backend = ws_->backend();
  HUDDLE_RETURN_IF_ERROR(ws_->Reserve(rows));
  HUDDLE_ASSIGN_OR_RETURN(squared_, backend.Allocate(rows * static_cast<int64_t>(sizeof(double))));
  HUDDLE_ASSIGN_OR_RETURN(factors_, backend.Allocate(rows * static_cast<int64_t>(sizeof(float))));
  capacity_ = rows;
  return absl::OkStatus();
}

StatusOr<int64_t> DpSgdStepper::Step(const std::vector<int64_t>& sample, int64_t step) {
  HUDDLE_ASSIGN_OR_RETURN(const int64_t rows, Gradient(sample, step));
  HUDDLE_RETURN_IF_ERROR(ws_->Step(hyper_));
  return rows;
}

StatusOr<int64_t> DpSgdStepper::Gradient(const std::vector<int64_t>& sample, int64_t step) {
  NetWorkspace& ws = *ws_;
  kernels::Backend& backend = ws.backend();
  const int exponent = plan_.grid.exponent;
  int64_t* units = units_.as<int64_t>();
  backend.Zero(units, (span_ + 1) * static_cast<int64_t>(sizeof(int64_t)));
  // This rank's rows: the sample's positions inside its chunks' ranges (contiguous in `sample`).
  const auto begin =
      std::lower_bound(sample.begin(), sample.end(), plan_.chunk_begin(first_chunk_));
  const auto end = std::lower_bound(begin, sample.end(), plan_.chunk_begin(end_chunk_));
  mine_.assign(begin, end);
  if (!mine_.empty()) HUDDLE_RETURN_IF_ERROR(ws.SetOrder(mine_));
  // Each chunk on its own rows: the clipped sum into ws.grad(), then onto the grid. Dropout masks
  // are drawn by the step and each row's position in the whole sample, as one process draws
  // them, whichever rank computes the chunk.
  const auto mine_first = static_cast<int64_t>(begin - sample.begin());
  auto next = mine_.begin();
  for (int64_t j = first_chunk_; j < end_chunk_ && next != mine_.end(); ++j) {
    const auto chunk_end = std::lower_bound(next, mine_.end(), plan_.chunk_begin(j + 1));
    const auto rows = static_cast<int64_t>(chunk_end - next);
    if (rows > 0) {
      HUDDLE_RETURN_IF_ERROR(Reserve(rows));
      ws.Gather(static_cast<int64_t>(next - mine_.begin()), rows);
      ws.set_dropout_pass(static_cast<uint64_t>(step));
      ws.set_dropout_first_row(mine_first + static_cast<int64_t>(next - mine_.begin()));
      ws.Forward(rows, /*training=*/true);
      ws.BackwardForNorms(rows, squared_.as<double>());
      ClippedGradientSum(ws, rows, squared_.as<double>(), clip_norm_, factors_.as<float>());
      backend.AccumulateOnGrid(ws.grads_base(), span_, exponent, plan_.chunk_limit, units,
                               units + span_);
    }
    next = chunk_end;
  }
  // The noise, once per step (rank 0): the next draws of the noise stream, in the same order
  // however they are scheduled. They were drawn on a second thread while this step's chunks were
  // computed (after the previous step), or, for a run's first step, are drawn now, while a GPU
  // computes the chunks.
  if (noise_ != nullptr) {
    if (prefetch_.joinable()) {
      prefetch_.join();
      std::swap(noise_host_, noise_next_);
    } else {
      DrawNoise(noise_host_);
    }
    // (A GPU's copy is done before the buffer is drawn into again: the step's CopyToHost below
    // waits for the stream.)
    backend.CopyToDevice(noise_units_.data(), noise_host_.data(),
                         span_ * static_cast<int64_t>(sizeof(int64_t)));
    backend.AddUnits(noise_units_.as<int64_t>(), span_, units);
    // The run's next step's noise, from here on (never past the run's last step: the source's
    // later draws stay the caller's).
    if (step + 1 < plan_.steps) prefetch_ = std::thread([this] { DrawNoise(noise_next_); });
  }
  if (world_ > 1) {
    if (!all_reduce_) return absl::InternalError("DP-SGD: a rank's stepper has no all-reduce");
    HUDDLE_RETURN_IF_ERROR(all_reduce_());
  }
  int64_t rejected = 0;
  HUDDLE_RETURN_IF_ERROR(backend.CopyToHost(&rejected, units + span_, sizeof rejected));
  if (rejected != 0) {
    return Diverged(step, learning_rate_,
                    absl::StrCat(rejected,
                                 " clipped gradient sum value(s) not finite or beyond "
                                 "the exact sum's range"));
  }
  // The release: post-processing of the noised integers, the same bits on every rank.
  backend.UnitsToFloat(units, span_, exponent, divisor_, ws.grads_base());
  return static_cast<int64_t>(mine_.size());
}
Status RunDpSgdSteps(Trainer& trainer, const TrainOptions& options, const DpSgdOptions& dp,
                     int64_t n, privacy::NoiseSource& noise, DpSgdStats* stats) {
  const int64_t m = dp.expected_batch_size;
  privacy::NoiseSource sampling =
      privacy::NoiseSource::FromSharedKey(DrawSamplingKey(noise), noise.is_private());
  EpochTotals totals;
  // Divergence shows in the running loss, read (one wait) once per pass over the data.
  HUDDLE_RETURN_IF_ERROR(
      trainer.TrainDpSgd(0, sampling, {}, [&](int64_t /*epoch*/, int64_t /*rows*/) -> Status {
        HUDDLE_ASSIGN_OR_RETURN(const bool finite, totals.Add(trainer));
        return finite ? absl::OkStatus()
                      : Diverged(trainer.steps() - 1, options.learning_rate, "non-finite loss");
      }));
  stats->train.steps = trainer.steps();
  stats->train.examples = trainer.examples();
  if (stats->train.examples > 0) {
    stats->train.loss = totals.loss_sum / static_cast<double>(stats->train.examples);
    stats->train.accuracy = totals.correct / static_cast<double>(stats->train.examples);
  }
  stats->steps = stats->train.steps;
  stats->sampling_rate = static_cast<double>(m) / static_cast<double>(n);
  stats->noise_multiplier = dp.noise_multiplier;
  stats->private_noise = dp.noise_multiplier > 0 && noise.is_private();
  return absl::OkStatus();
}

}  // namespace internal

StatusOr<DpSgdStats> TrainDpSgd(const ModelSpec& spec, const TrainOptions& options,
                                const DpSgdOptions& dp, const data::DatasetView& data,
                                privacy::NoiseSource& noise, TensorList* params) {
  const Clock* clock = options.clock != nullptr ? options.clock : SteadyClock::Get();
  const int64_t start_ms = clock->NowMs();
  if (params == nullptr) return absl::InvalidArgumentError("TrainDpSgd: params is null");
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  HUDDLE_RETURN_IF_ERROR(CheckParams(spec, *params));  // the data: Trainer::Create

  kernels::FlushDenormalsScope flush_denormals;
  Trainer::Loop loop;
  loop.dp_sgd = dp;
  loop.noise = &noise;
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                          Trainer::Create(spec, options, data, loop));
  trainer->UploadParams(*params);
  DpSgdStats stats;
  const Status run = internal::RunDpSgdSteps(*trainer, options, dp, data.size(), noise, &stats);
  if (!run.ok() && !internal::IsDiverged(run)) return run;
  // The diverged values are handed back too, as documented.
  HUDDLE_RETURN_IF_ERROR(trainer->DownloadParams(params));
  HUDDLE_RETURN_IF_ERROR(run);
  for (const Tensor& t : *params) {
    if (FirstNonFinite(t.data) >= 0) {
      return Diverged(trainer->dp_steps() - 1, options.learning_rate, "non-finite parameters");
    }
  }
  stats.train.seconds = static_cast<double>(clock->NowMs() - start_ms) / 1000.0;
  return stats;
}

StatusOr<std::vector<double>> PerExampleGradientNorms(const ModelSpec& spec,
                                                      const TensorList& params,
                                                      const data::DatasetView& data,
                                                      int64_t batch_size) {
  HUDDLE_RETURN_IF_ERROR(CheckDpSgdModel(spec));
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", batch_size, "; it must be >= 1"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckModelAndData(spec, params, data));
  kernels::FlushDenormalsScope flush_denormals;
  std::unique_ptr<kernels::Backend> backend = kernels::OpenCpuBackend();
  const int64_t n = data.size();
  const int64_t max_batch = std::min(batch_size, n);
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<NetWorkspace> ws,
                          NetWorkspace::Create(*backend, spec, max_batch, /*training=*/true));
  HUDDLE_RETURN_IF_ERROR(ws->LoadData(data));
  ws->UploadParams(params);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  HUDDLE_RETURN_IF_ERROR(ws->SetOrder(order));
  std::vector<double> norms(static_cast<size_t>(n));
  for (int64_t begin = 0; begin < n; begin += max_batch) {
    const int64_t batch = std::min(max_batch, n - begin);
    ws->Gather(begin, batch);
    ws->Forward(batch, /*training=*/true);
    double* squared = norms.data() + begin;  // host memory is the CPU backend's memory
    ws->BackwardForNorms(batch, squared);
    for (int64_t i = 0; i < batch; ++i) {
      squared[i] = static_cast<double>(batch) * std::sqrt(squared[i]);  // undo the mean's 1/batch
    }
  }
  return norms;
}

}  // namespace huddle::models
