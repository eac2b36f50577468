// CUDA version of kernels/update.h. The arithmetic is kernels/update_math.h's, shared with the
// CPU reference, so the outputs are the same bits:
//   1. NormPartialsKernel: block b sums its chunk in update_math's lane order and halving tree;
//   2. FinishNormKernel (one thread): block totals in order -> norm and clip scale in *stats;
//   3. ApplyKernel: scale (read from *stats on the device: the host never waits); out may be local.
// Two passes over the vectors, the least the math allows: the scale depends on every element.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/update_math.h"

namespace huddle::kernels::cuda {
namespace {

using update_math::kNormThreads;

__global__ void NormPartialsKernel(const float* __restrict__ local,
                                   const float* __restrict__ global, int64_t n, int64_t length,
                                   double* __restrict__ partials) {
  __shared__ double lanes[kNormThreads];
  const int t = static_cast<int>(threadIdx.x);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * length;
  const int64_t end = begin + length < n ? begin + length : n;
  double acc = 0;
  for (int64_t i = begin + t; i < end; i += kNormThreads) {
    const double v = update_math::Delta(local[i], global[i]);
    acc = hd::Add(acc, hd::Mul(v, v));
  }
  lanes[t] = acc;
  __syncthreads();
  for (int s = kNormThreads / 2; s >= 1; s /= 2) {
    if (t < s) lanes[t] = hd::Add(lanes[t], lanes[t + s]);
    __syncthreads();
  }
  if (t == 0) partials[blockIdx.x] = lanes[0];
}

__global__ void FinishNormKernel(const double* __restrict__ partials, int64_t blocks,
                                 double clip_norm, UpdatePipelineStats* stats) {
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) total = hd::Add(total, partials[b]);
  double norm = 0;
  stats->scale = update_math::ClipScale(total, clip_norm, &norm);
  stats->norm = norm;
}

// In place when out == local (each element is read before it is written): no __restrict__ on them.
__global__ void ApplyKernel(const float* local, const float* __restrict__ global, int64_t n,
                            float* out, const UpdatePipelineStats* __restrict__ stats) {
  const double scale = stats->scale;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    out[i] = static_cast<float>(hd::Mul(update_math::Delta(local[i], global[i]), scale));
  }
}

}  // namespace

void LaunchUpdatePipeline(cudaStream_t stream, const UpdatePipelineParams& p, const float* local,
                          const float* global, int64_t n, float* out, double* scratch,
                          UpdatePipelineStats* stats) {
  const int64_t blocks = update_math::NormBlocks(n);
  NormPartialsKernel<<<static_cast<unsigned int>(blocks), kNormThreads, 0, stream>>>(
      local, global, n, update_math::ChunkLength(n, blocks), scratch);
  FinishNormKernel<<<1, 1, 0, stream>>>(scratch, blocks, p.clip_norm, stats);
  if (n == 0) return;
  ApplyKernel<<<BlocksFor(n), kThreads, 0, stream>>>(local, global, n, out, stats);
}

}  // namespace huddle::kernels::cuda
