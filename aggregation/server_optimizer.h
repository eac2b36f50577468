// ServerOptimizer: applies the aggregated update (delta = mean of client deltas) to the global
// model. FedAvg is learning_rate 1, momentum 0; FedAvgM adds server momentum:
//     v <- momentum * v + delta        (v starts at zero)
//     model <- model + learning_rate * v
// With momentum 0 no velocity is kept and this is model += learning_rate * delta.
// Arithmetic is element-wise in double, rounded once to float per stored value, so it is
// deterministic.
//
// Thread-safety: none; the coordinator's round loop owns it.
#pragma once

#include "common/status.h"
#include "common/tensor.h"

namespace huddle::aggregation {

struct ServerOptimizerOptions {
  // Server learning rate; finite and > 0. 1.0 is plain FedAvg.
  double learning_rate = 1.0;
  // Server momentum in [0, 1). 0 disables the velocity (FedAvg).
  double momentum = 0.0;
};

class ServerOptimizer {
 public:
  // Options are checked by Apply (out-of-range options make every Apply fail).
  explicit ServerOptimizer(ServerOptimizerOptions options);

  // Applies `delta` to `model` in place. delta and model must have the same tensors (count, names,
  // shapes, data sizes) and delta must be finite; otherwise InvalidArgument naming the mismatch,
  // with model and state unchanged. A restored velocity whose layout does not match the model is
  // InvalidArgument too.
  Status Apply(const TensorList& delta, TensorList* model);

  // The optimizer state for checkpoints: the velocity, laid out like the model. Empty before the
  // first Apply with momentum > 0 (and always with momentum 0).
  const TensorList& state() const { return velocity_; }

  // Restores a velocity saved from state(). Empty restores the initial (zero) state. A non-empty
  // velocity needs momentum > 0 and finite values with consistent sizes (InvalidArgument
  // otherwise, state unchanged); it is checked against the model's layout at the next Apply.
  Status RestoreState(TensorList velocity);

 private:
  ServerOptimizerOptions options_;
  TensorList velocity_;
};

}  // namespace huddle::aggregation
