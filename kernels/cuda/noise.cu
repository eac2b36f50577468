// CUDA version of kernels/noise.h (CPU reference: kernels/noise_cpu.cc). One thread per ChaCha20
// block of the Gaussian stream, i.e. per 6 consecutive elements, in a grid-stride loop; every
// element goes through kernels/noise_stream.h's AddNoiseAndDivide, as on the CPU, so both
// backends produce the same bits.
#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"
#include "kernels/noise_stream.h"

namespace huddle::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65535;  // the grid-stride loop covers any n

// Thread t (of the grid-stride sequence) handles stream block first_block + t, whose normal j is
// element offset + i with i = 6t - first + j; only i in [0, n) exist (the first and last blocks
// are partial when the range does not start or end on a block boundary). As on the CPU, the
// stream index offset + i is assumed not to wrap past 2^64.
__global__ void AddGaussianNoiseKernel(NoiseKey key, uint64_t first_block, int first,
                                       int64_t blocks, double stddev, double divisor, float* data,
                                       int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < blocks;
       t += stride) {
    double normals[kNormalsPerBlock];
    StandardNormalBlock(key, first_block + static_cast<uint64_t>(t), normals);
    const int64_t begin = t * kNormalsPerBlock - first;
#pragma unroll
    for (int j = 0; j < kNormalsPerBlock; ++j) {
      const int64_t i = begin + j;
      if (i >= 0 && i < n) data[i] = AddNoiseAndDivide(data[i], stddev, normals[j], divisor);
    }
  }
}

}  // namespace

void LaunchAddGaussianNoise(cudaStream_t stream, const NoiseKey& key, uint64_t offset,
                            double stddev, double divisor, float* data, int64_t n) {
  if (n <= 0) return;
  const int first = static_cast<int>(offset % kNormalsPerBlock);
  // Blocks touched by elements [offset, offset + n); computed unsigned so n near 2^63 cannot
  // overflow.
  const auto blocks = static_cast<int64_t>(
      (static_cast<uint64_t>(first) + static_cast<uint64_t>(n) + kNormalsPerBlock - 1) /
      kNormalsPerBlock);
  const int64_t wanted = (blocks + kThreads - 1) / kThreads;
  const auto grid = static_cast<unsigned int>(wanted < kMaxGrid ? wanted : kMaxGrid);
  AddGaussianNoiseKernel<<<grid, kThreads, 0, stream>>>(key, offset / kNormalsPerBlock, first,
                                                        blocks, stddev, divisor, data, n);
}

}  // namespace huddle::kernels::cuda
