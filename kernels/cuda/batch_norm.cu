// CUDA version of kernels/batch_norm.h. The arithmetic is batch_norm_math's, shared with the CPU
// reference, and the sums keep its order, so every output is meant to be the same bits as on the
// CPU:
//   - column sums (SumsKernel, BackwardSumsKernel): one thread per feature adds its column in row
//     order 0 .. batch - 1 in double; adjacent threads read adjacent features, so each row is one
//     coalesced read per warp. No atomics, no tree whose shape depends on the launch: the result is
//     deterministic. Parallelism is `features` threads; each thread's loads are independent of its
//     additions, so they are issued ahead (unrolled) while the adds retire in order;
//   - per-feature steps (moments, running statistics, inverse std): one thread per feature;
//   - element-wise steps (forward, input gradient): 2-D blocks of 32 features x 8 rows, so a warp
//     touches 32 consecutive floats of one row and a thread loads its feature's parameters (and
//     computes its gradient factors) once for several rows.
// With spatial > 1 (BatchNorm2d) the values of a feature are planes of `spatial` contiguous floats:
//   - sums (PlaneSumsKernel, PlaneBackwardSumsKernel): one block per feature; its warps sum rows'
//     planes in kernels/lane_sums.h's order (coalesced) and thread 0 adds the plane totals in row
//     order, the CPU's order (kernels/cuda/planes.cuh);
//   - element-wise steps: PlaneTile blocks, threads along a plane, a thread's feature parameters
//     (and gradient factors) loaded once per plane.
#include "kernels/cuda/batch_norm.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/planes.cuh"

namespace huddle::kernels::cuda {
namespace {

namespace bm = batch_norm_math;

// Column sums run few threads (one per feature): small blocks spread them over more SMs.
inline constexpr int kColumnThreads = 64;
// Element-wise blocks: kTileFeatures x kTileRows threads, each thread kRowsPerThread rows (at
// least, for batches that fill the grid).
inline constexpr int kTileFeatures = 32;
inline constexpr int kTileRows = 8;
inline constexpr int64_t kRowsPerThread = 4;

__device__ inline int64_t FirstFeature() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t FeatureStride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
__device__ inline int64_t FirstRow() {
  return static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
}
__device__ inline int64_t RowStride() { return static_cast<int64_t>(gridDim.y) * blockDim.y; }

__global__ void SumsKernel(const float* __restrict__ x, int64_t batch, int64_t features,
                           double* __restrict__ sums) {
  for (int64_t f = GlobalThread(); f < features; f += GridThreads()) {
    double sum = 0, sum_sq = 0;
#pragma unroll 8
    for (int64_t r = 0; r < batch; ++r) bm::AccumulateSums(x[r * features + f], &sum, &sum_sq);
    sums[f] = sum;
    sums[features + f] = sum_sq;
  }
}

__global__ void BackwardSumsKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                   const float* __restrict__ mean, const float* __restrict__ invstd,
                                   int64_t batch, int64_t features, double* __restrict__ sums) {
  for (int64_t f = GlobalThread(); f < features; f += GridThreads()) {
    const float m = mean[f], s = invstd[f];
    double sum_dy = 0, sum_dy_xhat = 0;
#pragma unroll 8
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t i = r * features + f;
      bm::AccumulateBackwardSums(dy[i], x[i], m, s, &sum_dy, &sum_dy_xhat);
    }
    sums[f] = sum_dy;
    sums[features + f] = sum_dy_xhat;
  }
}

// One block of kPlaneThreads per feature (spatial > 1): Σ over rows, in order, of the plane sums.
__global__ void PlaneSumsKernel(const float* __restrict__ x, int64_t batch, int64_t features,
                                int64_t spatial, double* __restrict__ sums) {
  for (int64_t f = blockIdx.x; f < features; f += gridDim.x) {
    lane_sums::Pair total;  // thread 0's
    BlockOrderedPlaneSums(
        batch, spatial,
        [&](int64_t r, int64_t s, double* a, double* b) {
          bm::AccumulateSums(x[(r * features + f) * spatial + s], a, b);
        },
        [&](int64_t, lane_sums::Pair p) {
          total.a = hd::Add(total.a, p.a);
          total.b = hd::Add(total.b, p.b);
        });
    if (threadIdx.x == 0) {
      sums[f] = total.a;
      sums[features + f] = total.b;
    }
  }
}

__global__ void PlaneBackwardSumsKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                        const float* __restrict__ mean,
                                        const float* __restrict__ invstd, int64_t batch,
                                        int64_t features, int64_t spatial,
                                        double* __restrict__ sums) {
  for (int64_t f = blockIdx.x; f < features; f += gridDim.x) {
    const float m = mean[f], k = invstd[f];
    lane_sums::Pair total;  // thread 0's
    BlockOrderedPlaneSums(
        batch, spatial,
        [&](int64_t r, int64_t s, double* a, double* b) {
          const int64_t i = (r * features + f) * spatial + s;
          bm::AccumulateBackwardSums(dy[i], x[i], m, k, a, b);
        },
        [&](int64_t, lane_sums::Pair p) {
          total.a = hd::Add(total.a, p.a);
          total.b = hd::Add(total.b, p.b);
        });
    if (threadIdx.x == 0) {
      sums[f] = total.a;
      sums[features + f] = total.b;
    }
  }
}

__global__ void MomentsKernel(const double* __restrict__ sums, int64_t count, int64_t features,
                              double eps, float* __restrict__ mean, float* __restrict__ invstd) {
  const auto n = static_cast<double>(count);
  for (int64_t f = GlobalThread(); f < features; f += GridThreads()) {
    double m = 0;
    const double var = bm::Variance(sums[f], sums[features + f], n, &m);
    mean[f] = static_cast<float>(m);
    invstd[f] = static_cast<float>(bm::InvStd(var, eps));
  }
}

__global__ void UpdateRunningKernel(const double* __restrict__ sums, int64_t count,
                                    int64_t features, double momentum,
                                    float* __restrict__ running_mean,
                                    float* __restrict__ running_var) {
  const auto n = static_cast<double>(count);
  const double unbias = bm::UnbiasFactor(count);
  for (int64_t f = GlobalThread(); f < features; f += GridThreads()) {
    double m = 0;
    const double var = bm::Variance(sums[f], sums[features + f], n, &m);
    running_mean[f] = bm::Blend(running_mean[f], m, momentum);
    running_var[f] = bm::Blend(running_var[f], hd::Mul(var, unbias), momentum);
  }
}

__global__ void ParamGradsKernel(const double* __restrict__ sums, int64_t features,
                                 float* __restrict__ dgamma, float* __restrict__ dbeta) {
  for (int64_t f = GlobalThread(); f < features; f += GridThreads()) {
    dbeta[f] = static_cast<float>(sums[f]);
    dgamma[f] = static_cast<float>(sums[features + f]);
  }
}

// invstd may be var: each element is read before it is written, by the same thread.
__global__ void InvStdKernel(const float* var, int64_t features, double eps, float* invstd) {
  for (int64_t f = GlobalThread(); f < features; f += GridThreads()) {
    invstd[f] = static_cast<float>(bm::InvStd(var[f], eps));
  }
}

// y may be x (not __restrict__): each element is read before it is written, by the same thread.
__global__ void ForwardKernel(const float* x, int64_t batch, int64_t features,
                              const float* __restrict__ mean, const float* __restrict__ invstd,
                              const float* __restrict__ gamma, const float* __restrict__ beta,
                              float* y) {
  for (int64_t f = FirstFeature(); f < features; f += FeatureStride()) {
    const float m = mean[f], s = invstd[f], g = gamma[f], b = beta[f];
    for (int64_t r = FirstRow(); r < batch; r += RowStride()) {
      const int64_t i = r * features + f;
      y[i] = bm::ForwardValue(x[i], m, s, g, b);
    }
  }
}

// dx may be dy or x (not __restrict__), as in ForwardKernel.
__global__ void BackwardInputKernel(const float* dy, const float* x, const float* __restrict__ mean,
                                    const float* __restrict__ invstd,
                                    const float* __restrict__ gamma,
                                    const double* __restrict__ sums, int64_t count, int64_t batch,
                                    int64_t features, float* dx) {
  const auto n = static_cast<double>(count);
  for (int64_t f = FirstFeature(); f < features; f += FeatureStride()) {
    const float m = mean[f], s = invstd[f];
    const bm::InputGradientFactors k =
        bm::GradientFactors(gamma[f], s, sums[f], sums[features + f], n);
    for (int64_t r = FirstRow(); r < batch; r += RowStride()) {
      const int64_t i = r * features + f;
      dx[i] = bm::InputGradient(dy[i], x[i], m, s, k);
    }
  }
}

// PlaneTile versions of the element-wise kernels (spatial > 1): plane p = r * features + f.
__global__ void PlaneForwardKernel(const float* x, int64_t planes, int64_t features,
                                   int64_t spatial, const float* __restrict__ mean,
                                   const float* __restrict__ invstd,
                                   const float* __restrict__ gamma, const float* __restrict__ beta,
                                   float* y) {
  for (int64_t p = TilePlane(); p < planes; p += TilePlaneStride()) {
    const int64_t f = p % features;
    const float m = mean[f], k = invstd[f], g = gamma[f], b = beta[f];
    for (int64_t s = TileValue(); s < spatial; s += TileValueStride()) {
      const int64_t i = p * spatial + s;
      y[i] = bm::ForwardValue(x[i], m, k, g, b);
    }
  }
}

__global__ void PlaneBackwardInputKernel(const float* dy, const float* x,
                                         const float* __restrict__ mean,
                                         const float* __restrict__ invstd,
                                         const float* __restrict__ gamma,
                                         const double* __restrict__ sums, int64_t count,
                                         int64_t planes, int64_t features, int64_t spatial,
                                         float* dx) {
  const auto n = static_cast<double>(count);
  for (int64_t p = TilePlane(); p < planes; p += TilePlaneStride()) {
    const int64_t f = p % features;
    const float m = mean[f], k = invstd[f];
    const bm::InputGradientFactors factors =
        bm::GradientFactors(gamma[f], k, sums[f], sums[features + f], n);
    for (int64_t s = TileValue(); s < spatial; s += TileValueStride()) {
      const int64_t i = p * spatial + s;
      dx[i] = bm::InputGradient(dy[i], x[i], m, k, factors);
    }
  }
}

dim3 ElementwiseGrid(int64_t batch, int64_t features) {
  return dim3(BlocksFor(features, kTileFeatures), BlocksFor(batch, kTileRows * kRowsPerThread));
}

}  // namespace

void LaunchBatchNormSums(cudaStream_t stream, const float* x, int64_t batch, int64_t features,
                         int64_t spatial, double* sums) {
  if (spatial > 1) {
    PlaneSumsKernel<<<BlocksFor(features, 1), kPlaneThreads, 0, stream>>>(x, batch, features,
                                                                          spatial, sums);
    return;
  }
  SumsKernel<<<BlocksFor(features, kColumnThreads), kColumnThreads, 0, stream>>>(x, batch, features,
                                                                                 sums);
}

void LaunchBatchNormMoments(cudaStream_t stream, const double* sums, int64_t count,
                            int64_t features, double eps, float* mean, float* invstd) {
  MomentsKernel<<<BlocksFor(features), kThreads, 0, stream>>>(sums, count, features, eps, mean,
                                                              invstd);
}

void LaunchBatchNormUpdateRunning(cudaStream_t stream, const double* sums, int64_t count,
                                  int64_t features, double momentum, float* running_mean,
                                  float* running_var) {
  UpdateRunningKernel<<<BlocksFor(features), kThreads, 0, stream>>>(sums, count, features, momentum,
                                                                    running_mean, running_var);
}

void LaunchBatchNormInvStd(cudaStream_t stream, const float* var, int64_t features, double eps,
                           float* invstd) {
  InvStdKernel<<<BlocksFor(features), kThreads, 0, stream>>>(var, features, eps, invstd);
}

void LaunchBatchNormForward(cudaStream_t stream, const float* x, int64_t batch, int64_t features,
                            int64_t spatial, const float* mean, const float* invstd,
                            const float* gamma, const float* beta, float* y) {
  if (batch == 0) return;
  if (spatial > 1) {
    const PlaneTile t = PlaneTileFor(batch * features, spatial);
    PlaneForwardKernel<<<t.grid, t.block, 0, stream>>>(x, batch * features, features, spatial, mean,
                                                       invstd, gamma, beta, y);
    return;
  }
  ForwardKernel<<<ElementwiseGrid(batch, features), dim3(kTileFeatures, kTileRows), 0, stream>>>(
      x, batch, features, mean, invstd, gamma, beta, y);
}

void LaunchBatchNormBackwardSums(cudaStream_t stream, const float* dy, const float* x,
                                 const float* mean, const float* invstd, int64_t batch,
                                 int64_t features, int64_t spatial, double* sums) {
  if (spatial > 1) {
    PlaneBackwardSumsKernel<<<BlocksFor(features, 1), kPlaneThreads, 0, stream>>>(
        dy, x, mean, invstd, batch, features, spatial, sums);
    return;
  }
  BackwardSumsKernel<<<BlocksFor(features, kColumnThreads), kColumnThreads, 0, stream>>>(
      dy, x, mean, invstd, batch, features, sums);
}

void LaunchBatchNormParamGrads(cudaStream_t stream, const double* sums, int64_t features,
                               float* dgamma, float* dbeta) {
  ParamGradsKernel<<<BlocksFor(features), kThreads, 0, stream>>>(sums, features, dgamma, dbeta);
}

void LaunchBatchNormBackwardInput(cudaStream_t stream, const float* dy, const float* x,
                                  const float* mean, const float* invstd, const float* gamma,
                                  const double* sums, int64_t count, int64_t batch,
                                  int64_t features, int64_t spatial, float* dx) {
  if (batch == 0) return;
  if (spatial > 1) {
    const PlaneTile t = PlaneTileFor(batch * features, spatial);
    PlaneBackwardInputKernel<<<t.grid, t.block, 0, stream>>>(
        dy, x, mean, invstd, gamma, sums, count, batch * features, features, spatial, dx);
    return;
  }
  BackwardInputKernel<<<ElementwiseGrid(batch, features), dim3(kTileFeatures, kTileRows), 0,
                        stream>>>(dy, x, mean, invstd, gamma, sums, count, batch, features, dx);
}

}  // namespace huddle::kernels::cuda
