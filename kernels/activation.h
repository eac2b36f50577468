// Element-wise activation kernels. See kernels/dense.h for the contract shared by all kernels
// (non-owning pointers, caller-validated sizes, no failure, stateless and thread-safe).
#pragma once

#include <cstdint>

namespace huddle::kernels {

// y[i] = max(y[i], 0) for i in [0, n), in place.
void ReluForward(float* y, int64_t n);

// Backward of ReluForward given its output y[n]: dy[i] = y[i] > 0 ? dy[i] : 0, in place.
// (y > 0 exactly where the input was > 0, so the forward output is all that is needed.)
void ReluBackward(const float* y, float* dy, int64_t n);

}  // namespace huddle::kernels
