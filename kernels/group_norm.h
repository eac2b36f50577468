// Group normalization (PyTorch's nn.GroupNorm) over NCHW data: the normaliser that suits DP-SGD,
// since each example's statistics are its own (no batch statistics mixing examples), so the
// per-example gradients that clipping needs exist.
//
// Layout: x, y, dy and dx are row-major float32 [batch, channels, spatial] (spatial = H * W, 1 for
// [batch, features] data); the channels are split into `groups` consecutive groups of
// channels / groups channels (groups divides channels). gamma, beta, dgamma and dbeta are float32
// [channels]; mean and invstd are float32 [batch, groups], the statistics the forward pass saves
// for the backward.
//
// Forward: for each example n and group g, over its L = (channels / groups) · spatial values
// (contiguous in memory):
//   mean   = Σ x / L,  var = max(Σ x² / L - mean², 0)   (biased, as PyTorch)
//   invstd = 1 / sqrt(var + eps)
//   y[n, c, s] = (x[n, c, s] - mean) · invstd · gamma[c] + beta[c]
// Backward, with xhat = (x - mean) · invstd and, for example n and channel c, its plane sums
// P_dy[n, c] = Σ_s dy[n, c, s] and P_dyx[n, c] = Σ_s dy[n, c, s] · xhat[n, c, s]:
//   dbeta[c]  = Σ_n P_dy[n, c],   dgamma[c] = Σ_n P_dyx[n, c]
//   dx[n, c, s] = invstd · (gamma[c] · dy[n, c, s] - A / L - xhat[n, c, s] · B / L)
// where A = Σ_{c in g} gamma[c] · P_dy[n, c] and B = Σ_{c in g} gamma[c] · P_dyx[n, c].
// Example n's own parameter gradient is dbeta_n[c] = P_dy[n, c], dgamma_n[c] = P_dyx[n, c].
//
// Arithmetic: in double, rounded to float once per output, with batch_norm_math's operations
// (kernels/batch_norm.h). Sums run in a fixed order: the values of a group (forward) or of a
// plane (backward) in kernels/lane_sums.h's order, then plane totals in channel order (A, B and
// the per-example norms) or example order (dgamma, dbeta). The CUDA kernels
// (kernels/cuda/group_norm.cu) follow the same order and give the same bits.
//
// Contract shared with kernels/dense.h: non-owning pointers to buffers of at least the documented
// size, caller-validated shapes, no failure, stateless and thread-safe on disjoint outputs.
// channels >= 1, spatial >= 1, 1 <= groups, groups divides channels; batch >= 0 (x, y, dy, dx,
// mean, invstd may be null when batch == 0).
#pragma once

#include <cstdint>

#include "kernels/batch_norm.h"
#include "kernels/hd.h"

namespace huddle::kernels {

struct GroupNormShape {
  int64_t batch = 0;
  int64_t channels = 0;
  int64_t spatial = 1;
  int64_t groups = 1;
};

// PyTorch's default for nn.GroupNorm.
inline constexpr double kGroupNormDefaultEps = 1e-5;

// y, mean and invstd as above; eps >= 0. y may be the same buffer as x (in place); otherwise they
// must not overlap.
void GroupNormForward(const GroupNormShape& s, const float* x, const float* gamma,
                      const float* beta, double eps, float* y, float* mean, float* invstd);

// dgamma and dbeta overwritten with the sums over the batch (zeros when batch == 0); dx
// overwritten unless it is nullptr (then the input gradient is skipped). mean and invstd are the
// forward's. dx may be the same buffer as dy or as x; otherwise outputs must not overlap inputs.
void GroupNormBackward(const GroupNormShape& s, const float* x, const float* dy, const float* gamma,
                       const float* mean, const float* invstd, float* dgamma, float* dbeta,
                       float* dx);

// DP-SGD's per-example clipping: squared_norms[n] += Σ_c (P_dyx[n, c]² + P_dy[n, c]²), example
// n's own parameter-gradient squared norm (gamma and beta), in double, channels in order.
void AddGroupNormSquaredNorms(const GroupNormShape& s, const float* x, const float* dy,
                              const float* mean, const float* invstd, double* squared_norms);

// The arithmetic above that batch_norm_math does not already hold, for the CPU reference and the
// CUDA kernels alike. Internal to kernels/.
namespace group_norm_math {

// The index of (example n, the group of channel c) into mean and invstd.
HUDDLE_HD inline int64_t StatIndex(const GroupNormShape& s, int64_t n, int64_t c) {
  return n * s.groups + c / (s.channels / s.groups);
}

// Adds gamma · P (the plane's sums) to the group's running A and B.
HUDDLE_HD inline void FoldGroupSums(float gamma, double plane_dy, double plane_dy_xhat, double* a,
                                    double* b) {
  *a = hd::Add(*a, hd::Mul(gamma, plane_dy));
  *b = hd::Add(*b, hd::Mul(gamma, plane_dy_xhat));
}

// Factors of a group's input gradient: dx = invstd · (gamma · dy - mean_a - xhat · mean_b).
struct InputGradientFactors {
  double mean_a;  // A / L
  double mean_b;  // B / L
};

HUDDLE_HD inline InputGradientFactors GradientFactors(double a, double b, double count) {
  return {hd::Div(a, count), hd::Div(b, count)};
}

HUDDLE_HD inline float InputGradient(float dy, float x, float mean, float invstd, float gamma,
                                     const InputGradientFactors& k) {
  const double centered = hd::Sub(hd::Sub(hd::Mul(gamma, dy), k.mean_a),
                                  hd::Mul(batch_norm_math::Normalized(x, mean, invstd), k.mean_b));
  return static_cast<float>(hd::Mul(invstd, centered));
}

// dgamma_n[c]² + dbeta_n[c]² from a plane's sums, added to an example's running norm.
HUDDLE_HD inline void FoldSquaredNorm(double plane_dy, double plane_dy_xhat, double* total) {
  *total =
      hd::Add(*total, hd::Add(hd::Mul(plane_dy_xhat, plane_dy_xhat), hd::Mul(plane_dy, plane_dy)));
}

}  // namespace group_norm_math
}  // namespace huddle::kernels
