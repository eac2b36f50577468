// The arithmetic of kernels/update.h, written once for the CPU reference and the CUDA kernels
// (HUDDLE_HD, hd:: operations only), so that both produce the same bits. Internal to kernels/.
//
// Summation order of the squared norm (a function of n alone, never of the GPU):
//   blocks    B = NormBlocks(n) <= kUpdatePipelineScratch, each of kNormThreads "lanes";
//   block b covers the chunk [b * L, min((b + 1) * L, n)) with L = ceil(n / B);
//   lane t of block b sums, in increasing order, the chunk's elements t, t + kNormThreads, ...;
//   the lanes are combined by the halving tree acc[t] += acc[t + s] for s = kNormThreads/2 .. 1;
//   the block totals are added in block order 0 .. B-1.
// The CUDA kernel runs exactly this (one thread per lane, the tree in shared memory); the CPU
// reference emulates the lanes.
#pragma once

#include <cstdint>

#include "kernels/hd.h"
#include "kernels/noise_stream.h"
#include "kernels/update.h"

namespace huddle::kernels::update_math {

inline constexpr int kNormThreads = 256;
// Clipping scales by C / norm times this, so that rounding v to float cannot push the L2 norm of
// the output above C (each element's relative rounding error is below 2^-24).
inline constexpr double kClipShrink = 1.0 - 0x1p-20;

HUDDLE_HD inline int64_t NormBlocks(int64_t n) {
  const int64_t per_block = int64_t{kNormThreads} * 16;  // at least 16 elements per lane
  int64_t blocks = (n + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > kUpdatePipelineScratch) blocks = kUpdatePipelineScratch;
  return blocks;
}

HUDDLE_HD inline int64_t ChunkLength(int64_t n, int64_t blocks) {
  return (n + blocks - 1) / blocks;
}

// double(local - global), the float difference the CPU client computes.
HUDDLE_HD inline double Delta(float local, float global) {
#if defined(__CUDA_ARCH__)
  return static_cast<double>(__fsub_rn(local, global));
#else
  return static_cast<double>(local - global);
#endif
}

// The clip factor for a squared norm (see kernels/update.h).
HUDDLE_HD inline double ClipScale(double squared_norm, double clip_norm, double* norm) {
  *norm = hd::Sqrt(squared_norm);
  if (!(*norm <= 1.7976931348623157e308)) return 0.0;  // NaN or inf: refuse (scale 0)
  if (clip_norm > 0 && *norm > clip_norm) return hd::Mul(hd::Div(clip_norm, *norm), kClipShrink);
  return 1.0;
}

// floor(v / quantum + r), r = bits * 2^-32 in [0, 1): rounds up with probability frac(v / quantum)
// (to 2^-32). Saturates to [-(2^31 - 1), 2^31 - 1] (NaN -> 0), counting into *saturated.
HUDDLE_HD inline int32_t StochasticRound(double v, double quantum, uint32_t bits,
                                         int64_t* saturated) {
  const double u = hd::Add(hd::Div(v, quantum), hd::Mul(static_cast<double>(bits), 0x1p-32));
  constexpr double kMax = 2147483647.0;
  if (!(u >= -kMax)) {  // below the range, or NaN
    ++*saturated;
    return u != u ? 0 : -2147483647;
  }
  if (u >= kMax + 1.0) {
    ++*saturated;
    return 2147483647;
  }
  // u in [-(2^31 - 1), 2^31): floor by truncation toward zero, corrected for negatives.
  auto t = static_cast<int64_t>(u);
  if (static_cast<double>(t) > u) --t;
  return static_cast<int32_t>(t);
}

// Writes element i's outputs for the pipeline value v; `rounding_bits` is the element's word of
// the rounding stream (read only when quantizing).
HUDDLE_HD inline void StoreOutput(const UpdatePipelineParams& p, double v, uint32_t rounding_bits,
                                  int64_t i, float* out_values, int32_t* out_units,
                                  int64_t* saturated) {
  if (!(p.quantum > 0)) {
    out_values[i] = static_cast<float>(v);
    return;
  }
  const int32_t units = StochasticRound(v, p.quantum, rounding_bits, saturated);
  out_units[i] = units;
  if (out_values != nullptr) {
    out_values[i] = static_cast<float>(hd::Mul(static_cast<double>(units), p.quantum));
  }
}

}  // namespace huddle::kernels::update_math
