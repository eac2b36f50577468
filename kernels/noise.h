// Counter-based Gaussian noise on a buffer: the CPU reference of the noise kernel (the CUDA
// version, kernels/cuda/noise.cu, produces the same bits). See kernels/noise_stream.h for the
// stream itself. See kernels/dense.h for the contract shared by all kernels.
#pragma once

#include <cstdint>

#include "kernels/noise_stream.h"

namespace huddle::kernels {

// data[i] = float((double(data[i]) + stddev * N(key, offset + i)) / divisor) for i in [0, n),
// where N(key, j) = StandardNormalAt(key, j). stddev >= 0 and finite, divisor > 0 and finite
// (1 for plain noise; DP-SGD divides the noised sum by its expected batch size in the same pass).
// With stddev == 0 only the division happens. Every step is one IEEE double operation in a fixed
// order, so the result is bit-identical on every backend.
void AddGaussianNoise(const NoiseKey& key, uint64_t offset, double stddev, double divisor,
                      float* data, int64_t n);

}  // namespace huddle::kernels
