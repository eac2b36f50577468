// Example-level differentially private SGD (DP-SGD, Abadi et al. 2016) for any model of
// models/model.h without a batch_norm layer.
//
// Each step is one release of the Poisson-subsampled Gaussian mechanism that privacy/accountant.h
// accounts for, with records = training examples:
//   1. Poisson sampling: every example of the view is included independently with probability
//      q = expected_batch_size / n (n = view size). The draws come from a ChaCha20 stream keyed by
//      the first 32 bytes drawn from the NoiseSource, not from a seeded Rng: amplification by
//      sampling needs the batch to stay secret.
//   2. Chunks: the example at view position i belongs to chunk floor(i * K / n), with
//      K = ceil(expected_batch_size / 256) fixed for the run: contiguous ranges of positions.
//      Each chunk's sampled examples are processed on their own (forward, backward, ghost norms,
//      clip factors and the clipped weight-gradient GEMMs over that chunk's rows only), so a
//      chunk's float result depends on its rows alone, never on the other chunks nor on which
//      data-parallel rank computes it.
//   3. Each sampled example's gradient of its own loss, over ALL parameters taken as one vector,
//      is scaled by min(1, C / ||g_i||) (C = clip_norm), so its L2 norm is at most C.
//   4. Exact sum: every chunk's sum of clipped gradients is rounded half to even to the grid
//      g = 2^e, coordinate by coordinate, and added as integers (units of g) into an int64
//      accumulator (kernels/grid_sum.h). Integer addition is exact and associative: the total
//      does not depend on how the chunks are grouped or reduced.
//   5. Noise: an integer drawn exactly from the discrete Gaussian N_Z(0, s)
//      (privacy::DiscreteGaussian, from the NoiseSource, on the host, whatever the device) is
//      added to every coordinate of the integer sum, once per step. The grid and s come from
//      privacy::NoiseGridFor(z, C, d, 2K) (z = noise_multiplier, d = num_params): the noise
//      standard deviation sqrt(s) g is at least z (C + K g sqrt(d)), and sqrt(s) >= 2^24.
//   6. Release: each coordinate's gradient is float((double(units) * g) / expected_batch_size):
//      three IEEE double operations (the product exact) and the rounding to float, each rounded
//      to nearest once, the same bits on every device (kernels/grid_sum.h). It post-processes
//      the noised integers, and divides by the expected, not the realized, batch size (which
//      would leak it). TrainOptions' SGD step (learning rate, momentum, weight decay) is then
//      applied: it only post-processes released values. A step whose sample is empty still adds
//      the noise and takes the step.
// Sensitivity. Adding or removing one example moves the sum of clipped gradients by at most C in
// L2. Rounding moves a chunk's sum by at most g sqrt(d) / 2, so the integer total (times g)
// differs from the sum of the chunks' float sums by at most K g sqrt(d) / 2; between
// neighbouring data sets (whose chunk boundaries may all shift when n changes) the integer
// totals therefore differ by at most C + K g sqrt(d), which the noise covers with multiplier z.
// (Where the example's position is merely emptied, only its own chunk changes and two roundings,
// g sqrt(d), would do.) Hence T steps spend the privacy of DpEvent{q, z, T} (DpSgdStats::event())
// under add/remove-one adjacency, for the float chunk sums as computed. Not accounted, as in every
// float implementation (Opacus, TF Privacy): the float rounding of the gradient arithmetic inside
// the chunks a neighbour changes (relative ~1e-7 per operation); every other chunk is computed bit
// for bit alike. Nothing leaks through the sum across chunks or ranks: it is exact. The guarantee
// covers the trained parameters only: DpSgdStats' loss, accuracy and example count, a "diverged"
// error, and the call's running time are computed from the data without noise and must not be
// released as private.
//
// Without noise (z = 0, not private) the grid is the finest on which a chunk's sum of up to
// ceil(n / K) examples of norm min(C, 256) fits with a factor 4 to spare; a chunk sum beyond
// that range, or non-finite, stops the run as diverged (as it does with noise, where the range
// is fixed by the grid: n / z must stay below about 2^35).
//
// Data parallelism (datacenter/data_parallel.h): rank r of W processes chunks
// [K r / W, K (r + 1) / W), rank 0 adds the noise, the int64 sums are all-reduced, and every
// rank converts the same integers: W ranks give bitwise this function's parameters for the same
// NoiseSource state (on the CPU; on GPUs when their GEMMs agree).
//
// Per-example norms use the "ghost norm" identity, exact for dense layers: for layer input row a_i
// and output-gradient row d_i, the weight gradient d_i a_iᵀ has squared Frobenius norm
// ||d_i||² ||a_i||² and the bias gradient ||d_i||². A convolution's per-example weight gradient
// is a sum over its P output positions, Σ_p d_p a_pᵀ over the unfolded input: its norm comes from
// the ghost form Σ_{p,q} <a_p,a_q><d_p,d_q> or from instantiating that one example's gradient,
// whichever costs less for the layer's shape (kernels/conv.h); group norm's from each example's
// own dgamma and dbeta. No layer but batch norm mixes examples. Backpropagation is linear in each
// example's dLoss/dlogits row, so a chunk's clipped sum is one ordinary batched backward pass with
// every row of every layer's output gradient scaled by its example's clip factor. No per-example
// gradient is materialised. Cost: one non-private step of the same batch in chunks of about 256
// rows, plus one pass over the parameters per chunk (the rounding to the grid) and the noise, one
// exact discrete Gaussian draw per parameter per step on the host (~0.12 us each: ~12 ms per step
// for 784-128-10's 101,770 parameters), drawn one step ahead on a second thread while the step's
// chunks are computed (the stream's draws, and so the released values, are the same as drawn in
// line; nothing is drawn past the run's last step).
//
// On a GPU (TrainOptions::backend) the chunks, the grid sums and the conversion run on the
// device (kernels/grid_sum.h, the same bits as the CPU reference); the sampling and the noise
// stay on the host, from `noise` (each step's rows travel in one small copy, its noise integers
// in one copy of 8 bytes per parameter, drawn one step ahead while the device computes), so the
// noise is the exact discrete Gaussian on every device. Divergence is detected from the running
// loss about once per pass over the data, from every step's grid sums, and from the final
// parameters.
//
// Thread-safety: stateless functions; concurrent calls are safe when they train different
// TensorLists and use different NoiseSources (a NoiseSource is single-threaded).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "models/model.h"
#include "privacy/accountant.h"
#include "privacy/noise.h"

namespace huddle::models {

struct DpSgdOptions {
  // z: the noise standard deviation on the summed clipped gradients is z * clip_norm (at least,
  // and z times the sensitivity with the grid's roundings; see above). Finite and >= 0. 0 adds
  // NO noise: the run is then NOT private (tests and non-private baselines with clipping only);
  // the accountant reports epsilon = inf.
  double noise_multiplier = 1.0;
  // C: per-example L2 bound over all parameters together, in gradient units. Finite and > 0.
  double clip_norm = 1.0;
  // Expected examples per step; the sampling rate is q = expected_batch_size / n. In [1, n].
  // It also sets the number of chunks, K = ceil(expected_batch_size / 256).
  int64_t expected_batch_size = 256;
};

struct DpSgdStats {
  // loss / accuracy: means over every sampled example, each taken before its step's update (as in
  // TrainModel). examples: sampled examples in total (about steps * expected_batch_size).
  // steps, seconds: as in TrainModel.
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
// learning_rate, momentum, weight_decay and clock are used as in TrainModel. Subnormal floats are
// flushed to zero during the call.
// `noise` supplies the sampling and the noise; use privacy::NoiseSource::Secure() for a private
// run (a seeded source is reproducible but NOT private).
// Errors (InvalidArgument, *params untouched, nothing drawn from `noise`): invalid spec, options
// or dp options (the error names the field), params not matching the spec, an empty view,
// feature_dim != input_dim, a label outside [0, num_classes), a noise grid NoiseGridFor
// rejects (e.g. z * K * sqrt(num_params) > 2^23), or a z so small that the exact sum could
// overflow (n / z above about 2^35).
// If the loss or a clipped gradient sum becomes non-finite (or leaves the exact sum's range),
// training stops with FailedPrecondition ("diverged") and *params hold the diverged values;
// discard them.
StatusOr<DpSgdStats> TrainDpSgd(const ModelSpec& spec, const TrainOptions& options,
                                const DpSgdOptions& dp, const data::DatasetView& data,
                                privacy::NoiseSource& noise, TensorList* params);

// OK when DP-SGD can train `spec`; FailedPrecondition for a batch-norm model: batch
// normalization mixes the examples of a batch, so clipping each example's gradient would no longer
// bound its influence on the step. TrainDpSgd and the data-parallel DP-SGD check it; configs
// check it when they are loaded.
Status CheckDpSgdModel(const ModelSpec& spec);

// The steps TrainDpSgd takes over n examples: round(epochs * n / expected_batch_size), half
// up, at least 1 (the run's DpEvent has these steps, for planning and budgets before training).
// InvalidArgument when expected_batch_size < 1 or the count overflows int64.
StatusOr<int64_t> DpSgdSteps(int64_t epochs, int64_t n, int64_t expected_batch_size);

// One Poisson sample: *rows (cleared first) receives, in increasing order, every i in [0, n) for
// which an independent trial with probability exactly expected / n succeeded (a uniform variate
// compared with expected / n digit by digit in base 256, so exact; ~1 keystream byte per row).
// Requires 0 <= expected <= n; n >= 1.
void SamplePoissonBatch(int64_t n, int64_t expected, privacy::NoiseSource& noise,
                        std::vector<int64_t>* rows);

// The L2 norm, over all parameters together, of each example's gradient of its own softmax
// cross-entropy loss at `params`, in view order (the ghost-norm computation TrainDpSgd clips
// with), computed batch_size rows at a time (>= 1; speed and memory only). For diagnostics and
// tests: the norms of private data are themselves NOT private. Errors as for EvaluateModel, and
// CheckDpSgdModel's.
StatusOr<std::vector<double>> PerExampleGradientNorms(const ModelSpec& spec,
                                                      const TensorList& params,
                                                      const data::DatasetView& data,
                                                      int64_t batch_size = 256);

}  // namespace huddle::models
