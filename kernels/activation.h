// Element-wise activation kernels. See kernels/dense.h for the contract shared by all kernels
// (non-owning pointers, caller-validated sizes, no failure, stateless and thread-safe).
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace huddle::kernels {

// y[i] = max(y[i], 0) for i in [0, n), in place.
void ReluForward(float* y, int64_t n);

// Backward of ReluForward given its output y[n]: dy[i] = y[i] > 0 ? dy[i] : 0, in place.
// (y > 0 exactly where the input was > 0, so the forward output is all that is needed.)
void ReluBackward(const float* y, float* dy, int64_t n);

// y[i] = tanh(y[i]) for i in [0, n), in place. The CPU uses the C library's tanhf, the GPU CUDA's
// (both within 2 ulp of the exact value): the backends agree to a few ulp, not bit for bit.
void TanhForward(float* y, int64_t n);

// Backward of TanhForward given its output y[n]: dy[i] *= 1 - y[i]², in place, computed in double
// and rounded once (TanhGradient below), the same bits on every backend.
void TanhBackward(const float* y, float* dy, int64_t n);

// dy · (1 - y²) in double (y² is exact there), each step one hd:: operation.
HUDDLE_HD inline float TanhGradient(float y, float dy) {
  return static_cast<float>(hd::Mul(dy, hd::Sub(1.0, hd::Mul(y, y))));
}

}  // namespace huddle::kernels
