// DP-SGD for the MLP: Poisson sampling, ghost-norm clipping, exact discrete Gaussian noise.
#include "models/dp_sgd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>

#include "kernels/activation.h"
#include "kernels/dense.h"
#include "kernels/flush_denormals.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "models/internal/mlp_workspace.h"

namespace huddle::models {
namespace {

using internal::MlpWorkspace;

// sum of v[i]^2 in double; four accumulators break the add dependency chain.
double SquaredNorm(const float* v, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double{v[i]} * v[i];
    s1 += double{v[i + 1]} * v[i + 1];
    s2 += double{v[i + 2]} * v[i + 2];
    s3 += double{v[i + 3]} * v[i + 3];
  }
  for (; i < n; ++i) s0 += double{v[i]} * v[i];
  return (s0 + s1) + (s2 + s3);
}

// After ws.Forward(training=true) on `batch` >= 1 rows, whose dlogits are the gradient of the MEAN
// loss (rows scaled by 1/batch): back-propagates into every ws.layer_grad(l) and writes each
// row's per-example gradient norm (of its own loss, all parameters) into norms[0, batch).
// Clobbers ws.grads() of layers >= 1 (DenseBackward always forms them; they are small next to
// layer 0's, whose weight gradient is skipped).
void BackwardToLayerGrads(MlpWorkspace& ws, const TensorList& params, int64_t batch,
                          double* norms) {
  const size_t layers = ws.num_layers();
  for (size_t l = layers; l-- > 1;) {
    const kernels::DenseShape shape{batch, ws.width(l), ws.width(l + 1)};
    float* dinput = ws.layer_grad(l - 1);
    kernels::DenseBackward(shape, ws.layer_output(l - 1), params[2 * l].data.data(),
                           ws.layer_grad(l), ws.grads()[2 * l].data(), ws.grads()[2 * l + 1].data(),
                           dinput);
    kernels::ReluBackward(ws.layer_output(l - 1), dinput, batch * ws.width(l));
  }
  // Layer l's per-example gradient is (d_i a_iᵀ, d_i): squared norm ||d_i||² (||a_i||² + 1).
  for (int64_t i = 0; i < batch; ++i) {
    double squared = 0;
    for (size_t l = 0; l < layers; ++l) {
      const int64_t in = ws.width(l), out = ws.width(l + 1);
      const float* a = l == 0 ? ws.input() + i * in : ws.layer_output(l - 1) + i * in;
      squared += SquaredNorm(ws.layer_grad(l) + i * out, out) * (SquaredNorm(a, in) + 1.0);
    }
    norms[i] = static_cast<double>(batch) * std::sqrt(squared);  // undo the 1/batch of the mean
  }
}

// Turns the layer gradients left by BackwardToLayerGrads into the sum over the batch of the
// per-example gradients clipped to clip_norm, in ws.grads(): every row of every layer gradient is
// scaled by batch * min(1, clip_norm / norm) (batch undoes the mean's 1/batch), then one
// weight-gradient GEMM per layer.
void ClippedGradientSum(MlpWorkspace& ws, const TensorList& params, int64_t batch,
                        const double* norms, double clip_norm) {
  const size_t layers = ws.num_layers();
  for (int64_t i = 0; i < batch; ++i) {
    const double clip = norms[i] > clip_norm ? clip_norm / norms[i] : 1.0;
    const auto factor = static_cast<float>(static_cast<double>(batch) * clip);
    for (size_t l = 0; l < layers; ++l) {
      const int64_t out = ws.width(l + 1);
      float* d = ws.layer_grad(l) + i * out;
      for (int64_t k = 0; k < out; ++k) d[k] *= factor;
    }
  }
  for (size_t l = 0; l < layers; ++l) {
    const kernels::DenseShape shape{batch, ws.width(l), ws.width(l + 1)};
    const float* input = l == 0 ? ws.input() : ws.layer_output(l - 1);
    kernels::DenseBackward(shape, input, params[2 * l].data.data(), ws.layer_grad(l),
                           ws.grads()[2 * l].data(), ws.grads()[2 * l + 1].data(), nullptr);
  }
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
  if (n > int64_t{UINT32_MAX}) {
    const auto un = static_cast<uint64_t>(n), ue = static_cast<uint64_t>(expected);
    for (int64_t i = 0; i < n; ++i) {
      if (noise.UniformBelow(un) < ue) rows->push_back(i);
    }
    return;
  }
  // Same draws on 32 bits, two per NextU64 (half the keystream): Lemire's multiply-shift
  // x * n / 2^32 is exactly uniform on [0, n) once the low words below 2^32 mod n are rejected.
  const auto n32 = static_cast<uint32_t>(n), e32 = static_cast<uint32_t>(expected);
  const uint32_t reject_below = (0u - n32) % n32;  // 2^32 mod n
  uint64_t word = 0;
  bool have_half = false;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t product;
    do {
      uint32_t bits;
      if (have_half) {
        bits = static_cast<uint32_t>(word >> 32);
      } else {
        word = noise.NextU64();
        bits = static_cast<uint32_t>(word);
      }
      have_half = !have_half;
      product = uint64_t{bits} * n32;
    } while (static_cast<uint32_t>(product) < reject_below);
    if (static_cast<uint32_t>(product >> 32) < e32) rows->push_back(i);
  }
}

StatusOr<DpSgdStats> TrainMlpDpSgd(const MlpSpec& spec, const TrainOptions& options,
                                   const DpSgdOptions& dp, const data::DatasetView& data,
                                   privacy::NoiseSource& noise, TensorList* params) {
  const Clock* clock = options.clock != nullptr ? options.clock : SteadyClock::Get();
  const int64_t start_ms = clock->NowMs();
  if (params == nullptr) return absl::InvalidArgumentError("TrainMlpDpSgd: params is null");
  TrainOptions checked = options;
  checked.batch_size = 1;  // unused here: the batch is Poisson-sampled
  HUDDLE_RETURN_IF_ERROR(internal::CheckTrainOptions(checked));
  HUDDLE_RETURN_IF_ERROR(internal::CheckModelAndData(spec, *params, data));
  const int64_t n = data.size();
  HUDDLE_RETURN_IF_ERROR(CheckDpOptions(dp, n));
  const int64_t m = dp.expected_batch_size;
  const int64_t num_params = TotalElements(MlpLayout(spec));
  const bool add_noise = dp.noise_multiplier > 0.0;
  privacy::NoiseGrid grid;
  if (add_noise) {
    HUDDLE_ASSIGN_OR_RETURN(grid,
                            privacy::NoiseGridFor(dp.noise_multiplier, dp.clip_norm, num_params));
  }
  // round(epochs * n / m), half up; 128-bit so that no epochs * n overflows.
  const __int128 scaled = static_cast<__int128>(options.epochs) * n;
  const __int128 rounded = (scaled + m / 2) / m;
  if (rounded > std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("epochs is ", options.epochs, "; the number of steps overflows"));
  }
  const int64_t steps = std::max<int64_t>(1, static_cast<int64_t>(rounded));

  kernels::FlushDenormalsScope flush_denormals;
  // Room for the sampled batch in all but ~1e-9 of steps (6 standard deviations and slack); a
  // larger sample grows the buffers: a sample is never truncated, which would void the guarantee.
  const auto cap =
      static_cast<int64_t>(static_cast<double>(m) + 6.0 * std::sqrt(static_cast<double>(m)) + 16.0);
  MlpWorkspace workspace(spec, std::min(cap, n), /*training=*/true);
  const kernels::SgdHyper hyper{static_cast<float>(options.learning_rate),
                                static_cast<float>(options.momentum),
                                static_cast<float>(options.weight_decay)};
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(workspace.capacity()));
  std::vector<double> norms(static_cast<size_t>(workspace.capacity()));
  double loss_sum = 0.0;
  int64_t correct = 0;
  DpSgdStats stats;
  for (int64_t step = 0; step < steps; ++step) {
    SamplePoissonBatch(n, m, noise, &rows);
    const auto batch = static_cast<int64_t>(rows.size());
    if (batch > workspace.capacity()) {
      workspace.Reserve(batch);
      norms.resize(static_cast<size_t>(batch));
    }
    if (batch == 0) {
      for (auto& g : workspace.grads()) std::fill(g.begin(), g.end(), 0.0f);
    } else {
      workspace.Gather(data, rows, 0, batch);
      const kernels::LossTotals totals = workspace.Forward(*params, batch, /*training=*/true);
      if (!std::isfinite(totals.loss_sum)) {
        return absl::FailedPreconditionError(
            absl::StrCat("training diverged: non-finite loss at step ", step, " (learning_rate ",
                         options.learning_rate, " is probably too high)"));
      }
      BackwardToLayerGrads(workspace, *params, batch, norms.data());
      ClippedGradientSum(workspace, *params, batch, norms.data(), dp.clip_norm);
      loss_sum += totals.loss_sum;
      correct += totals.correct;
      stats.train.examples += batch;
    }
    for (auto& g : workspace.grads()) {
      if (FirstNonFinite(g) >= 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("training diverged: non-finite clipped gradient sum at step ", step,
                         " (learning_rate ", options.learning_rate, " is probably too high)"));
      }
    }
    for (auto& g : workspace.grads()) {
      if (add_noise) {
        const Status noised = privacy::AddDiscreteGaussianNoise(g, grid, noise);
        if (!noised.ok()) {
          return absl::FailedPreconditionError(
              absl::StrCat("training diverged at step ", step, ": ", noised.message()));
        }
      }
      // Divide by the expected batch size: the realized size is secret. Rounded once.
      for (float& v : g) v = static_cast<float>(static_cast<double>(v) / static_cast<double>(m));
    }
    workspace.Step(hyper, params);
    ++stats.train.steps;
  }
  if (stats.train.examples > 0) {
    stats.train.loss = loss_sum / static_cast<double>(stats.train.examples);
    stats.train.accuracy = static_cast<double>(correct) / static_cast<double>(stats.train.examples);
  }
  stats.train.seconds = static_cast<double>(clock->NowMs() - start_ms) / 1000.0;
  stats.steps = stats.train.steps;
  stats.sampling_rate = static_cast<double>(m) / static_cast<double>(n);
  stats.noise_multiplier = dp.noise_multiplier;
  stats.private_noise = add_noise && noise.is_private();
  return stats;
}

StatusOr<std::vector<double>> PerExampleGradientNorms(const MlpSpec& spec, const TensorList& params,
                                                      const data::DatasetView& data,
                                                      int64_t batch_size) {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", batch_size, "; it must be >= 1"));
  }
  HUDDLE_RETURN_IF_ERROR(internal::CheckModelAndData(spec, params, data));
  kernels::FlushDenormalsScope flush_denormals;
  const int64_t n = data.size();
  const int64_t max_batch = std::min(batch_size, n);
  MlpWorkspace workspace(spec, max_batch, /*training=*/true);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::vector<double> norms(static_cast<size_t>(n));
  for (int64_t begin = 0; begin < n; begin += max_batch) {
    const int64_t batch = std::min(max_batch, n - begin);
    workspace.Gather(data, order, begin, batch);
    workspace.Forward(params, batch, /*training=*/true);
    BackwardToLayerGrads(workspace, params, batch, norms.data() + begin);
  }
  return norms;
}

}  // namespace huddle::models
