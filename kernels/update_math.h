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

}  // namespace huddle::kernels::update_math
