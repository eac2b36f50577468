// Optimizer kernels. See kernels/dense.h for the contract shared by all kernels (non-owning
// pointers, caller-validated sizes, no failure, stateless and thread-safe).
#pragma once

#include <cstdint>

namespace huddle::kernels {

// Hyper-parameters of one SGD step (PyTorch torch.optim.SGD semantics, no dampening/Nesterov).
struct SgdHyper {
  float learning_rate = 0.05f;
  float momentum = 0.0f;      // 0 disables the velocity buffer
  float weight_decay = 0.0f;  // L2 coefficient added to the gradient
};

// One SGD step over n parameters, in place:
//   g = grad + weight_decay * param
//   momentum == 0:  param -= learning_rate * g                       (velocity unused, may be null)
//   momentum != 0:  velocity = momentum * velocity + g;  param -= learning_rate * velocity
// velocity[n] must be zero before the first step of a run and is owned by the caller.
void SgdStep(const SgdHyper& hyper, const float* grad, float* param, float* velocity, int64_t n);

}  // namespace huddle::kernels
