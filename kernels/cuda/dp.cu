// CUDA versions of kernels/dp.h: minibatch gather and DP-SGD's ghost-norm clipping. The squared
// norms are summed in double per row by one warp (a fixed shuffle tree, so deterministic).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace huddle::kernels::cuda {
namespace {

__global__ void GatherRowsKernel(const float* __restrict__ features,
                                 const int32_t* __restrict__ labels, int64_t cols,
                                 const int64_t* __restrict__ rows, int64_t count,
                                 float* __restrict__ x, int32_t* __restrict__ y) {
  const int64_t n = count * cols;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const int64_t r = i / cols, c = i % cols;
    const int64_t source = rows[r];
    x[i] = features[source * cols + c];
    if (c == 0) y[r] = labels[source];
  }
}

// Σ double(v[k])² over a row by one warp; every lane returns the total.
__device__ double WarpSumSquares(const float* v, int64_t n, int lane) {
  double s = 0;
  for (int64_t k = lane; k < n; k += 32) s += static_cast<double>(v[k]) * v[k];
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
  return s;
}

__global__ void GhostNormsKernel(const float* __restrict__ a, int64_t in,
                                 const float* __restrict__ d, int64_t out, int64_t batch,
                                 double* __restrict__ squared_norms) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = GridThreads() / 32;
  for (int64_t i = GlobalThread() / 32; i < batch; i += warps) {
    const double dd = WarpSumSquares(d + i * out, out, lane);
    const double aa = WarpSumSquares(a + i * in, in, lane);
    if (lane == 0) squared_norms[i] += dd * (aa + 1.0);
  }
}

__global__ void ClipFactorsKernel(const double* __restrict__ squared_norms, int64_t batch,
                                  ClipFactorParams p, float* __restrict__ factors) {
  for (int64_t i = GlobalThread(); i < batch; i += GridThreads()) {
    const double norm = p.norm_scale * sqrt(squared_norms[i]);
    const double clip = norm > p.clip_norm ? p.clip_norm / norm : 1.0;
    factors[i] = static_cast<float>(p.multiplier * clip);
  }
}

__global__ void ScaleRowsKernel(float* __restrict__ m, int64_t rows, int64_t cols,
                                const float* __restrict__ factors) {
  const int64_t n = rows * cols;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) m[i] *= factors[i / cols];
}

}  // namespace

void LaunchGatherRows(cudaStream_t stream, const float* features, const int32_t* labels,
                      int64_t cols, const int64_t* rows, int64_t count, float* x, int32_t* y) {
  if (count == 0) return;
  GatherRowsKernel<<<BlocksFor(count * cols), kThreads, 0, stream>>>(features, labels, cols, rows,
                                                                     count, x, y);
}

void LaunchAddGhostSquaredNorms(cudaStream_t stream, const float* a, int64_t in, const float* d,
                                int64_t out, int64_t batch, double* squared_norms) {
  if (batch == 0) return;
  GhostNormsKernel<<<BlocksFor(batch * 32), kThreads, 0, stream>>>(a, in, d, out, batch,
                                                                   squared_norms);
}

void LaunchClipFactors(cudaStream_t stream, const double* squared_norms, int64_t batch,
                       const ClipFactorParams& params, float* factors) {
  if (batch == 0) return;
  ClipFactorsKernel<<<BlocksFor(batch), kThreads, 0, stream>>>(squared_norms, batch, params,
                                                               factors);
}

void LaunchScaleRows(cudaStream_t stream, float* m, int64_t rows, int64_t cols,
                     const float* factors) {
  if (rows == 0) return;
  ScaleRowsKernel<<<BlocksFor(rows * cols), kThreads, 0, stream>>>(m, rows, cols, factors);
}

}  // namespace huddle::kernels::cuda
