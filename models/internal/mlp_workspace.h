// Internal to models/: the forward/backward buffers and input checks that TrainMlp, EvaluateMlp
// and TrainMlpDpSgd share. Not part of the public API (include models/mlp.h or models/dp_sgd.h).
//
// Thread-safety: an MlpWorkspace is used by one thread at a time; the free functions are
// stateless.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "models/mlp.h"

namespace huddle::models::internal {

// Buffers for one training or evaluation call, sized for a maximum batch (growable with Reserve).
// Layer l maps width(l) -> width(l + 1) with parameters params[2l] (weight) and params[2l + 1]
// (bias). Every method that takes `params` requires CheckParams(spec, params).ok() for the spec
// the workspace was built with, and `batch` in [1, capacity()].
class MlpWorkspace {
 public:
  // `training` also allocates the gradient buffers. max_batch >= 1.
  MlpWorkspace(const MlpSpec& spec, int64_t max_batch, bool training);

  size_t num_layers() const { return acts_.size(); }
  // Boundary widths: width(0) = input_dim, ..., width(num_layers()) = num_classes.
  int64_t width(size_t i) const { return widths_[i]; }
  // The largest batch the buffers hold.
  int64_t capacity() const { return capacity_; }
  // Grows the batch buffers to hold max_batch rows (never shrinks). Gradients and momentum are
  // kept; the contents of the batch buffers are not.
  void Reserve(int64_t max_batch);

  // Copies the view rows order[begin, begin + count) into the input and label buffers.
  // count <= capacity(); the rows must be valid for the view.
  void Gather(const data::DatasetView& view, const std::vector<int64_t>& order, int64_t begin,
              int64_t count);

  // Forward pass over the gathered batch; with training, also writes dLoss/dlogits (of the mean
  // loss over the batch) into layer_grad(num_layers() - 1).
  kernels::LossTotals Forward(const TensorList& params, int64_t batch, bool training);

  // Backward pass after Forward(training=true): fills grads() for every parameter.
  void Backward(const TensorList& params, int64_t batch);

  // One SGD step on every parameter from grads(). Momentum buffers are allocated on first use.
  void Step(const kernels::SgdHyper& hyper, TensorList* params);

  // Raw buffers, for trainers that run their own backward pass (DP-SGD). Row-major, batch rows.
  const float* input() const { return x_.data(); }  // [batch, width(0)]
  // Output of layer l after Forward (post-ReLU for hidden layers, logits for the last).
  const float* layer_output(size_t l) const { return acts_[l].data(); }  // [batch, width(l + 1)]
  // dLoss/d layer_output(l) (training only).
  float* layer_grad(size_t l) { return dacts_[l].data(); }  // [batch, width(l + 1)]
  // dLoss/d params[i], in MlpLayout order (training only).
  std::vector<std::vector<float>>& grads() { return grads_; }

 private:
  std::vector<int64_t> widths_;               // input_dim, hidden..., num_classes
  int64_t capacity_ = 0;                      // rows of the batch buffers
  bool training_ = false;                     // gradient buffers allocated
  std::vector<float> x_;                      // [batch, input_dim]
  std::vector<int32_t> labels_;               // [batch]
  std::vector<std::vector<float>> acts_;      // layer l output [batch, widths_[l + 1]]
  std::vector<std::vector<float>> dacts_;     // dLoss/d acts_[l]
  std::vector<std::vector<float>> grads_;     // dLoss/d params[i]
  std::vector<std::vector<float>> velocity_;  // momentum buffers, allocated on first use
};

// The TrainOptions checks of TrainMlp (errors name the field).
Status CheckTrainOptions(const TrainOptions& options);

// Checks params against the spec and every row of the view against the model (non-empty view,
// feature_dim == input_dim, labels in [0, num_classes)).
Status CheckModelAndData(const MlpSpec& spec, const TensorList& params,
                         const data::DatasetView& view);

}  // namespace huddle::models::internal
