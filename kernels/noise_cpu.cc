// CPU reference of kernels/noise.h: one ChaCha20 block (6 normals) per 6 elements, so the cost is
// that of the stream itself. The element formula is kernels/noise_stream.h's AddNoiseAndDivide,
// the one the CUDA kernel (kernels/cuda/noise.cu) uses, so both produce the same bits.
#include "kernels/noise.h"

namespace huddle::kernels {

void AddGaussianNoise(const NoiseKey& key, uint64_t offset, double stddev, double divisor,
                      float* data, int64_t n) {
  double normals[kNormalsPerBlock];
  // Each pass covers the elements of one block: data[i] is stream element offset + i, which is
  // normals[first + j] of block (offset + i) / 6. The first and last blocks may be partial.
  // (offset + n <= 2^64 is assumed, as in the CUDA kernel, which numbers blocks from offset / 6.)
  for (int64_t i = 0; i < n;) {
    const uint64_t index = offset + static_cast<uint64_t>(i);
    const int first = static_cast<int>(index % kNormalsPerBlock);
    const int64_t count = n - i < kNormalsPerBlock - first ? n - i : kNormalsPerBlock - first;
    StandardNormalBlock(key, index / kNormalsPerBlock, normals);
    for (int64_t j = 0; j < count; ++j) {
      data[i + j] = AddNoiseAndDivide(data[i + j], stddev, normals[first + j], divisor);
    }
    i += count;
  }
}

}  // namespace huddle::kernels
