// CPU backend of kernels/activation.h: plain loops that the compiler vectorises.
#include <cmath>

#include "kernels/activation.h"

namespace huddle::kernels {

void ReluForward(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

void ReluBackward(const float* y, float* dy, int64_t n) {
  // dy[i] read unconditionally: a select the compiler vectorises, not a branch on y's sign.
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];
    dy[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

void TanhForward(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(y[i]);
}

void TanhBackward(const float* y, float* dy, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dy[i] = TanhGradient(y[i], dy[i]);
}

}  // namespace huddle::kernels
