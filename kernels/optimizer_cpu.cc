// CPU backend of kernels/optimizer.h: branch-free inner loops that the compiler vectorises.
#include "kernels/optimizer.h"

namespace huddle::kernels {

void SgdStep(const SgdHyper& hyper, const float* grad, float* param, float* velocity, int64_t n) {
  const float lr = hyper.learning_rate;
  const float wd = hyper.weight_decay;
  const float mu = hyper.momentum;
  if (mu == 0.0f) {
    for (int64_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] + wd * param[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    velocity[i] = mu * velocity[i] + (grad[i] + wd * param[i]);
    param[i] -= lr * velocity[i];
  }
}

}  // namespace huddle::kernels
