// The user's own trainer: a multi-layer perceptron (dense layers, ReLU between them, softmax
// cross-entropy on the last) trained with minibatch SGD with momentum, in plain loops. It knows
// nothing of Huddle but the SDK's Trainer interface (huddle/client/trainer.h).
//
// The network is the job's: Start reads the layer sizes from JobInfo::tensors, which must be a
// chain of (weight [out, in], bias [out]) pairs, in[0] = the data's features, in[k+1] = out[k],
// out[last] >= the number of classes in the data. That is the layout of Huddle's
// `model: {kind: mlp, ...}` without batch norm (fc0.weight, fc0.bias, fc1.weight, ...).
#pragma once

#include <huddle/client/trainer.h>

#include <cstdint>
#include <vector>

#include "idx.h"

namespace embed {

class MlpTrainer : public huddle::client::Trainer {
 public:
  // `train` is trained on, `test` (may be empty) evaluated on; both outlive the trainer.
  MlpTrainer(const Dataset& train, const Dataset& test) : train_(train), test_(test) {}

  int64_t num_examples() const override { return train_.rows; }
  void Start(const huddle::client::JobInfo& job) override;
  huddle::client::FitResult Fit(const huddle::client::NamedTensors& global,
                                const huddle::client::FitConfig& config) override;
  bool can_evaluate() const override { return true; }
  huddle::client::EvaluateResult Evaluate(const huddle::client::NamedTensors& model) override;

 private:
  struct Layer {
    int64_t in = 0, out = 0;
    std::vector<float> w;  // [out, in], row-major
    std::vector<float> b;  // [out]
  };

  // Copies `tensors` (the job's, checked) into layers_.
  void Load(const huddle::client::NamedTensors& tensors);
  huddle::client::NamedTensors Save() const;
  // Forward pass of example `x`: acts_[0] = x, acts_[k+1] = layer k's output (ReLU'd but the
  // last, which holds the logits). Returns the cross-entropy loss against `label`; `*correct`
  // whether the arg-max logit is the label.
  double Forward(const float* x, int32_t label, bool* correct);

  const Dataset& train_;
  const Dataset& test_;
  std::vector<huddle::client::TensorInfo> tensors_;  // the job's, in order
  std::vector<Layer> layers_;
  std::vector<std::vector<float>> acts_;  // per layer boundary, one example's activations
};

}  // namespace embed
