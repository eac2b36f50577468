// DP-SGD for the MLP: Poisson sampling, ghost-norm clipping, exact discrete Gaussian noise.
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
#include "models/internal/mlp_workspace.h"
#include "models/internal/train_loops.h"

namespace huddle::models {
namespace {

using internal::MlpWorkspace;

// After ws.Forward(training=true) on `batch` >= 1 rows, whose dlogits are the gradient of the MEAN
// loss (rows scaled by 1/batch): back-propagates into every ws.layer_grad(l) and writes each
// row's squared per-example gradient norm of the MEAN loss (all parameters) into squared[0, batch)
// (device memory; the per-example norm of its own loss is batch * sqrt(squared)). Clobbers the
// gradients of layers >= 1 (DenseBackward always forms them; they are small next to layer 0's,
// whose weight gradient is skipped).
void BackwardToLayerGrads(MlpWorkspace& ws, int64_t batch, double* squared) {
  kernels::Backend& backend = ws.backend();
  const size_t layers = ws.num_layers();
  for (size_t l = layers; l-- > 1;) {
    const kernels::DenseShape shape{batch, ws.width(l), ws.width(l + 1)};
    float* dinput = ws.layer_grad(l - 1);
    backend.DenseBackward(shape, ws.layer_output(l - 1), ws.param(2 * l), ws.layer_grad(l),
                          ws.grad(2 * l), ws.grad(2 * l + 1), dinput);
    backend.ReluBackward(ws.layer_output(l - 1), dinput, batch * ws.width(l));
  }
  // Layer l's per-example gradient is (d_i a_iᵀ, d_i): squared norm ||d_i||² (||a_i||² + 1).
  backend.Zero(squared, batch * static_cast<int64_t>(sizeof(double)));
  for (size_t l = 0; l < layers; ++l) {
    const float* a = l == 0 ? ws.input() : ws.layer_output(l - 1);
    backend.AddGhostSquaredNorms(a, ws.width(l), ws.layer_grad(l), ws.width(l + 1), batch, squared);
  }
}

// Turns the layer gradients left by BackwardToLayerGrads into the sum over the batch of the
// per-example gradients clipped to clip_norm, in ws.grad(): every row of every layer gradient is
// scaled by batch * min(1, clip_norm / norm_i) (batch undoes the mean's 1/batch), then one
// weight-gradient GEMM per layer.
void ClippedGradientSum(MlpWorkspace& ws, int64_t batch, const double* squared, double clip_norm,
                        float* factors) {
  kernels::Backend& backend = ws.backend();
  const auto b = static_cast<double>(batch);
  backend.ClipFactors(squared, batch, {b, clip_norm, b}, factors);
  for (size_t l = 0; l < ws.num_layers(); ++l) {
    backend.ScaleRows(ws.layer_grad(l), batch, ws.width(l + 1), factors);
    const kernels::DenseShape shape{batch, ws.width(l), ws.width(l + 1)};
    const float* input = l == 0 ? ws.input() : ws.layer_output(l - 1);
    backend.DenseBackward(shape, input, ws.param(2 * l), ws.layer_grad(l), ws.grad(2 * l),
                          ws.grad(2 * l + 1), nullptr);
  }
}

// A ChaCha20 key for the device noise stream, drawn from `noise` (private when it is).
kernels::NoiseKey DrawNoiseKey(privacy::NoiseSource& noise) {
  kernels::NoiseKey key;
  for (int w = 0; w < 8; w += 2) {
    const uint64_t bits = noise.NextU64();
    key.words[w] = static_cast<uint32_t>(bits);
    key.words[w + 1] = static_cast<uint32_t>(bits >> 32);
  }
  return key;
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

Status CheckDpSgdModel(const MlpSpec& spec) {
  if (!spec.batch_norm) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "DP-SGD cannot train a model with batch_norm: batch normalization mixes the examples of a "
      "batch, so clipping each example's gradient would not bound its influence; turn one off");
}

namespace internal {

StatusOr<DpSgdPlan> PlanDpSgd(const MlpSpec& spec, const TrainOptions& options,
                              const DpSgdOptions& dp, int64_t n) {
  TrainOptions checked = options;
  checked.batch_size = 1;  // unused here: the batch is Poisson-sampled
  HUDDLE_RETURN_IF_ERROR(CheckTrainOptions(checked));
  HUDDLE_RETURN_IF_ERROR(CheckDpOptions(dp, n));
  HUDDLE_RETURN_IF_ERROR(CheckDpSgdModel(spec));
  const int64_t m = dp.expected_batch_size;
  DpSgdPlan plan;
  plan.add_noise = dp.noise_multiplier > 0.0;
  if (plan.add_noise) {
    // Also on a GPU, which adds its own Gaussian: the same settings are accepted on every device.
    HUDDLE_ASSIGN_OR_RETURN(plan.grid, privacy::NoiseGridFor(dp.noise_multiplier, dp.clip_norm,
                                                             TotalElements(MlpLayout(spec))));
  }
  // round(epochs * n / m), half up; 128-bit so that no epochs * n overflows.
  const __int128 scaled = static_cast<__int128>(options.epochs) * n;
  const __int128 rounded = (scaled + m / 2) / m;
  if (rounded > std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("epochs is ", options.epochs, "; the number of steps overflows"));
  }
  plan.steps = std::max<int64_t>(1, static_cast<int64_t>(rounded));
  // Room for the sampled batch in all but ~1e-9 of steps (6 standard deviations and slack); a
  // larger sample grows the buffers: a sample is never truncated, which would void the guarantee.
  const auto cap =
      static_cast<int64_t>(static_cast<double>(m) + 6.0 * std::sqrt(static_cast<double>(m)) + 16.0);
  plan.capacity = std::min(cap, n);
  return plan;
}

DpSgdStepper::DpSgdStepper(MlpWorkspace& ws, const DpSgdPlan& plan, const TrainOptions& options,
                           const DpSgdOptions& dp, privacy::NoiseSource& noise)
    : ws_(&ws),
      plan_(plan),
      noise_(&noise),
      host_noise_(ws.backend().kind() == kernels::DeviceKind::kCpu),
      stddev_(dp.noise_multiplier * dp.clip_norm),
      clip_norm_(dp.clip_norm),
      divisor_(static_cast<double>(dp.expected_batch_size)),
      learning_rate_(options.learning_rate),
      hyper_{static_cast<float>(options.learning_rate), static_cast<float>(options.momentum),
             static_cast<float>(options.weight_decay)} {
  if (plan.add_noise && !host_noise_) key_ = DrawNoiseKey(noise);
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

Status DpSgdStepper::Step(int64_t batch, int64_t step) {
  HUDDLE_RETURN_IF_ERROR(NoisyGradient(batch, step));
  return ws_->Step(hyper_);
}

Status DpSgdStepper::NoisyGradient(int64_t batch, int64_t step) {
  MlpWorkspace& ws = *ws_;
  kernels::Backend& backend = ws.backend();
  if (batch > capacity_) {
    return absl::InternalError(
        absl::StrCat("DP-SGD step of ", batch, " rows with room for ", capacity_));
  }
  if (batch == 0) {
    for (size_t i = 0; i < ws.num_params(); ++i) {
      backend.Zero(ws.grad(i), ws.param_size(i) * static_cast<int64_t>(sizeof(float)));
    }
  } else {
    ws.Forward(batch, /*training=*/true);
    BackwardToLayerGrads(ws, batch, squared_.as<double>());
    ClippedGradientSum(ws, batch, squared_.as<double>(), clip_norm_, factors_.as<float>());
  }
  // Noise, then the division by the expected batch size (the realized size is secret).
  for (size_t i = 0; i < ws.num_params(); ++i) {
    const int64_t size = ws.param_size(i);
    if (!host_noise_) {
      backend.AddGaussianNoise(key_, noise_offset_, plan_.add_noise ? stddev_ : 0.0, divisor_,
                               ws.grad(i), size);
      noise_offset_ += static_cast<uint64_t>(size);
      continue;
    }
    const std::span<float> g(ws.grad(i), static_cast<size_t>(size));
    if (FirstNonFinite(g) >= 0) {
      return Diverged(step, learning_rate_, "non-finite clipped gradient sum");
    }
    if (plan_.add_noise) {
      const Status noised = privacy::AddDiscreteGaussianNoise(g, plan_.grid, *noise_);
      if (!noised.ok()) return Diverged(step, learning_rate_, std::string(noised.message()));
    }
    for (float& v : g) v = static_cast<float>(static_cast<double>(v) / divisor_);
  }
  return absl::OkStatus();
}

Status RunDpSgdSteps(MlpWorkspace& ws, const DpSgdPlan& plan, const TrainOptions& options,
                     const DpSgdOptions& dp, int64_t n, privacy::NoiseSource& noise,
                     DpSgdStats* stats) {
  const int64_t m = dp.expected_batch_size;
  DpSgdStepper stepper(ws, plan, options, dp, noise);
  HUDDLE_RETURN_IF_ERROR(stepper.Reserve(plan.capacity));
  // Divergence shows in the running loss; it is read (one wait) about once per pass over the data.
  const int64_t check_every = std::max<int64_t>(1, n / m);
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(plan.capacity));
  kernels::LossAccumulator totals;
  for (int64_t step = 0; step < plan.steps; ++step) {
    SamplePoissonBatch(n, m, noise, &rows);
    const auto batch = static_cast<int64_t>(rows.size());
    if (batch > 0) {
      HUDDLE_RETURN_IF_ERROR(stepper.Reserve(batch));
      HUDDLE_RETURN_IF_ERROR(ws.SetOrder(rows));
      ws.Gather(0, batch);
      stats->train.examples += batch;
    }
    HUDDLE_RETURN_IF_ERROR(stepper.Step(batch, step));
    ++stats->train.steps;
    if ((step + 1) % check_every == 0 || step + 1 == plan.steps) {
      HUDDLE_ASSIGN_OR_RETURN(totals, ws.ReadTotals());
      if (!std::isfinite(totals.loss_sum)) {
        return Diverged(step, options.learning_rate, "non-finite loss");
      }
    }
  }
  if (stats->train.examples > 0) {
    stats->train.loss = totals.loss_sum / static_cast<double>(stats->train.examples);
    stats->train.accuracy =
        static_cast<double>(totals.correct) / static_cast<double>(stats->train.examples);
  }
  stats->steps = stats->train.steps;
  stats->sampling_rate = static_cast<double>(m) / static_cast<double>(n);
  stats->noise_multiplier = dp.noise_multiplier;
  stats->private_noise = plan.add_noise && noise.is_private();
  return absl::OkStatus();
}

}  // namespace internal

StatusOr<DpSgdStats> TrainMlpDpSgd(const MlpSpec& spec, const TrainOptions& options,
                                   const DpSgdOptions& dp, const data::DatasetView& data,
                                   privacy::NoiseSource& noise, TensorList* params) {
  const Clock* clock = options.clock != nullptr ? options.clock : SteadyClock::Get();
  const int64_t start_ms = clock->NowMs();
  if (params == nullptr) return absl::InvalidArgumentError("TrainMlpDpSgd: params is null");
  HUDDLE_RETURN_IF_ERROR(internal::CheckModelAndData(spec, *params, data));
  const int64_t n = data.size();
  HUDDLE_ASSIGN_OR_RETURN(const internal::DpSgdPlan plan,
                          internal::PlanDpSgd(spec, options, dp, n));

  kernels::FlushDenormalsScope flush_denormals;
  std::unique_ptr<kernels::Backend> owned;
  kernels::Backend& backend = internal::BackendFor(options, &owned);
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<MlpWorkspace> ws,
                          MlpWorkspace::Create(backend, spec, plan.capacity, /*training=*/true));
  HUDDLE_RETURN_IF_ERROR(ws->LoadData(data));
  ws->UploadParams(*params);
  DpSgdStats stats;
  const Status run = internal::RunDpSgdSteps(*ws, plan, options, dp, n, noise, &stats);
  if (!run.ok() && !internal::IsDiverged(run)) return run;
  // The diverged values are handed back too, as documented.
  HUDDLE_RETURN_IF_ERROR(ws->DownloadParams(params));
  HUDDLE_RETURN_IF_ERROR(run);
  for (const Tensor& t : *params) {
    if (FirstNonFinite(t.data) >= 0) {
      return Diverged(plan.steps - 1, options.learning_rate, "non-finite parameters");
    }
  }
  stats.train.seconds = static_cast<double>(clock->NowMs() - start_ms) / 1000.0;
  return stats;
}

StatusOr<std::vector<double>> PerExampleGradientNorms(const MlpSpec& spec, const TensorList& params,
                                                      const data::DatasetView& data,
                                                      int64_t batch_size) {
  HUDDLE_RETURN_IF_ERROR(CheckDpSgdModel(spec));
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", batch_size, "; it must be >= 1"));
  }
  HUDDLE_RETURN_IF_ERROR(internal::CheckModelAndData(spec, params, data));
  kernels::FlushDenormalsScope flush_denormals;
  std::unique_ptr<kernels::Backend> backend = kernels::OpenCpuBackend();
  const int64_t n = data.size();
  const int64_t max_batch = std::min(batch_size, n);
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<MlpWorkspace> ws,
                          MlpWorkspace::Create(*backend, spec, max_batch, /*training=*/true));
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
    BackwardToLayerGrads(*ws, batch, squared);
    for (int64_t i = 0; i < batch; ++i) {
      squared[i] = static_cast<double>(batch) * std::sqrt(squared[i]);  // undo the mean's 1/batch
    }
  }
  return norms;
}

}  // namespace huddle::models
