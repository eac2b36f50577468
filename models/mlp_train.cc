// TrainMlp and EvaluateMlp: minibatch SGD and batched inference through kernels/.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/rng.h"
#include "kernels/activation.h"
#include "kernels/dense.h"
#include "kernels/flush_denormals.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "models/mlp.h"

namespace huddle::models {
namespace {

// Buffers for one call, sized once for the largest batch. Layer l maps width_[l] -> width_[l + 1]
// with parameters params[2l] (weight) and params[2l + 1] (bias).
class MlpWorkspace {
 public:
  MlpWorkspace(const MlpSpec& spec, int64_t max_batch, bool training) {
    widths_ = {spec.input_dim};
    widths_.insert(widths_.end(), spec.hidden.begin(), spec.hidden.end());
    widths_.push_back(spec.num_classes);
    const size_t layers = widths_.size() - 1;
    x_.resize(static_cast<size_t>(max_batch * widths_[0]));
    labels_.resize(static_cast<size_t>(max_batch));
    for (size_t l = 0; l < layers; ++l) {
      acts_.emplace_back(static_cast<size_t>(max_batch * widths_[l + 1]));
      if (!training) continue;
      dacts_.emplace_back(static_cast<size_t>(max_batch * widths_[l + 1]));
      grads_.emplace_back(static_cast<size_t>(widths_[l + 1] * widths_[l]));
      grads_.emplace_back(static_cast<size_t>(widths_[l + 1]));
    }
  }

  size_t num_layers() const { return acts_.size(); }

  // Copies the view rows order[begin, begin + count) into the input and label buffers.
  void Gather(const data::DatasetView& view, const std::vector<int64_t>& order, int64_t begin,
              int64_t count) {
    const data::Dataset& base = *view.base;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = view.row(order[static_cast<size_t>(begin + i)]);
      const float* src = base.row_features(row);
      std::copy(src, src + widths_[0], x_.begin() + i * widths_[0]);
      labels_[static_cast<size_t>(i)] = base.labels[static_cast<size_t>(row)];
    }
  }

  // Forward pass over the gathered batch; with training, also writes dLoss/dlogits.
  kernels::LossTotals Forward(const TensorList& params, int64_t batch, bool training) {
    const float* input = x_.data();
    for (size_t l = 0; l < num_layers(); ++l) {
      const kernels::DenseShape shape{batch, widths_[l], widths_[l + 1]};
      float* out = acts_[l].data();
      kernels::DenseForward(shape, input, params[2 * l].data.data(), params[2 * l + 1].data.data(),
                            out);
      if (l + 1 < num_layers()) kernels::ReluForward(out, batch * widths_[l + 1]);
      input = out;
    }
    return kernels::SoftmaxCrossEntropy(acts_.back().data(), labels_.data(), batch, widths_.back(),
                                        training ? dacts_.back().data() : nullptr);
  }

  // Backward pass after Forward(training=true): fills grads_ for every parameter.
  void Backward(const TensorList& params, int64_t batch) {
    for (size_t l = num_layers(); l-- > 0;) {
      const kernels::DenseShape shape{batch, widths_[l], widths_[l + 1]};
      const float* input = l == 0 ? x_.data() : acts_[l - 1].data();
      float* dinput = l == 0 ? nullptr : dacts_[l - 1].data();
      kernels::DenseBackward(shape, input, params[2 * l].data.data(), dacts_[l].data(),
                             grads_[2 * l].data(), grads_[2 * l + 1].data(), dinput);
      if (dinput != nullptr) kernels::ReluBackward(acts_[l - 1].data(), dinput, batch * widths_[l]);
    }
  }

  // One SGD step on every parameter from grads_.
  void Step(const kernels::SgdHyper& hyper, TensorList* params) {
    if (hyper.momentum != 0.0f && velocity_.empty()) {
      for (const auto& g : grads_) velocity_.emplace_back(g.size(), 0.0f);
    }
    for (size_t i = 0; i < params->size(); ++i) {
      float* velocity = velocity_.empty() ? nullptr : velocity_[i].data();
      kernels::SgdStep(hyper, grads_[i].data(), (*params)[i].data.data(), velocity,
                       static_cast<int64_t>(grads_[i].size()));
    }
  }

 private:
  std::vector<int64_t> widths_;               // input_dim, hidden..., num_classes
  std::vector<float> x_;                      // [batch, input_dim]
  std::vector<int32_t> labels_;               // [batch]
  std::vector<std::vector<float>> acts_;      // layer l output [batch, widths_[l + 1]]
  std::vector<std::vector<float>> dacts_;     // dLoss/d acts_[l]
  std::vector<std::vector<float>> grads_;     // dLoss/d params[i]
  std::vector<std::vector<float>> velocity_;  // momentum buffers, allocated on first use
};

Status CheckTrainOptions(const TrainOptions& o) {
  if (o.epochs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("epochs is ", o.epochs, "; it must be >= 1"));
  }
  if (o.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", o.batch_size, "; it must be >= 1"));
  }
  if (!(o.learning_rate > 0.0 && std::isfinite(o.learning_rate))) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning_rate is ", o.learning_rate, "; it must be positive and finite"));
  }
  if (!(o.momentum >= 0.0 && o.momentum < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum is ", o.momentum, "; it must be in [0, 1)"));
  }
  if (!(o.weight_decay >= 0.0 && std::isfinite(o.weight_decay))) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay is ", o.weight_decay, "; it must be finite and >= 0"));
  }
  return absl::OkStatus();
}

// Checks params against the spec and every row of the view against the model.
Status CheckModelAndData(const MlpSpec& spec, const TensorList& params,
                         const data::DatasetView& view) {
  HUDDLE_RETURN_IF_ERROR(CheckParams(spec, params));
  HUDDLE_RETURN_IF_ERROR(data::ValidateView(view));
  const data::Dataset& base = *view.base;
  if (base.feature_dim != spec.input_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("the data has ", base.feature_dim,
                     " features per example but the MLP's input_dim is ", spec.input_dim));
  }
  if (base.features.size() != static_cast<size_t>(base.size() * base.feature_dim)) {
    return absl::InvalidArgumentError(absl::StrCat("the data has ", base.features.size(),
                                                   " feature values for ", base.size(),
                                                   " examples of ", base.feature_dim));
  }
  if (view.size() == 0) return absl::InvalidArgumentError("the data has no examples");
  for (int64_t i = 0; i < view.size(); ++i) {
    const int32_t label = base.labels[static_cast<size_t>(view.row(i))];
    if (label < 0 || label >= spec.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat("example ", view.row(i), " has label ", label,
                                                     ", outside the MLP's [0, ", spec.num_classes,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<TrainStats> TrainMlp(const MlpSpec& spec, const TrainOptions& options,
                              const data::DatasetView& data, uint64_t seed, TensorList* params) {
  const Clock* clock = options.clock != nullptr ? options.clock : SteadyClock::Get();
  const int64_t start_ms = clock->NowMs();
  if (params == nullptr) return absl::InvalidArgumentError("TrainMlp: params is null");
  HUDDLE_RETURN_IF_ERROR(CheckTrainOptions(options));
  HUDDLE_RETURN_IF_ERROR(CheckModelAndData(spec, *params, data));

  kernels::FlushDenormalsScope flush_denormals;
  const int64_t n = data.size();
  const int64_t max_batch = std::min(options.batch_size, n);
  MlpWorkspace workspace(spec, max_batch, /*training=*/true);
  const kernels::SgdHyper hyper{static_cast<float>(options.learning_rate),
                                static_cast<float>(options.momentum),
                                static_cast<float>(options.weight_decay)};
  std::vector<int64_t> order(static_cast<size_t>(n));
  double loss_sum = 0.0;
  int64_t correct = 0;
  TrainStats stats;
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), int64_t{0});
    Rng rng(DeriveSeed(seed, static_cast<uint64_t>(epoch)));
    rng.Shuffle(order);
    for (int64_t begin = 0; begin < n; begin += max_batch) {
      const int64_t batch = std::min(max_batch, n - begin);
      workspace.Gather(data, order, begin, batch);
      const kernels::LossTotals totals = workspace.Forward(*params, batch, /*training=*/true);
      if (!std::isfinite(totals.loss_sum)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "training diverged: non-finite loss at epoch ", epoch, " step ", stats.steps,
            " (learning_rate ", options.learning_rate, " is probably too high)"));
      }
      workspace.Backward(*params, batch);
      workspace.Step(hyper, params);
      loss_sum += totals.loss_sum;
      correct += totals.correct;
      ++stats.steps;
    }
  }
  stats.examples = n * options.epochs;
  stats.loss = loss_sum / static_cast<double>(stats.examples);
  stats.accuracy = static_cast<double>(correct) / static_cast<double>(stats.examples);
  stats.seconds = static_cast<double>(clock->NowMs() - start_ms) / 1000.0;
  return stats;
}

StatusOr<EvalStats> EvaluateMlp(const MlpSpec& spec, const TensorList& params,
                                const data::DatasetView& data, int64_t batch_size) {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", batch_size, "; it must be >= 1"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckModelAndData(spec, params, data));

  kernels::FlushDenormalsScope flush_denormals;
  const int64_t n = data.size();
  const int64_t max_batch = std::min(batch_size, n);
  MlpWorkspace workspace(spec, max_batch, /*training=*/false);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += max_batch) {
    const int64_t batch = std::min(max_batch, n - begin);
    workspace.Gather(data, order, begin, batch);
    const kernels::LossTotals totals = workspace.Forward(params, batch, /*training=*/false);
    loss_sum += totals.loss_sum;
    correct += totals.correct;
  }
  EvalStats stats;
  stats.examples = n;
  stats.loss = loss_sum / static_cast<double>(n);
  stats.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  return stats;
}

}  // namespace huddle::models
