// Batch normalization over the rows of a minibatch (PyTorch's nn.BatchNorm1d on [batch, features],
// and nn.BatchNorm2d on NCHW data [batch, channels, spatial = H * W]), split into steps so that
// data-parallel ranks can share the statistics (SyncBatchNorm).
//
// Layout: x, y, dy and dx are row-major float32 [batch, features, spatial] (spatial = 1 for
// BatchNorm1d; for BatchNorm2d a "feature" is a channel); mean, invstd, var, gamma, beta and the
// running statistics are float32 [features]. Every per-feature statistic is over the
// batch * spatial values of that feature, and a "count" is that number of values per feature
// (summed over the ranks). A "sums" buffer is double [2, features]: row 0 holds per-feature sums
// of one quantity, row 1 of another, so one all-reduce of 2 * features doubles moves all of a
// step's statistics.
//
// A training step on each of R ranks, rank k holding b_k rows of the global batch, N = Σ b_k ·
// spatial values per feature (R = 1 is ordinary batch norm: the all-reduces are then identities
// and may be skipped):
//   forward
//     1. BatchNormSums(x_k)                       -> local sums   [Σ x, Σ x²]
//     2. all-reduce (sum) the sums                -> global sums
//     3. BatchNormMoments(global sums, N, eps)    -> mean, invstd (the same bits on every rank:
//                                                    a pure function of its inputs)
//     4. BatchNormUpdateRunning(global sums, N, momentum, running_mean, running_var)
//     5. BatchNormForward(x_k, mean, invstd, gamma, beta) -> y_k
//   backward, given dy_k = dLoss/dy_k
//     6. BatchNormBackwardSums(dy_k, x_k, mean, invstd)   -> local sums [Σ dy, Σ dy·xhat],
//        which are exactly this rank's dbeta (row 0) and dgamma (row 1): copy them out
//        (BatchNormParamGrads) before the all-reduce and combine them across ranks like any other
//        parameter gradient (using the all-reduced values instead would count them R times)
//     7. all-reduce (sum) the sums                -> global sums
//     8. BatchNormBackwardInput(dy_k, x_k, mean, invstd, gamma, global sums, N) -> dx_k
// dy on every rank must be the gradient of one global loss (e.g. the mean over all N rows): a
// per-rank mean loss must be rescaled by b_k / N before step 6, not after step 8. A rank with no
// rows (b_k = 0) still takes part: its sums are zeros and steps 5 and 8 do nothing. N >= 1 is the
// caller's to guarantee.
// Evaluation uses the running statistics instead of steps 1-4:
//   BatchNormInvStd(running_var, eps) -> invstd;  BatchNormForward(x, running_mean, invstd, ...).
//
// Arithmetic: sums accumulate in double in a fixed order, so they are deterministic and every
// backend produces the same bits (the CUDA kernels follow the same order): for each row r in
// order 0 .. batch - 1, the plane x[r, f, 0 .. spatial - 1] is summed in kernels/lane_sums.h's
// order (32 strided lanes, then a tree) and that plane total is added to the feature's sum. A
// plane of one value is its own total, so with spatial = 1 this is a plain sum in row order, the
// same bits as BatchNorm1d always had. Everything per element or per feature is computed in
// double by the functions of batch_norm_math below, shared with the CUDA kernels, and rounded to
// float once at the end. The variance is E[x²] - mean² (biased, as PyTorch normalises with),
// clamped at 0: its absolute error is about N · 2^-53 · E[x²], so it stays float-accurate while
// N · (1 + mean²/var) < 2^29.
//
// Contract shared with kernels/dense.h: non-owning pointers to buffers of at least the documented
// size, caller-validated shapes, no failure, stateless and thread-safe on disjoint outputs.
// features >= 1, spatial >= 1; batch >= 0, and x, y, dy, dx may be null when batch == 0. Outputs
// must not overlap inputs except where stated.
//
// Backends: the CPU reference is batch_norm_cpu.cc; kernels/cuda/batch_norm.cu holds the CUDA
// versions (launchers in kernels/cuda/batch_norm.h), written to produce the same bits (the same
// operations in the same order); tests/kernels/backend_parity_test.cc (spatial = 1) and
// norm_parity_test.cc (spatial > 1) confirm it on a GPU.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace huddle::kernels {

// PyTorch's defaults for nn.BatchNorm1d.
inline constexpr double kBatchNormDefaultEps = 1e-5;      // added to the variance
inline constexpr double kBatchNormDefaultMomentum = 0.1;  // weight of the new batch statistic

// sums[f] = Σ_{r,s} x[r, f, s] and sums[features + f] = Σ_{r,s} x[r, f, s]², in double, in the
// order above. sums [2 * features] is overwritten (zeros when batch == 0).
void BatchNormSums(const float* x, int64_t batch, int64_t features, int64_t spatial, double* sums);

// Statistics of `count` >= 1 values per feature from their sums (BatchNormSums, possibly
// all-reduced):
//   mean[f]   = sums[f] / count
//   var       = max(sums[features + f] / count - mean², 0)       (biased)
//   invstd[f] = 1 / sqrt(var + eps)
// computed in double, each output rounded to float once. eps >= 0; eps == 0 gives inf for a
// constant feature.
void BatchNormMoments(const double* sums, int64_t count, int64_t features, double eps, float* mean,
                      float* invstd);

// PyTorch's running-statistics update from the same sums and count (count >= 1):
//   running_mean = (1 - momentum) · running_mean + momentum · mean
//   running_var  = (1 - momentum) · running_var  + momentum · var · count / (count - 1)
// (the unbiased variance; the biased one when count == 1), in double, rounded to float in place.
void BatchNormUpdateRunning(const double* sums, int64_t count, int64_t features, double momentum,
                            float* running_mean, float* running_var);

// invstd[f] = 1 / sqrt(max(var[f], 0) + eps) for evaluation with the running variance. invstd may
// be the same buffer as var.
void BatchNormInvStd(const float* var, int64_t features, double eps, float* invstd);

// y[r, f, s] = (x[r, f, s] - mean[f]) · invstd[f] · gamma[f] + beta[f]. y may be the same buffer
// as x (in place); otherwise they must not overlap.
void BatchNormForward(const float* x, int64_t batch, int64_t features, int64_t spatial,
                      const float* mean, const float* invstd, const float* gamma, const float* beta,
                      float* y);

// With xhat[r, f, s] = (x[r, f, s] - mean[f]) · invstd[f] (the normalised input of the forward
// pass):
//   sums[f]            = Σ_{r,s} dy[r, f, s]                 (dbeta of these rows)
//   sums[features + f] = Σ_{r,s} dy[r, f, s] · xhat[r, f, s] (dgamma of these rows)
// in double, in the order above. sums [2 * features] is overwritten (zeros when batch == 0).
void BatchNormBackwardSums(const float* dy, const float* x, const float* mean, const float* invstd,
                           int64_t batch, int64_t features, int64_t spatial, double* sums);

// This rank's parameter gradients from its backward sums (before they are all-reduced), each
// rounded to float once: dbeta[f] = sums[f], dgamma[f] = sums[features + f].
void BatchNormParamGrads(const double* sums, int64_t features, float* dgamma, float* dbeta);

// The input gradient given the global backward sums of all `count` values per feature (count
// >= 1; count = N, the global batch times spatial):
//   dx[r, f, s] = gamma[f] · invstd[f] · (dy[r, f, s] - sums[f] / count
//                                         - xhat[r, f, s] · sums[features + f] / count)
// for this rank's `batch` rows. dx may be the same buffer as dy or as x (in place); otherwise it
// must not overlap them.
void BatchNormBackwardInput(const float* dy, const float* x, const float* mean, const float* invstd,
                            const float* gamma, const double* sums, int64_t count, int64_t batch,
                            int64_t features, int64_t spatial, float* dx);

// The arithmetic of the functions above, written once for the CPU reference and the CUDA kernels
// (HUDDLE_HD, hd:: operations only, so nothing is fused into a multiply-add on one side only).
// Internal to kernels/: callers use the functions above.
namespace batch_norm_math {

// Adds x and x² to the running sums (x² of a float is exact in double).
HUDDLE_HD inline void AccumulateSums(float x, double* sum, double* sum_sq) {
  const double v = x;
  *sum = hd::Add(*sum, v);
  *sum_sq = hd::Add(*sum_sq, hd::Mul(v, v));
}

// The biased variance from sums, clamped at 0 (NaN passes through).
HUDDLE_HD inline double Variance(double sum, double sum_sq, double count, double* mean) {
  *mean = hd::Div(sum, count);
  const double var = hd::Sub(hd::Div(sum_sq, count), hd::Mul(*mean, *mean));
  return var < 0 ? 0.0 : var;
}

// count / (count - 1), turning the biased variance of count rows into the unbiased one (1 when
// count == 1).
HUDDLE_HD inline double UnbiasFactor(int64_t count) {
  const auto n = static_cast<double>(count);
  return count > 1 ? hd::Div(n, hd::Sub(n, 1.0)) : 1.0;
}

HUDDLE_HD inline double InvStd(double var, double eps) {
  return hd::Div(1.0, hd::Sqrt(hd::Add(var < 0 ? 0.0 : var, eps)));
}

// (1 - momentum) · running + momentum · stat.
HUDDLE_HD inline float Blend(float running, double stat, double momentum) {
  return static_cast<float>(
      hd::Add(hd::Mul(hd::Sub(1.0, momentum), running), hd::Mul(momentum, stat)));
}

HUDDLE_HD inline double Normalized(float x, float mean, float invstd) {
  return hd::Mul(hd::Sub(x, mean), invstd);
}

HUDDLE_HD inline float ForwardValue(float x, float mean, float invstd, float gamma, float beta) {
  return static_cast<float>(hd::Add(hd::Mul(Normalized(x, mean, invstd), gamma), beta));
}

// Adds dy and dy · xhat to the running backward sums.
HUDDLE_HD inline void AccumulateBackwardSums(float dy, float x, float mean, float invstd,
                                             double* sum_dy, double* sum_dy_xhat) {
  *sum_dy = hd::Add(*sum_dy, dy);
  *sum_dy_xhat = hd::Add(*sum_dy_xhat, hd::Mul(dy, Normalized(x, mean, invstd)));
}

// Per-feature factors of the input gradient: dx = scale · (dy - mean_dy - xhat · mean_dy_xhat).
struct InputGradientFactors {
  double scale;         // gamma · invstd (exact: a product of two floats)
  double mean_dy;       // Σ dy / count
  double mean_dy_xhat;  // Σ dy · xhat / count
};

HUDDLE_HD inline InputGradientFactors GradientFactors(float gamma, float invstd, double sum_dy,
                                                      double sum_dy_xhat, double count) {
  return {hd::Mul(gamma, invstd), hd::Div(sum_dy, count), hd::Div(sum_dy_xhat, count)};
}

HUDDLE_HD inline float InputGradient(float dy, float x, float mean, float invstd,
                                     const InputGradientFactors& k) {
  const double centered =
      hd::Sub(hd::Sub(dy, k.mean_dy), hd::Mul(Normalized(x, mean, invstd), k.mean_dy_xhat));
  return static_cast<float>(hd::Mul(k.scale, centered));
}

}  // namespace batch_norm_math
}  // namespace huddle::kernels
