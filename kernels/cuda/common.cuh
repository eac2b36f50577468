// Launch helpers shared by kernels/cuda/*.cu. Internal to kernels/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace huddle::kernels::cuda {

inline constexpr int kThreads = 256;
// Grid-stride kernels never need more blocks than this to fill any current GPU.
inline constexpr int64_t kMaxBlocks = 65535;

// Blocks for `work` items at `per_block` items per block, in [1, kMaxBlocks].
inline unsigned int BlocksFor(int64_t work, int64_t per_block = kThreads) {
  int64_t blocks = (work + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned int>(blocks);
}

// The global index of this thread and the grid's total thread count, as 64-bit values.
__device__ inline int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t GridThreads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace huddle::kernels::cuda
