// Device building blocks of the normalisation kernels (kernels/cuda/batch_norm.cu, group_norm.cu)
// over [outer, planes, spatial]-shaped data. Internal to kernels/cuda/.
//   - WarpLaneSums: one warp sums a contiguous run in kernels/lane_sums.h's order (lane l strided
//     from l, then the shuffle tree), the same bits as the host's lane_sums::LaneSums;
//   - BlockOrderedPlaneSums: one block of kPlaneThreads folds the lane sums of planes
//     0 .. count - 1 in order (its warps sum kPlaneWarps planes at a time, thread 0 folds them);
//   - PlaneTile: the launch geometry of element-wise kernels over `planes` x `spatial` values,
//     2-D blocks whose x covers a plane's values (coalesced) and y several planes, so a thread
//     loads its plane's parameters once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/lane_sums.h"

namespace huddle::kernels::cuda {

inline constexpr int kPlaneWarps = 8;
inline constexpr int kPlaneThreads = kPlaneWarps * lane_sums::kLanes;

// Called by all 32 lanes of a warp (lane = threadIdx.x % 32) with the same n; the result is
// valid in lane 0 only. accumulate(i, &a, &b) as for lane_sums::LaneSums.
template <typename Accumulate>
__device__ inline lane_sums::Pair WarpLaneSums(int lane, int64_t n, const Accumulate& accumulate) {
  lane_sums::Pair p;
  for (int64_t i = lane; i < n; i += lane_sums::kLanes) accumulate(i, &p.a, &p.b);
  for (int o = lane_sums::kLanes / 2; o > 0; o /= 2) {
    p.a = hd::Add(p.a, __shfl_down_sync(0xffffffffu, p.a, o));
    p.b = hd::Add(p.b, __shfl_down_sync(0xffffffffu, p.b, o));
  }
  return p;
}

// Called by every thread of a block of kPlaneThreads: for k = 0 .. count - 1 in order, thread 0
// calls fold(k, sums of plane k), where plane k's sums are WarpLaneSums(spatial, term(k, ·)):
// term(k, s, &a, &b) adds value s of plane k. Ends with a barrier, so the block may reuse what
// fold wrote to shared memory.
template <typename Term, typename Fold>
__device__ inline void BlockOrderedPlaneSums(int64_t count, int64_t spatial, const Term& term,
                                             const Fold& fold) {
  __shared__ double partial_a[kPlaneWarps], partial_b[kPlaneWarps];
  const int warp = static_cast<int>(threadIdx.x) / lane_sums::kLanes;
  const int lane = static_cast<int>(threadIdx.x) % lane_sums::kLanes;
  for (int64_t k0 = 0; k0 < count; k0 += kPlaneWarps) {
    const int64_t k = k0 + warp;
    if (k < count) {
      const lane_sums::Pair p =
          WarpLaneSums(lane, spatial, [&](int64_t s, double* a, double* b) { term(k, s, a, b); });
      if (lane == 0) {
        partial_a[warp] = p.a;
        partial_b[warp] = p.b;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t planes = count - k0 < kPlaneWarps ? count - k0 : kPlaneWarps;
      for (int w = 0; w < planes; ++w) fold(k0 + w, lane_sums::Pair{partial_a[w], partial_b[w]});
    }
    __syncthreads();
  }
}

// Element-wise work over planes x spatial values: blockDim.x threads along a plane (the power of
// two that covers `spatial`, up to 256), blockDim.y = 256 / blockDim.x planes per block. Threads
// are numbered x first, so a warp covers consecutive planes when they are short (down to one
// value each): its loads stay on adjacent addresses.
struct PlaneTile {
  dim3 grid, block;
};

inline PlaneTile PlaneTileFor(int64_t planes, int64_t spatial) {
  int x = 1;
  while (x < kThreads && x < spatial) x *= 2;
  const int y = kThreads / x;
  return {dim3(BlocksFor(spatial, x), BlocksFor(planes, y)), dim3(x, y)};
}

__device__ inline int64_t TilePlane() {
  return static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
}
__device__ inline int64_t TilePlaneStride() { return static_cast<int64_t>(gridDim.y) * blockDim.y; }
__device__ inline int64_t TileValue() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t TileValueStride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace huddle::kernels::cuda
