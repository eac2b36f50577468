// MlpWorkspace and the shared input checks (see mlp_workspace.h).
#include "models/internal/mlp_workspace.h"

#include <algorithm>
#include <cmath>

namespace huddle::models::internal {

MlpWorkspace::MlpWorkspace(kernels::Backend& backend, const MlpSpec& spec, bool training)
    : backend_(&backend), batch_norm_(spec.batch_norm), training_(training) {
  widths_ = {spec.input_dim};
  widths_.insert(widths_.end(), spec.hidden.begin(), spec.hidden.end());
  widths_.push_back(spec.num_classes);
  for (const TensorSpec& t : MlpLayout(spec)) sizes_.push_back(t.NumElements());
  num_trainable_ = NumTrainable(spec);
  for (size_t l = 0, i = 0; l <= num_layers(); ++l) {
    first_param_.push_back(i);
    i += batch_norm_ && l + 1 < num_layers() ? 4 : 2;
  }
  for (int64_t size : sizes_) {
    offsets_.push_back(params_span_);
    params_span_ += (size + kParamAlign - 1) / kParamAlign * kParamAlign;
  }
}

StatusOr<std::unique_ptr<MlpWorkspace>> MlpWorkspace::Create(kernels::Backend& backend,
                                                             const MlpSpec& spec, int64_t max_batch,
                                                             bool training) {
  std::unique_ptr<MlpWorkspace> ws(new MlpWorkspace(backend, spec, training));
  HUDDLE_ASSIGN_OR_RETURN(ws->params_,
                          backend.Allocate(ws->params_span_ * static_cast<int64_t>(sizeof(float))));
  if (training) {
    // Gradients in the parameters' layout, gaps zero (a collective may reduce a whole range).
    HUDDLE_ASSIGN_OR_RETURN(
        ws->grads_, backend.Allocate(ws->params_span_ * static_cast<int64_t>(sizeof(float))));
    backend.Zero(ws->grads_.data(), ws->grads_.bytes());
  }
  HUDDLE_ASSIGN_OR_RETURN(ws->totals_, backend.Allocate(sizeof(kernels::LossAccumulator)));
  ws->ResetTotals();
  ws->acts_.resize(ws->num_layers());
  if (training) ws->dacts_.resize(ws->num_layers());
  if (ws->batch_norm_) {
    const size_t hidden = ws->num_layers() - 1;
    ws->pre_.resize(hidden);
    for (size_t l = 0; l < hidden; ++l) {
      const int64_t width = ws->widths_[l + 1];
      HUDDLE_ASSIGN_OR_RETURN(ws->invstd_.emplace_back(),
                              backend.Allocate(width * static_cast<int64_t>(sizeof(float))));
      if (!training) continue;
      HUDDLE_ASSIGN_OR_RETURN(ws->mean_.emplace_back(),
                              backend.Allocate(width * static_cast<int64_t>(sizeof(float))));
      HUDDLE_ASSIGN_OR_RETURN(ws->sums_.emplace_back(),
                              backend.Allocate(2 * width * static_cast<int64_t>(sizeof(double))));
    }
  }
  HUDDLE_RETURN_IF_ERROR(ws->Reserve(max_batch));
  return ws;
}

Status MlpWorkspace::Reserve(int64_t max_batch) {
  if (max_batch <= capacity_) return absl::OkStatus();
  constexpr auto kFloat = static_cast<int64_t>(sizeof(float));
  HUDDLE_ASSIGN_OR_RETURN(x_, backend_->Allocate(max_batch * widths_[0] * kFloat));
  HUDDLE_ASSIGN_OR_RETURN(labels_,
                          backend_->Allocate(max_batch * static_cast<int64_t>(sizeof(int32_t))));
  for (size_t l = 0; l < num_layers(); ++l) {
    HUDDLE_ASSIGN_OR_RETURN(acts_[l], backend_->Allocate(max_batch * widths_[l + 1] * kFloat));
    if (l < pre_.size()) {
      HUDDLE_ASSIGN_OR_RETURN(pre_[l], backend_->Allocate(max_batch * widths_[l + 1] * kFloat));
    }
    if (training_) {
      HUDDLE_ASSIGN_OR_RETURN(dacts_[l], backend_->Allocate(max_batch * widths_[l + 1] * kFloat));
    }
  }
  capacity_ = max_batch;
  return absl::OkStatus();
}

void MlpWorkspace::PackParams(const TensorList& params, std::vector<float>* packed) const {
  packed->assign(static_cast<size_t>(params_span_), 0.0f);
  for (size_t i = 0; i < sizes_.size(); ++i) {
    std::copy(params[i].data.begin(), params[i].data.end(), packed->begin() + offsets_[i]);
  }
}

void MlpWorkspace::UnpackParams(const std::vector<float>& packed, TensorList* params) const {
  for (size_t i = 0; i < sizes_.size(); ++i) {
    const auto begin = packed.begin() + offsets_[i];
    std::copy(begin, begin + sizes_[i], (*params)[i].data.begin());
  }
}

void MlpWorkspace::UploadParams(const TensorList& params) {
  // One copy of the whole model (CopyToDevice stages it, so packed_ is free again on return).
  PackParams(params, &packed_);
  backend_->CopyToDevice(params_base(), packed_.data(), params_.bytes());
}

Status MlpWorkspace::DownloadParams(TensorList* params) {
  packed_.resize(static_cast<size_t>(params_span_));
  HUDDLE_RETURN_IF_ERROR(backend_->CopyToHost(packed_.data(), params_base(), params_.bytes()));
  UnpackParams(packed_, params);
  return absl::OkStatus();
}

Status MlpWorkspace::LoadData(const data::DatasetView& view) {
  const data::Dataset& base = *view.base;
  if (backend_->kind() == kernels::DeviceKind::kCpu) {
    // Host memory is the CPU backend's device memory: read the dataset in place.
    features_ = base.features.data();
    data_labels_ = base.labels.data();
    view_rows_ = view.indices;
    return absl::OkStatus();
  }
  const int64_t n = view.size(), dim = base.feature_dim;
  HUDDLE_ASSIGN_OR_RETURN(data_features_buffer_,
                          backend_->Allocate(n * dim * static_cast<int64_t>(sizeof(float))));
  HUDDLE_ASSIGN_OR_RETURN(data_labels_buffer_,
                          backend_->Allocate(n * static_cast<int64_t>(sizeof(int32_t))));
  if (view.indices.empty()) {
    backend_->CopyToDevice(data_features_buffer_.data(), base.features.data(),
                           n * dim * static_cast<int64_t>(sizeof(float)));
    backend_->CopyToDevice(data_labels_buffer_.data(), base.labels.data(),
                           n * static_cast<int64_t>(sizeof(int32_t)));
  } else {
    // Gathered on the host in slices, uploaded in view order.
    constexpr int64_t kSliceRows = 1024;
    std::vector<float> features;
    std::vector<int32_t> labels;
    for (int64_t begin = 0; begin < n; begin += kSliceRows) {
      const int64_t count = std::min(kSliceRows, n - begin);
      features.resize(static_cast<size_t>(count * dim));
      labels.resize(static_cast<size_t>(count));
      for (int64_t k = 0; k < count; ++k) {
        const int64_t row = view.row(begin + k);
        std::copy(base.row_features(row), base.row_features(row) + dim, features.begin() + k * dim);
        labels[static_cast<size_t>(k)] = base.labels[static_cast<size_t>(row)];
      }
      backend_->CopyToDevice(data_features_buffer_.as<float>() + begin * dim, features.data(),
                             count * dim * static_cast<int64_t>(sizeof(float)));
      backend_->CopyToDevice(data_labels_buffer_.as<int32_t>() + begin, labels.data(),
                             count * static_cast<int64_t>(sizeof(int32_t)));
    }
  }
  features_ = data_features_buffer_.as<float>();
  data_labels_ = data_labels_buffer_.as<int32_t>();
  view_rows_.clear();
  return absl::OkStatus();
}

Status MlpWorkspace::SetOrder(const std::vector<int64_t>& positions) {
  const auto count = static_cast<int64_t>(positions.size());
  if (count > order_capacity_) {
    HUDDLE_ASSIGN_OR_RETURN(order_,
                            backend_->Allocate(count * static_cast<int64_t>(sizeof(int64_t))));
    order_capacity_ = count;
  }
  const int64_t* rows = positions.data();
  if (!view_rows_.empty()) {
    order_host_.resize(positions.size());
    for (size_t k = 0; k < positions.size(); ++k) {
      order_host_[k] = view_rows_[static_cast<size_t>(positions[k])];
    }
    rows = order_host_.data();
  }
  backend_->CopyToDevice(order_.data(), rows, count * static_cast<int64_t>(sizeof(int64_t)));
  return absl::OkStatus();
}

void MlpWorkspace::Gather(int64_t begin, int64_t count) {
  backend_->GatherRows(features_, data_labels_, widths_[0], order_.as<int64_t>() + begin, count,
                       x_.as<float>(), labels_.as<int32_t>());
}

void MlpWorkspace::Forward(int64_t batch, bool training) {
  const float* input = x_.as<float>();
  const int64_t count = sync_ != nullptr ? sync_->global_rows() : batch;
  for (size_t l = 0; l < num_layers(); ++l) {
    const int64_t width = widths_[l + 1];
    const kernels::DenseShape shape{batch, widths_[l], width};
    const size_t p = first_param_[l];
    float* out = layer_output(l);
    const bool hidden = l + 1 < num_layers();
    if (!hidden || !batch_norm_) {
      backend_->DenseForward(shape, input, param(p), param(p + 1), out);
      if (hidden) backend_->ReluForward(out, batch * width);
      input = out;
      continue;
    }
    // Dense -> BatchNorm -> ReLU: the dense output is kept for the backward pass.
    float* pre = pre_[l].as<float>();
    backend_->DenseForward(shape, input, param(p), param(p + 1), pre);
    const float* gamma = param(p + 2);
    const float* beta = param(p + 3);
    float* running_mean = param(num_trainable_ + 2 * l);
    float* running_var = param(num_trainable_ + 2 * l + 1);
    float* invstd = invstd_[l].as<float>();
    if (training) {
      auto* sums = sums_[l].as<double>();
      backend_->BatchNormSums(pre, batch, width, sums);
      if (sync_ != nullptr) sync_->AllReduceSum(sums, 2 * width);
      float* mean = mean_[l].as<float>();
      backend_->BatchNormMoments(sums, count, width, kBatchNormEps, mean, invstd);
      backend_->BatchNormUpdateRunning(sums, count, width, kBatchNormMomentum, running_mean,
                                       running_var);
      backend_->BatchNormForward(pre, batch, width, mean, invstd, gamma, beta, out);
    } else {
      backend_->BatchNormInvStd(running_var, width, kBatchNormEps, invstd);
      backend_->BatchNormForward(pre, batch, width, running_mean, invstd, gamma, beta, out);
    }
    backend_->ReluForward(out, batch * width);
    input = out;
  }
  backend_->SoftmaxCrossEntropy(layer_output(num_layers() - 1), labels_.as<int32_t>(), batch,
                                widths_.back(), training ? layer_grad(num_layers() - 1) : nullptr,
                                totals_.as<kernels::LossAccumulator>());
}

void MlpWorkspace::Backward(int64_t batch, const LayerDone& layer_done) {
  const int64_t count = sync_ != nullptr ? sync_->global_rows() : batch;
  for (size_t l = num_layers(); l-- > 0;) {
    const kernels::DenseShape shape{batch, widths_[l], widths_[l + 1]};
    const float* input = l == 0 ? x_.as<float>() : layer_output(l - 1);
    float* dinput = l == 0 ? nullptr : layer_grad(l - 1);
    const size_t p = first_param_[l];
    backend_->DenseBackward(shape, input, param(p), layer_grad(l), grad(p), grad(p + 1), dinput);
    if (layer_done) layer_done(l);
    if (dinput == nullptr) continue;
    const int64_t width = widths_[l];
    backend_->ReluBackward(layer_output(l - 1), dinput, batch * width);
    if (!batch_norm_) continue;
    // Through layer l - 1's batch norm, to the gradient of its dense output.
    const size_t q = first_param_[l - 1];
    const float* pre = pre_[l - 1].as<float>();
    const float* mean = mean_[l - 1].as<float>();
    const float* invstd = invstd_[l - 1].as<float>();
    auto* sums = sums_[l - 1].as<double>();
    backend_->BatchNormBackwardSums(dinput, pre, mean, invstd, batch, width, sums);
    backend_->BatchNormParamGrads(sums, width, grad(q + 2), grad(q + 3));
    if (sync_ != nullptr) sync_->AllReduceSum(sums, 2 * width);
    backend_->BatchNormBackwardInput(dinput, pre, mean, invstd, param(q + 2), sums, count, batch,
                                     width, dinput);
  }
}

Status MlpWorkspace::EnsureVelocity() {
  if (!velocity_.empty()) return absl::OkStatus();
  for (size_t i = 0; i < num_trainable_; ++i) {
    const int64_t size = sizes_[i];
    HUDDLE_ASSIGN_OR_RETURN(kernels::DeviceBuffer v,
                            backend_->Allocate(size * static_cast<int64_t>(sizeof(float))));
    backend_->Zero(v.data(), v.bytes());
    velocity_.push_back(std::move(v));
  }
  return absl::OkStatus();
}

Status MlpWorkspace::DownloadVelocity(TensorList* velocity) {
  velocity->clear();
  for (size_t i = 0; i < velocity_.size(); ++i) {
    Tensor t;
    t.spec.name = absl::StrCat("velocity.", i);
    t.spec.shape = {sizes_[i]};
    t.data.resize(static_cast<size_t>(sizes_[i]));
    HUDDLE_RETURN_IF_ERROR(
        backend_->CopyToHost(t.data.data(), velocity_[i].data(), velocity_[i].bytes()));
    velocity->push_back(std::move(t));
  }
  return absl::OkStatus();
}

Status MlpWorkspace::UploadVelocity(const TensorList& velocity) {
  if (velocity.empty()) {
    velocity_.clear();
    return absl::OkStatus();
  }
  if (velocity.size() != num_trainable_) {
    return absl::InvalidArgumentError(absl::StrCat("momentum state has ", velocity.size(),
                                                   " tensors; the model has ", num_trainable_,
                                                   " trained parameters"));
  }
  for (size_t i = 0; i < num_trainable_; ++i) {
    if (static_cast<int64_t>(velocity[i].data.size()) != sizes_[i]) {
      return absl::InvalidArgumentError(absl::StrCat("momentum tensor ", i, " has ",
                                                     velocity[i].data.size(), " values; parameter ",
                                                     i, " has ", sizes_[i]));
    }
  }
  HUDDLE_RETURN_IF_ERROR(EnsureVelocity());
  for (size_t i = 0; i < num_trainable_; ++i) {
    backend_->CopyToDevice(velocity_[i].data(), velocity[i].data.data(), velocity_[i].bytes());
  }
  return absl::OkStatus();
}

Status MlpWorkspace::Step(const kernels::SgdHyper& hyper) {
  if (hyper.momentum != 0.0f) HUDDLE_RETURN_IF_ERROR(EnsureVelocity());
  for (size_t i = 0; i < num_trainable_; ++i) {
    float* velocity = velocity_.empty() ? nullptr : velocity_[i].as<float>();
    backend_->SgdStep(hyper, grad(i), param(i), velocity, sizes_[i]);
  }
  return absl::OkStatus();
}

StatusOr<kernels::LossAccumulator> MlpWorkspace::ReadTotals() {
  kernels::LossAccumulator totals;
  HUDDLE_RETURN_IF_ERROR(backend_->CopyToHost(&totals, totals_.data(), sizeof totals));
  return totals;
}

void MlpWorkspace::ResetTotals() { backend_->Zero(totals_.data(), totals_.bytes()); }

kernels::Backend& BackendFor(const TrainOptions& options,
                             std::unique_ptr<kernels::Backend>* owned) {
  if (options.backend != nullptr) return *options.backend;
  *owned = kernels::OpenCpuBackend();
  return **owned;
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
