// CPU backend of kernels/activation.h: plain loops that the compiler vectorises.
#include "kernels/activation.h"

namespace huddle::kernels {

void ReluForward(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

void ReluBackward(const float* y, float* dy, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

}  // namespace huddle::kernels
