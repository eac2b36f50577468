// CUDA version of kernels/update.h. The arithmetic is kernels/update_math.h's, shared with the
// CPU reference, so the outputs are the same bits:
//   1. NormPartialsKernel: block b sums its chunk in update_math's lane order and halving tree;
//   2. FinishNormKernel (one thread): block totals in order -> norm and clip scale in *stats;
//   3. ApplyKernel: scale (read from *stats on the device: the host never waits), stochastic
//      rounding. Two passes over the vectors, the least the math allows: the scale
//      depends on every element.
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
  stats->saturated = 0;
}

// Elements are handled in groups of 16 consecutive stream indices (one rounding block), so no
// ChaCha block is computed twice.
inline constexpr int64_t kGroup = 16;

__global__ void ApplyKernel(UpdatePipelineParams p, const float* __restrict__ local,
                            const float* __restrict__ global, int64_t n,
                            float* __restrict__ out_values, int32_t* __restrict__ out_units,
                            UpdatePipelineStats* stats) {
  const double scale = stats->scale;
  const bool quantize = p.quantum > 0;
  const uint64_t first_group = p.rounding_offset / kGroup;
  const uint64_t last_group = (p.rounding_offset + static_cast<uint64_t>(n) - 1) / kGroup;
  int64_t saturated = 0;
  for (uint64_t g = first_group + static_cast<uint64_t>(GlobalThread()); g <= last_group;
       g += static_cast<uint64_t>(GridThreads())) {
    uint32_t rounding[16] = {};
    if (quantize) ChaCha20Block(p.key, kRoundingStream, g, rounding);
    for (uint64_t index = g * kGroup; index < (g + 1) * kGroup; ++index) {
      if (index < p.rounding_offset) continue;
      const auto i = static_cast<int64_t>(index - p.rounding_offset);
      if (i >= n) break;
      const double v = hd::Mul(update_math::Delta(local[i], global[i]), scale);
      update_math::StoreOutput(p, v, rounding[index % 16], i, out_values, out_units, &saturated);
    }
  }
  if (saturated > 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&stats->saturated),
              static_cast<unsigned long long>(saturated));
  }
}

}  // namespace

void LaunchUpdatePipeline(cudaStream_t stream, const UpdatePipelineParams& p, const float* local,
                          const float* global, int64_t n, float* out_values, int32_t* out_units,
                          double* scratch, UpdatePipelineStats* stats) {
  const int64_t blocks = update_math::NormBlocks(n);
  NormPartialsKernel<<<static_cast<unsigned int>(blocks), kNormThreads, 0, stream>>>(
      local, global, n, update_math::ChunkLength(n, blocks), scratch);
  FinishNormKernel<<<1, 1, 0, stream>>>(scratch, blocks, p.clip_norm, stats);
  if (n == 0) return;
  const int64_t groups =
      static_cast<int64_t>((p.rounding_offset + static_cast<uint64_t>(n) - 1) / kGroup -
                           p.rounding_offset / kGroup) +
      1;
  ApplyKernel<<<BlocksFor(groups, 128), 128, 0, stream>>>(p, local, global, n, out_values,
                                                          out_units, stats);
}

}  // namespace huddle::kernels::cuda
