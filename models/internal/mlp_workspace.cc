// MlpWorkspace and the shared input checks (see mlp_workspace.h).
#include "models/internal/mlp_workspace.h"

#include <algorithm>
#include <cmath>

#include "kernels/activation.h"
#include "kernels/dense.h"

namespace huddle::models::internal {

MlpWorkspace::MlpWorkspace(const MlpSpec& spec, int64_t max_batch, bool training)
    : training_(training) {
  widths_ = {spec.input_dim};
  widths_.insert(widths_.end(), spec.hidden.begin(), spec.hidden.end());
  widths_.push_back(spec.num_classes);
  const size_t layers = widths_.size() - 1;
  acts_.resize(layers);
  if (training) {
    dacts_.resize(layers);
    for (size_t l = 0; l < layers; ++l) {
      grads_.emplace_back(static_cast<size_t>(widths_[l + 1] * widths_[l]));
      grads_.emplace_back(static_cast<size_t>(widths_[l + 1]));
    }
  }
  Reserve(max_batch);
}

void MlpWorkspace::Reserve(int64_t max_batch) {
  if (max_batch <= capacity_) return;
  capacity_ = max_batch;
  x_.resize(static_cast<size_t>(max_batch * widths_[0]));
  labels_.resize(static_cast<size_t>(max_batch));
  for (size_t l = 0; l < num_layers(); ++l) {
    acts_[l].resize(static_cast<size_t>(max_batch * widths_[l + 1]));
    if (training_) dacts_[l].resize(static_cast<size_t>(max_batch * widths_[l + 1]));
  }
}

void MlpWorkspace::Gather(const data::DatasetView& view, const std::vector<int64_t>& order,
                          int64_t begin, int64_t count) {
  const data::Dataset& base = *view.base;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = view.row(order[static_cast<size_t>(begin + i)]);
    const float* src = base.row_features(row);
    std::copy(src, src + widths_[0], x_.begin() + i * widths_[0]);
    labels_[static_cast<size_t>(i)] = base.labels[static_cast<size_t>(row)];
  }
}

kernels::LossTotals MlpWorkspace::Forward(const TensorList& params, int64_t batch, bool training) {
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

void MlpWorkspace::Backward(const TensorList& params, int64_t batch) {
  for (size_t l = num_layers(); l-- > 0;) {
    const kernels::DenseShape shape{batch, widths_[l], widths_[l + 1]};
    const float* input = l == 0 ? x_.data() : acts_[l - 1].data();
    float* dinput = l == 0 ? nullptr : dacts_[l - 1].data();
    kernels::DenseBackward(shape, input, params[2 * l].data.data(), dacts_[l].data(),
                           grads_[2 * l].data(), grads_[2 * l + 1].data(), dinput);
    if (dinput != nullptr) kernels::ReluBackward(acts_[l - 1].data(), dinput, batch * widths_[l]);
  }
}

void MlpWorkspace::Step(const kernels::SgdHyper& hyper, TensorList* params) {
  if (hyper.momentum != 0.0f && velocity_.empty()) {
    for (const auto& g : grads_) velocity_.emplace_back(g.size(), 0.0f);
  }
  for (size_t i = 0; i < params->size(); ++i) {
    float* velocity = velocity_.empty() ? nullptr : velocity_[i].data();
    kernels::SgdStep(hyper, grads_[i].data(), (*params)[i].data.data(), velocity,
                     static_cast<int64_t>(grads_[i].size()));
  }
}

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

}  // namespace huddle::models::internal
