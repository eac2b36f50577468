// CPU reference of kernels/dropout.h: one pass applying dropout_math's mask and scale.
#include "kernels/dropout.h"

namespace huddle::kernels {
namespace {

namespace dm = dropout_math;

void Dropout(float* v, int64_t n, float p, uint64_t seed, uint64_t offset) {
  const uint64_t threshold = dm::DropThreshold(p);
  const double scale = dm::KeepScale(p);
  const uint64_t key = dm::Key(seed);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = dm::Apply(v[i], key, offset + static_cast<uint64_t>(i), threshold, scale);
  }
}

}  // namespace

void DropoutForward(float* x, int64_t n, float p, uint64_t seed, uint64_t offset) {
  Dropout(x, n, p, seed, offset);
}

void DropoutBackward(float* dy, int64_t n, float p, uint64_t seed, uint64_t offset) {
  Dropout(dy, n, p, seed, offset);
}

}  // namespace huddle::kernels
