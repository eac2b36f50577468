// Deterministic sums of a contiguous run of values in the shape of one CUDA warp: the summation
// order of the normalisation kernels (kernels/batch_norm.h for spatial > 1, kernels/group_norm.h),
// written once so that the CPU reference and the CUDA kernels add the same doubles in the same
// order and produce the same bits. Internal to kernels/.
//
// The order, for values v_0 .. v_{n-1} (each contributing a pair of doubles):
//   1. lane l in [0, 32) adds v_l, v_{l+32}, v_{l+64}, ... in index order, from 0;
//   2. the 32 lane totals are added pairwise as a tree: for o = 16, 8, 4, 2, 1, lane l < o
//      becomes lane[l] + lane[l + o]; lane 0 holds the result.
// On the GPU step 1 is one warp's strided, coalesced loop and step 2 its __shfl_down_sync tree
// (kernels/cuda/lane_sums.cuh); on the CPU both are the plain loops of LaneSums below.
//
// For n == 1 the result is the value itself (0 + v, then additions of 0): a single-value run is
// its own sum, which is what lets BatchNorm2d with spatial == 1 keep BatchNorm1d's bits.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace huddle::kernels::lane_sums {

inline constexpr int kLanes = 32;

// Two running sums, accumulated together.
struct Pair {
  double a = 0;
  double b = 0;
};

// Step 2 on the host: the tree over 32 lane totals (overwritten), lane 0's result.
inline Pair Tree(Pair* lanes) {
  for (int o = kLanes / 2; o > 0; o /= 2) {
    for (int l = 0; l < o; ++l) {
      lanes[l].a = hd::Add(lanes[l].a, lanes[l + o].a);
      lanes[l].b = hd::Add(lanes[l].b, lanes[l + o].b);
    }
  }
  return lanes[0];
}

// Steps 1 and 2 on the host for n >= 0 values: accumulate(i, &a, &b) adds value i's terms to a
// lane's running pair (it must use hd:: operations, as the device does).
template <typename Accumulate>
Pair LaneSums(int64_t n, const Accumulate& accumulate) {
  Pair lanes[kLanes];
  for (int64_t i = 0; i < n; ++i) {
    Pair& lane = lanes[i % kLanes];
    accumulate(i, &lane.a, &lane.b);
  }
  return Tree(lanes);
}

}  // namespace huddle::kernels::lane_sums
