// Example-level differentially private SGD (DP-SGD, Abadi et al. 2016) for the MLP of mlp.h.
//
// Each step is one release of the Poisson-subsampled Gaussian mechanism that privacy/accountant.h
// accounts for, with records = training examples:
//   1. Poisson sampling: every example of the view is included independently with probability
//      q = expected_batch_size / n (n = view size). The draws come from the NoiseSource, not from
//      a seeded Rng: amplification by sampling needs the batch to stay secret.
//   2. Each sampled example's gradient of its own loss, over ALL parameters taken as one vector,
//      is scaled by min(1, C / ||g_i||) (C = clip_norm), so its L2 norm is at most C.
//   3. The clipped gradients are summed and Gaussian noise of standard deviation at least z * C
//      (z = noise_multiplier) is added to every coordinate by privacy::AddDiscreteGaussianNoise,
//      with one privacy::NoiseGridFor(z, C, num_params) grid for the whole parameter vector (the
//      noise is exact and its grid rounding is accounted; see privacy/noise.h).
//   4. The noisy sum is divided by expected_batch_size (not by the realized batch size, which
//      would leak it) and TrainOptions' SGD step (learning rate, momentum, weight decay) is
//      applied. Momentum and weight decay only post-process released values. A step whose sample
//      is empty still adds the noise and takes the step.
// Removing or adding one example changes the noised sum by at most C, so T steps spend the
// privacy of DpEvent{q, z, T} (DpSgdStats::event()) under add/remove-one adjacency. The bound is
// exact for the real-valued algorithm; as in every float implementation (Opacus, TF Privacy), the
// float rounding of the gradient arithmetic itself (relative ~1e-7 per operation) is not
// accounted. The guarantee covers the trained parameters only: DpSgdStats' loss, accuracy and
// example count, a "diverged" error, and the call's running time are computed from the data
// without noise and must not be released as private.
//
// Per-example norms use the "ghost norm" identity, exact for dense layers: for layer input row a_i
// and output-gradient row d_i, the weight gradient d_i a_iᵀ has squared Frobenius norm
// ||d_i||² ||a_i||² and the bias gradient ||d_i||². Backpropagation is linear in each example's
// dLoss/dlogits row, so the clipped sum is one ordinary batched backward pass with every row of
// every layer's output gradient scaled by its example's clip factor. No per-example gradient is
// materialised. Cost: one non-private step of the same batch (1.06-1.16x measured for 784-128-10
// at batch 4096-256, the Poisson draws included) plus the noise, one exact discrete Gaussian draw
// per parameter per step (~0.12 us each: ~12 ms per step for 784-128-10's 101,770 parameters).
//
// On a GPU (TrainOptions::backend) the sampling still happens on the host from `noise` (the rows
// of each step travel in one small copy), and step 3's noise is the Gaussian of
// kernels/noise_stream.h, computed on the device from a ChaCha20 key drawn from `noise`, with
// standard deviation exactly z * C (no grid): a float Gaussian, not the exact discrete one (see
// docs/privacy.md). Divergence is detected from the running loss about once per pass over the
// data and from the final parameters.
//
// Thread-safety: stateless functions; concurrent calls are safe when they train different
// TensorLists and use different NoiseSources (a NoiseSource is single-threaded).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "models/mlp.h"
#include "privacy/accountant.h"
#include "privacy/noise.h"

namespace huddle::models {

struct DpSgdOptions {
  // z: the noise standard deviation on the summed clipped gradients is z * clip_norm (at least;
  // see privacy::NoiseGridFor). Finite and >= 0. 0 adds NO noise: the run is then NOT private
  // (tests and non-private baselines with clipping only); the accountant reports epsilon = inf.
  double noise_multiplier = 1.0;
  // C: per-example L2 bound over all parameters together, in gradient units. Finite and > 0.
  double clip_norm = 1.0;
  // Expected examples per step; the sampling rate is q = expected_batch_size / n. In [1, n].
  int64_t expected_batch_size = 256;
};

struct DpSgdStats {
  // loss / accuracy: means over every sampled example, each taken before its step's update (as in
  // TrainMlp). examples: sampled examples in total (about steps * expected_batch_size).
  // steps, seconds: as in TrainMlp.
  TrainStats train;
  int64_t steps = 0;            // steps taken (== train.steps)
  double sampling_rate = 0;     // q = expected_batch_size / n (rounded to double)
  double noise_multiplier = 0;  // z, as given
  bool private_noise = false;   // z > 0 and the NoiseSource was keyed from the OS (is_private)
  // What the run spent, for privacy::ComputeEpsilon: steps of the q-sampled Gaussian with z.
  privacy::DpEvent event() const { return {sampling_rate, noise_multiplier, steps}; }
};

// Trains *params in place with DP-SGD over the rows of `data` (the records being protected).
// Steps = round(options.epochs * n / expected_batch_size), at least 1: options.epochs is the
// expected number of passes over the data. options.batch_size is ignored (the batch is Poisson).
// learning_rate, momentum, weight_decay and clock are used as in TrainMlp. Subnormal floats are
// flushed to zero during the call.
// `noise` supplies the sampling and the noise; use privacy::NoiseSource::Secure() for a private
// run (a seeded source is reproducible but NOT private).
// Errors (InvalidArgument, *params untouched, nothing drawn from `noise`): invalid spec, options
// or dp options (the error names the field), params not matching the spec, an empty view,
// feature_dim != input_dim, a label outside [0, num_classes), or a noise grid NoiseGridFor
// rejects (e.g. z * sqrt(num_params) / 2 > 2^23).
// If the loss or a clipped gradient sum becomes non-finite, training stops with
// FailedPrecondition ("diverged") and *params hold the diverged values; discard them.
StatusOr<DpSgdStats> TrainMlpDpSgd(const MlpSpec& spec, const TrainOptions& options,
                                   const DpSgdOptions& dp, const data::DatasetView& data,
                                   privacy::NoiseSource& noise, TensorList* params);

// OK when DP-SGD can train `spec`; FailedPrecondition for a batch-norm model: batch
// normalization mixes the examples of a batch, so clipping each example's gradient would no longer
// bound its influence on the step. TrainMlpDpSgd and the data-parallel DP-SGD check it; configs
// check it when they are loaded.
Status CheckDpSgdModel(const MlpSpec& spec);

// One Poisson sample: *rows (cleared first) receives, in increasing order, every i in [0, n) for
// which an independent trial with probability exactly expected / n succeeded (a uniform variate
// compared with expected / n digit by digit in base 256, so exact; ~1 keystream byte per row).
// Requires 0 <= expected <= n; n >= 1.
void SamplePoissonBatch(int64_t n, int64_t expected, privacy::NoiseSource& noise,
                        std::vector<int64_t>* rows);

// The L2 norm, over all parameters together, of each example's gradient of its own softmax
// cross-entropy loss at `params`, in view order (the ghost-norm computation TrainMlpDpSgd clips
// with), computed batch_size rows at a time (>= 1; speed and memory only). For diagnostics and
// tests: the norms of private data are themselves NOT private. Errors as for EvaluateMlp, and
// CheckDpSgdModel's.
StatusOr<std::vector<double>> PerExampleGradientNorms(const MlpSpec& spec, const TensorList& params,
                                                      const data::DatasetView& data,
                                                      int64_t batch_size = 256);

}  // namespace huddle::models
