#include "mlp_trainer.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>

namespace embed {
namespace {

using huddle::client::EvaluateResult;
using huddle::client::FitConfig;
using huddle::client::FitResult;
using huddle::client::JobInfo;
using huddle::client::NamedTensor;
using huddle::client::NamedTensors;
using huddle::client::TensorInfo;

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) s += ",";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

std::string Describe(size_t index, const std::string& name, const std::vector<int64_t>& shape) {
  return "tensor " + std::to_string(index) + " '" + name + "' " + ShapeString(shape);
}

// Why the job's model is not a network this trainer can train.
[[noreturn]] void Refuse(const std::string& why) {
  throw std::runtime_error(
      "embed_client trains a chain of dense layers (weight [out,in], bias [out], ReLU between "
      "layers), as `model: {kind: mlp}` without batch norm; this job's model is not one: " +
      why);
}

}  // namespace

void MlpTrainer::Start(const JobInfo& job) {
  const std::vector<TensorInfo>& t = job.tensors;
  if (t.empty() || t.size() % 2 != 0) {
    Refuse(std::to_string(t.size()) + " tensors, not (weight, bias) pairs");
  }
  int32_t max_label = 0;
  for (const Dataset* data : {&train_, &test_}) {
    for (int32_t y : data->y) max_label = std::max(max_label, y);
  }
  std::vector<Layer> layers;
  for (size_t k = 0; k < t.size(); k += 2) {
    const TensorInfo& w = t[k];
    const TensorInfo& b = t[k + 1];
    if (w.shape.size() != 2) Refuse(Describe(k, w.name, w.shape) + " is not a weight [out,in]");
    if (b.shape.size() != 1 || b.shape[0] != w.shape[0]) {
      Refuse(Describe(k + 1, b.name, b.shape) + " is not the bias [" + std::to_string(w.shape[0]) +
             "] of " + Describe(k, w.name, w.shape));
    }
    const int64_t in = layers.empty() ? train_.features : layers.back().out;
    if (w.shape[1] != in) {
      Refuse(Describe(k, w.name, w.shape) + " takes " + std::to_string(w.shape[1]) +
             " inputs, expected " + std::to_string(in) +
             (layers.empty() ? " (the data's features)" : " (the previous layer's outputs)"));
    }
    Layer& layer = layers.emplace_back();
    layer.in = w.shape[1];
    layer.out = w.shape[0];
  }
  if (layers.back().out <= max_label) {
    Refuse("its output has " + std::to_string(layers.back().out) +
           " classes, the data has labels up to " + std::to_string(max_label));
  }
  if (job.model_kind == "layers") {
    std::cerr << "embed_client: job '" << job.name << "' declares its own layer list; training it "
              << "as dense layers with ReLU between them\n";
  }
  tensors_ = t;
  layers_ = std::move(layers);
  acts_.assign(layers_.size() + 1, {});
  acts_[0].resize(static_cast<size_t>(train_.features));
  for (size_t k = 0; k < layers_.size(); ++k) {
    layers_[k].w.resize(static_cast<size_t>(layers_[k].out * layers_[k].in));
    layers_[k].b.resize(static_cast<size_t>(layers_[k].out));
    acts_[k + 1].resize(static_cast<size_t>(layers_[k].out));
  }
  std::cerr << "embed_client: joined job '" << job.name << "': " << layers_.size()
            << " dense layers, " << train_.rows << " training examples\n";
}

void MlpTrainer::Load(const NamedTensors& tensors) {
  if (tensors.size() != tensors_.size()) {
    throw std::runtime_error("the model has " + std::to_string(tensors.size()) +
                             " tensors, the job " + std::to_string(tensors_.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& got = tensors[i];
    if (got.name != tensors_[i].name || got.shape != tensors_[i].shape) {
      throw std::runtime_error(Describe(i, got.name, got.shape) + " is not the job's " +
                               Describe(i, tensors_[i].name, tensors_[i].shape));
    }
    std::vector<float>& to = i % 2 == 0 ? layers_[i / 2].w : layers_[i / 2].b;
    if (got.values.size() != to.size()) {
      throw std::runtime_error(Describe(i, got.name, got.shape) + " holds " +
                               std::to_string(got.values.size()) + " values");
    }
    to = got.values;
  }
}

NamedTensors MlpTrainer::Save() const {
  NamedTensors out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Layer& layer = layers_[i / 2];
    out.push_back({tensors_[i].name, tensors_[i].shape, i % 2 == 0 ? layer.w : layer.b});
  }
  return out;
}

double MlpTrainer::Forward(const float* x, int32_t label, bool* correct) {
  std::copy(x, x + train_.features, acts_[0].begin());
  for (size_t k = 0; k < layers_.size(); ++k) {
    const Layer& l = layers_[k];
    const float* in = acts_[k].data();
    float* out = acts_[k + 1].data();
    const bool last = k + 1 == layers_.size();
    for (int64_t o = 0; o < l.out; ++o) {
      const float* w = &l.w[static_cast<size_t>(o * l.in)];
      float sum = l.b[static_cast<size_t>(o)];
      for (int64_t i = 0; i < l.in; ++i) sum += w[i] * in[i];
      out[o] = last ? sum : std::max(sum, 0.0f);
    }
  }
  // Softmax cross-entropy on the logits; acts_.back() becomes the probabilities.
  std::vector<float>& logits = acts_.back();
  const auto top = std::max_element(logits.begin(), logits.end());
  *correct = top - logits.begin() == label;
  const float max_logit = *top;
  double sum = 0;
  for (float& z : logits) sum += std::exp(static_cast<double>(z - max_logit));
  const double label_logit = logits[static_cast<size_t>(label)];
  for (float& z : logits)
    z = static_cast<float>(std::exp(static_cast<double>(z - max_logit)) / sum);
  return std::log(sum) + max_logit - label_logit;
}

FitResult MlpTrainer::Fit(const NamedTensors& global, const FitConfig& config) {
  if (config.dp_sgd) {
    throw std::runtime_error(
        "embed_client does not implement DP-SGD, which this round asks for (the job's "
        "train.dp_sgd); train this job with `huddle client` instead");
  }
  if (config.epochs < 1 || config.batch_size < 1 || !(config.learning_rate > 0)) {
    throw std::runtime_error("bad training settings: epochs " + std::to_string(config.epochs) +
                             ", batch_size " + std::to_string(config.batch_size) +
                             ", learning_rate " + std::to_string(config.learning_rate));
  }
  Load(global);
  const float lr = static_cast<float>(config.learning_rate);
  const float momentum = static_cast<float>(config.momentum);
  const float decay = static_cast<float>(config.weight_decay);
  // Per layer: gradient sums of the batch and velocities (zero at the start of each round).
  std::vector<Layer> grad(layers_.size()), velocity(layers_.size());
  for (size_t k = 0; k < layers_.size(); ++k) {
    for (Layer* l : {&grad[k], &velocity[k]}) {
      l->w.assign(layers_[k].w.size(), 0.0f);
      l->b.assign(layers_[k].b.size(), 0.0f);
    }
  }
  std::vector<std::vector<float>> delta(layers_.size() + 1);
  for (size_t k = 0; k <= layers_.size(); ++k) delta[k].resize(acts_[k].size());

  std::mt19937_64 rng(config.seed);
  std::vector<int64_t> order(static_cast<size_t>(train_.rows));
  std::iota(order.begin(), order.end(), 0);
  double loss_sum = 0;
  int64_t correct_count = 0;
  for (int64_t epoch = 0; epoch < config.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    loss_sum = 0;
    correct_count = 0;
    for (int64_t start = 0; start < train_.rows; start += config.batch_size) {
      const int64_t end = std::min(train_.rows, start + config.batch_size);
      for (Layer& g : grad) {
        std::fill(g.w.begin(), g.w.end(), 0.0f);
        std::fill(g.b.begin(), g.b.end(), 0.0f);
      }
      for (int64_t r = start; r < end; ++r) {
        const int64_t row = order[static_cast<size_t>(r)];
        const int32_t label = train_.y[static_cast<size_t>(row)];
        bool correct = false;
        loss_sum += Forward(&train_.x[static_cast<size_t>(row * train_.features)], label, &correct);
        correct_count += correct;
        // dloss/dlogits = softmax - one-hot, then back through each layer.
        delta.back() = acts_.back();
        delta.back()[static_cast<size_t>(label)] -= 1.0f;
        for (size_t k = layers_.size(); k-- > 0;) {
          const Layer& l = layers_[k];
          const float* in = acts_[k].data();
          const float* d = delta[k + 1].data();
          float* d_in = delta[k].data();
          if (k > 0) std::fill(delta[k].begin(), delta[k].end(), 0.0f);
          for (int64_t o = 0; o < l.out; ++o) {
            if (d[o] == 0.0f) continue;
            const size_t row0 = static_cast<size_t>(o * l.in);
            float* gw = &grad[k].w[row0];
            grad[k].b[static_cast<size_t>(o)] += d[o];
            for (int64_t i = 0; i < l.in; ++i) gw[i] += d[o] * in[i];
            if (k == 0) continue;
            const float* w = &l.w[row0];
            for (int64_t i = 0; i < l.in; ++i) d_in[i] += w[i] * d[o];
          }
          // Through the ReLU that made this layer's input.
          if (k > 0) {
            for (int64_t i = 0; i < l.in; ++i) d_in[i] = in[i] > 0.0f ? d_in[i] : 0.0f;
          }
        }
      }
      // SGD with momentum (PyTorch semantics, as Huddle's own trainer):
      //   g = grad / batch + weight_decay * param;  v = momentum * v + g;  param -= lr * v
      const float inv_batch = 1.0f / static_cast<float>(end - start);
      for (size_t k = 0; k < layers_.size(); ++k) {
        for (auto [p, g, v] : {std::tuple{&layers_[k].w, &grad[k].w, &velocity[k].w},
                               std::tuple{&layers_[k].b, &grad[k].b, &velocity[k].b}}) {
          for (size_t i = 0; i < p->size(); ++i) {
            const float step = (*g)[i] * inv_batch + decay * (*p)[i];
            (*v)[i] = momentum * (*v)[i] + step;
            (*p)[i] -= lr * (*v)[i];
          }
        }
      }
    }
    if (!std::isfinite(loss_sum)) {
      throw std::runtime_error("training diverged in epoch " + std::to_string(epoch + 1) +
                               " (loss is not finite): lower train.learning_rate");
    }
  }
  FitResult result;
  result.tensors = Save();
  result.num_examples = train_.rows;
  const double rows = static_cast<double>(train_.rows);
  result.metrics = {{"loss", loss_sum / rows},
                    {"accuracy", static_cast<double>(correct_count) / rows}};
  return result;
}

EvaluateResult MlpTrainer::Evaluate(const NamedTensors& model) {
  Load(model);
  const Dataset& data = test_.rows > 0 ? test_ : train_;
  double loss_sum = 0;
  int64_t correct_count = 0;
  for (int64_t row = 0; row < data.rows; ++row) {
    bool correct = false;
    loss_sum += Forward(&data.x[static_cast<size_t>(row * data.features)],
                        data.y[static_cast<size_t>(row)], &correct);
    correct_count += correct;
  }
  EvaluateResult result;
  result.num_examples = data.rows;
  result.loss = loss_sum / static_cast<double>(data.rows);
  result.accuracy = static_cast<double>(correct_count) / static_cast<double>(data.rows);
  return result;
}

}  // namespace embed
