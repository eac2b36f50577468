// CUDA version of kernels/group_norm.h, in the CPU reference's summation order and arithmetic
// (batch_norm_math, group_norm_math), so every output is meant to be the same bits:
//   - statistics (StatsKernel): one warp per (example, group), its L contiguous values summed in
//     kernels/lane_sums.h's order;
//   - forward values: PlaneTile blocks (kernels/cuda/planes.cuh), plane p = n · channels + c,
//     whose statistics sit at p / (channels / groups);
//   - dgamma, dbeta (ParamGradsKernel): one block per channel, its warps summing the examples'
//     planes and thread 0 adding the plane totals in example order;
//   - dx (InputGradKernel): one block per (example, group): A and B folded over the group's
//     planes in channel order, then the group's values written; it runs after ParamGradsKernel
//     and reads its whole group before writing, so dx may be dy or x;
//   - per-example norms (SquaredNormsKernel): one block per example, planes in channel order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/planes.cuh"
#include "kernels/group_norm.h"

namespace huddle::kernels::cuda {
namespace {

namespace bm = batch_norm_math;
namespace gm = group_norm_math;

__global__ void StatsKernel(GroupNormShape s, const float* __restrict__ x, double eps,
                            float* __restrict__ mean, float* __restrict__ invstd) {
  const int lane = static_cast<int>(threadIdx.x) % lane_sums::kLanes;
  const int64_t warps = GridThreads() / lane_sums::kLanes;
  const int64_t count = s.channels / s.groups * s.spatial;  // L
  for (int64_t w = GlobalThread() / lane_sums::kLanes; w < s.batch * s.groups; w += warps) {
    const float* group = x + w * count;  // (n, g) = w: [channels / groups, spatial]
    const lane_sums::Pair p = WarpLaneSums(
        lane, count, [&](int64_t i, double* a, double* b) { bm::AccumulateSums(group[i], a, b); });
    if (lane == 0) {
      double m = 0;
      const double var = bm::Variance(p.a, p.b, static_cast<double>(count), &m);
      mean[w] = static_cast<float>(m);
      invstd[w] = static_cast<float>(bm::InvStd(var, eps));
    }
  }
}

// y may be x (not __restrict__): each element is read before it is written, by the same thread.
__global__ void ForwardKernel(GroupNormShape s, const float* x, const float* __restrict__ gamma,
                              const float* __restrict__ beta, const float* __restrict__ mean,
                              const float* __restrict__ invstd, float* y) {
  const int64_t per_group = s.channels / s.groups;
  for (int64_t p = TilePlane(); p < s.batch * s.channels; p += TilePlaneStride()) {
    const int64_t c = p % s.channels, stat = p / per_group;
    const float m = mean[stat], k = invstd[stat], g = gamma[c], b = beta[c];
    for (int64_t v = TileValue(); v < s.spatial; v += TileValueStride()) {
      const int64_t i = p * s.spatial + v;
      y[i] = bm::ForwardValue(x[i], m, k, g, b);
    }
  }
}

__global__ void ParamGradsKernel(GroupNormShape s, const float* __restrict__ x,
                                 const float* __restrict__ dy, const float* __restrict__ mean,
                                 const float* __restrict__ invstd, float* __restrict__ dgamma,
                                 float* __restrict__ dbeta) {
  for (int64_t c = blockIdx.x; c < s.channels; c += gridDim.x) {
    lane_sums::Pair total;  // thread 0's
    BlockOrderedPlaneSums(
        s.batch, s.spatial,
        [&](int64_t n, int64_t v, double* a, double* b) {
          const int64_t stat = gm::StatIndex(s, n, c), i = (n * s.channels + c) * s.spatial + v;
          bm::AccumulateBackwardSums(dy[i], x[i], mean[stat], invstd[stat], a, b);
        },
        [&](int64_t, lane_sums::Pair p) {
          total.a = hd::Add(total.a, p.a);
          total.b = hd::Add(total.b, p.b);
        });
    if (threadIdx.x == 0) {
      dbeta[c] = static_cast<float>(total.a);
      dgamma[c] = static_cast<float>(total.b);
    }
  }
}

// dx may be dy or x (not __restrict__): see the file comment.
__global__ void InputGradKernel(GroupNormShape s, const float* x, const float* dy,
                                const float* __restrict__ gamma, const float* __restrict__ mean,
                                const float* __restrict__ invstd, float* dx) {
  __shared__ gm::InputGradientFactors shared_k;
  const int64_t per_group = s.channels / s.groups, count = per_group * s.spatial;
  for (int64_t w = blockIdx.x; w < s.batch * s.groups; w += gridDim.x) {
    const int64_t first_plane = w * per_group;  // (n, g * per_group) as n * channels + c
    const int64_t first_channel = (w % s.groups) * per_group;
    const float m = mean[w], k = invstd[w];
    double a = 0, b = 0;  // thread 0's
    BlockOrderedPlaneSums(
        per_group, s.spatial,
        [&](int64_t j, int64_t v, double* sa, double* sb) {
          const int64_t i = (first_plane + j) * s.spatial + v;
          bm::AccumulateBackwardSums(dy[i], x[i], m, k, sa, sb);
        },
        [&](int64_t j, lane_sums::Pair p) {
          gm::FoldGroupSums(gamma[first_channel + j], p.a, p.b, &a, &b);
        });
    if (threadIdx.x == 0) shared_k = gm::GradientFactors(a, b, static_cast<double>(count));
    __syncthreads();
    const gm::InputGradientFactors factors = shared_k;
    const int64_t base = first_plane * s.spatial;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const float g = gamma[first_channel + i / s.spatial];
      dx[base + i] = gm::InputGradient(dy[base + i], x[base + i], m, k, g, factors);
    }
    __syncthreads();  // shared_k is rewritten for the next group
  }
}

__global__ void SquaredNormsKernel(GroupNormShape s, const float* __restrict__ x,
                                   const float* __restrict__ dy, const float* __restrict__ mean,
                                   const float* __restrict__ invstd,
                                   double* __restrict__ squared_norms) {
  for (int64_t n = blockIdx.x; n < s.batch; n += gridDim.x) {
    double total = 0;  // thread 0's
    BlockOrderedPlaneSums(
        s.channels, s.spatial,
        [&](int64_t c, int64_t v, double* a, double* b) {
          const int64_t stat = gm::StatIndex(s, n, c), i = (n * s.channels + c) * s.spatial + v;
          bm::AccumulateBackwardSums(dy[i], x[i], mean[stat], invstd[stat], a, b);
        },
        [&](int64_t, lane_sums::Pair p) { gm::FoldSquaredNorm(p.a, p.b, &total); });
    if (threadIdx.x == 0) squared_norms[n] = hd::Add(squared_norms[n], total);
  }
}

}  // namespace

void LaunchGroupNormForward(cudaStream_t stream, const GroupNormShape& s, const float* x,
                            const float* gamma, const float* beta, double eps, float* y,
                            float* mean, float* invstd) {
  if (s.batch == 0) return;
  const int64_t warps = s.batch * s.groups;
  StatsKernel<<<BlocksFor(warps * lane_sums::kLanes), kThreads, 0, stream>>>(s, x, eps, mean,
                                                                             invstd);
  const PlaneTile t = PlaneTileFor(s.batch * s.channels, s.spatial);
  ForwardKernel<<<t.grid, t.block, 0, stream>>>(s, x, gamma, beta, mean, invstd, y);
}

void LaunchGroupNormBackward(cudaStream_t stream, const GroupNormShape& s, const float* x,
                             const float* dy, const float* gamma, const float* mean,
                             const float* invstd, float* dgamma, float* dbeta, float* dx) {
  ParamGradsKernel<<<BlocksFor(s.channels, 1), kPlaneThreads, 0, stream>>>(s, x, dy, mean, invstd,
                                                                           dgamma, dbeta);
  if (dx == nullptr || s.batch == 0) return;
  InputGradKernel<<<BlocksFor(s.batch * s.groups, 1), kPlaneThreads, 0, stream>>>(s, x, dy, gamma,
                                                                                  mean, invstd, dx);
}

void LaunchAddGroupNormSquaredNorms(cudaStream_t stream, const GroupNormShape& s, const float* x,
                                    const float* dy, const float* mean, const float* invstd,
                                    double* squared_norms) {
  if (s.batch == 0) return;
  SquaredNormsKernel<<<BlocksFor(s.batch, 1), kPlaneThreads, 0, stream>>>(s, x, dy, mean, invstd,
                                                                          squared_norms);
}

}  // namespace huddle::kernels::cuda
