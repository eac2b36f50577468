// CUDA versions of kernels/activation.h's tanh and kernels/dropout.h: grid-stride element-wise
// kernels. TanhBackward and dropout use the shared HUDDLE_HD math (the same bits as the CPU);
// TanhForward uses CUDA's tanhf (within 2 ulp, as the CPU's tanhf).
#include "kernels/activation.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/dropout.h"

namespace huddle::kernels::cuda {
namespace {

__global__ void TanhForwardKernel(float* y, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) y[i] = tanhf(y[i]);
}

__global__ void TanhBackwardKernel(const float* __restrict__ y, float* __restrict__ dy, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dy[i] = TanhGradient(y[i], dy[i]);
}

__global__ void DropoutKernel(float* v, int64_t n, uint64_t key, uint64_t offset,
                              uint64_t threshold, double scale) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    v[i] = dropout_math::Apply(v[i], key, offset + static_cast<uint64_t>(i), threshold, scale);
  }
}

}  // namespace

void LaunchTanhForward(cudaStream_t stream, float* y, int64_t n) {
  if (n == 0) return;
  TanhForwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(y, n);
}

void LaunchTanhBackward(cudaStream_t stream, const float* y, float* dy, int64_t n) {
  if (n == 0) return;
  TanhBackwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(y, dy, n);
}

void LaunchDropout(cudaStream_t stream, float* v, int64_t n, float p, uint64_t seed,
                   uint64_t offset) {
  if (n == 0) return;
  DropoutKernel<<<BlocksFor(n), kThreads, 0, stream>>>(v, n, dropout_math::Key(seed), offset,
                                                       dropout_math::DropThreshold(p),
                                                       dropout_math::KeepScale(p));
}

}  // namespace huddle::kernels::cuda
