// NetWorkspace and the shared input checks (see net_workspace.h).
#include "models/internal/net_workspace.h"

#include <algorithm>
#include <cmath>
#include <new>

#include "common/rng.h"
#include "models/layers/registry.h"

namespace huddle::models::internal {

namespace {

using layers::InPlace;
using layers::LayerType;
using layers::TypeOf;

constexpr auto kFloat = static_cast<int64_t>(sizeof(float));

}  // namespace

NetWorkspace::NetWorkspace(kernels::Backend& backend, const ModelSpec& spec, bool training)
    : backend_(&backend), batch_norm_(spec.has_batch_norm()), training_(training) {
  const std::vector<std::vector<int64_t>> shapes = LayerShapes(spec).value();
  input_size_ = spec.input_dim();
  for (const TensorSpec& t : Layout(spec)) sizes_.push_back(t.NumElements());
  num_trainable_ = NumTrainable(spec);
  std::vector<int64_t> in_shape = spec.input;
  size_t param = 0, states = 0;
  first_trained_ = spec.layers.size();
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    Layer& layer = layers_.emplace_back();
    layer.spec = spec.layers[l];
    layer.in_shape = in_shape;
    layer.out_shape = shapes[l];
    layer.in_size = l == 0 ? input_size_ : layers_[l - 1].out_size;
    layer.out_size = 1;
    for (int64_t d : shapes[l]) layer.out_size *= d;
    const LayerType& type = TypeOf(layer.spec.kind);
    // In place where nothing needs the input afterwards: never on the gathered input, and an
    // activation or dropout not on a ReLU's or tanh's output (their backward passes read it).
    // (A flatten aliases its input, so look through it.)
    size_t p = l;
    while (p > 0 && TypeOf(spec.layers[p - 1].kind).in_place == InPlace::kAlways) --p;
    const bool prev_reads_output = p > 0 && TypeOf(spec.layers[p - 1].kind).backward_reads_output;
    layer.in_place = l > 0 && (type.in_place == InPlace::kAlways ||
                               (type.in_place == InPlace::kIfInputFree && !prev_reads_output));
    const size_t state =
        type.tensors != nullptr ? type.tensors(layer.spec, in_shape).state.size() : 0;
    if (state > 0) {
      layer.first_state = num_trainable_ + states;
      states += state;
    }
    first_param_.push_back(param);
    if (type.num_trainable > 0) {
      if (first_trained_ == spec.layers.size()) first_trained_ = l;
      param += type.num_trainable;
    }
    in_shape = shapes[l];
  }
  first_param_.push_back(param);
  for (int64_t size : sizes_) {
    offsets_.push_back(params_span_);
    params_span_ += (size + kParamAlign - 1) / kParamAlign * kParamAlign;
  }
}

StatusOr<std::unique_ptr<NetWorkspace>> NetWorkspace::Create(kernels::Backend& backend,
                                                             const ModelSpec& spec,
                                                             int64_t max_batch, bool training) {
  // The constructor reads the layer shapes as valid: an external or invalid spec stops here.
  HUDDLE_RETURN_IF_ERROR(ValidateModelSpec(spec));
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  std::unique_ptr<NetWorkspace> ws;
  if (spec.layers[0].kind == LayerKind::kScattering2d) {
    // The layers after it, on its output.
    const LayerSpec& l = spec.layers[0];
    ModelSpec rest;
    rest.input = LayerShapes(spec).value()[0];
    rest.layers.assign(spec.layers.begin() + 1, spec.layers.end());
    ws.reset(new NetWorkspace(backend, rest, training));
    ws->scattering_ = std::make_unique<kernels::ScatteringPlan>(kernels::MakeScatteringPlan(
        {spec.input[0], spec.input[1], spec.input[2], l.scales, l.angles}));
  } else {
    ws.reset(new NetWorkspace(backend, spec, training));
  }
  HUDDLE_ASSIGN_OR_RETURN(ws->params_, backend.Allocate(ws->params_span_ * kFloat));
  if (training) {
    // Gradients in the parameters' layout, gaps zero (a collective may reduce a whole range).
    HUDDLE_ASSIGN_OR_RETURN(ws->grads_, backend.Allocate(ws->params_span_ * kFloat));
    backend.Zero(ws->grads_.data(), ws->grads_.bytes());
  }
  HUDDLE_ASSIGN_OR_RETURN(ws->totals_, backend.Allocate(sizeof(kernels::LossAccumulator)));
  ws->ResetTotals();
  for (Layer& layer : ws->layers_) {
    const LayerType& type = TypeOf(layer.spec.kind);
    if (type.allocate != nullptr) HUDDLE_RETURN_IF_ERROR(type.allocate(backend, training, &layer));
  }
  HUDDLE_RETURN_IF_ERROR(ws->Reserve(max_batch));
  return ws;
}

Status NetWorkspace::Reserve(int64_t max_batch) {
  if (max_batch <= capacity_) return absl::OkStatus();
  HUDDLE_ASSIGN_OR_RETURN(x_, backend_->Allocate(max_batch * input_size_ * kFloat));
  HUDDLE_ASSIGN_OR_RETURN(labels_,
                          backend_->Allocate(max_batch * static_cast<int64_t>(sizeof(int32_t))));
  int64_t scratch = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    const int64_t floats = max_batch * layer.out_size;
    if (layer.in_place) {
      layer.out = l == 0 ? x_.as<float>() : layers_[l - 1].out;
      layer.dout = l == 0 ? nullptr : layers_[l - 1].dout;
    } else {
      HUDDLE_ASSIGN_OR_RETURN(layer.out_buffer, backend_->Allocate(floats * kFloat));
      layer.out = layer.out_buffer.as<float>();
      if (training_) {
        HUDDLE_ASSIGN_OR_RETURN(layer.dout_buffer, backend_->Allocate(floats * kFloat));
        layer.dout = layer.dout_buffer.as<float>();
      }
    }
    const LayerType& type = TypeOf(layer.spec.kind);
    if (type.reserve != nullptr) {
      HUDDLE_ASSIGN_OR_RETURN(const int64_t scratch_floats,
                              type.reserve(*backend_, max_batch, &layer));
      scratch = std::max(scratch, scratch_floats);
    }
  }
  if (scratch > 0) {
    HUDDLE_ASSIGN_OR_RETURN(scratch_, backend_->Allocate(scratch * kFloat));
  }
  capacity_ = max_batch;
  return absl::OkStatus();
}

void NetWorkspace::PackParams(const TensorList& params, std::vector<float>* packed) const {
  packed->assign(static_cast<size_t>(params_span_), 0.0f);
  for (size_t i = 0; i < sizes_.size(); ++i) {
    std::copy(params[i].data.begin(), params[i].data.end(), packed->begin() + offsets_[i]);
  }
}

void NetWorkspace::UnpackParams(const std::vector<float>& packed, TensorList* params) const {
  for (size_t i = 0; i < sizes_.size(); ++i) {
    const auto begin = packed.begin() + offsets_[i];
    std::copy(begin, begin + sizes_[i], (*params)[i].data.begin());
  }
}

void NetWorkspace::UploadParams(const TensorList& params) {
  // One copy of the whole model (CopyToDevice stages it, so packed_ is free again on return).
  PackParams(params, &packed_);
  backend_->CopyToDevice(params_base(), packed_.data(), params_.bytes());
}

Status NetWorkspace::DownloadParams(TensorList* params) {
  packed_.resize(static_cast<size_t>(params_span_));
  HUDDLE_RETURN_IF_ERROR(backend_->CopyToHost(packed_.data(), params_base(), params_.bytes()));
  UnpackParams(packed_, params);
  return absl::OkStatus();
}

Status NetWorkspace::LoadData(const data::DatasetView& view) {
  if (!scattering_) return LoadRows(view);
  // Transformed in slices of the view's rows, gathered contiguously first.
  const kernels::ScatteringPlan& plan = *scattering_;
  const data::Dataset& base = *view.base;
  const int64_t n = view.size(), in_dim = base.feature_dim;
  scattered_.feature_dim = input_size_;
  scattered_.num_classes = base.num_classes;
  try {
    scattered_.features.assign(static_cast<size_t>(n * input_size_), 0.0f);
    scattered_.labels.resize(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("the scattering2d features of ", n,
                                                     " examples (", input_size_,
                                                     " floats each) do not fit in host memory"));
  }
  constexpr int64_t kSliceRows = 256;
  std::vector<float> rows;
  for (int64_t begin = 0; begin < n; begin += kSliceRows) {
    const int64_t count = std::min(kSliceRows, n - begin);
    rows.resize(static_cast<size_t>(count * in_dim));
    for (int64_t k = 0; k < count; ++k) {
      const int64_t row = view.row(begin + k);
      std::copy(base.row_features(row), base.row_features(row) + in_dim, rows.begin() + k * in_dim);
      scattered_.labels[static_cast<size_t>(begin + k)] = base.labels[static_cast<size_t>(row)];
    }
    kernels::ScatteringForward(plan, rows.data(), count,
                               scattered_.features.data() + begin * input_size_);
  }
  return LoadRows(data::DatasetView{&scattered_, {}});
}

Status NetWorkspace::LoadRows(const data::DatasetView& view) {
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

Status NetWorkspace::SetOrder(const std::vector<int64_t>& positions) {
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

void NetWorkspace::Gather(int64_t begin, int64_t count) {
  backend_->GatherRows(features_, data_labels_, input_size_, order_.as<int64_t>() + begin, count,
                       x_.as<float>(), labels_.as<int32_t>());
}

layers::LayerPass NetWorkspace::PassFor(size_t l, int64_t batch, int64_t global_rows) const {
  const Layer& layer = layers_[l];
  layers::LayerPass pass{.backend = *backend_};
  pass.batch = batch;
  pass.global_rows = global_rows;
  pass.x = in(l);
  pass.dx = l > first_trained_ ? din(l) : nullptr;
  const size_t p = first_param_[l];
  if (first_param_[l + 1] > p) {  // weight and bias
    pass.weight = param(p);
    pass.bias = param(p + 1);
    if (training_) {
      pass.dweight = grad(p);
      pass.dbias = grad(p + 1);
    }
  }
  if (layer.first_state > 0) {  // batch norm's running statistics
    pass.running_mean = param(layer.first_state);
    pass.running_var = param(layer.first_state + 1);
  }
  pass.scratch = scratch_.as<float>();
  pass.sync = sync_;
  pass.pass_seed = DeriveSeed(dropout_seed_, passes_);
  pass.layer_index = l;
  pass.dropout_offset = static_cast<uint64_t>(dropout_first_row_ * layer.out_size);
  return pass;
}

void NetWorkspace::Forward(int64_t batch, bool training) {
  const int64_t global = sync_ != nullptr ? sync_->global_rows() : batch;
  if (training) ++passes_;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerType& type = TypeOf(layers_[l].spec.kind);
    // Only batch norm works on an empty batch (a data-parallel rank's share of the statistics).
    if (batch == 0 && !type.runs_on_empty_batch) continue;
    if (type.forward == nullptr) continue;  // scattering2d: applied by LoadData
    layers::LayerPass pass = PassFor(l, batch, global);
    pass.training = training;
    type.forward(pass, &layers_[l]);
  }
  const Layer& last = layers_.back();
  backend_->SoftmaxCrossEntropy(last.out, labels_.as<int32_t>(), batch, last.out_size,
                                training ? last.dout : nullptr,
                                totals_.as<kernels::LossAccumulator>());
}

void NetWorkspace::BackwardLayer(size_t l, int64_t batch, bool params) {
  const LayerType& type = TypeOf(layers_[l].spec.kind);
  const size_t p = first_param_[l], end = first_param_[l + 1];
  const int64_t global = sync_ != nullptr ? sync_->global_rows() : batch;
  if (batch == 0 && !type.runs_on_empty_batch) {
    // An empty share: this rank's parameter gradients are zeros.
    if (end > p)
      backend_->Zero(grad(p), (offsets_[end - 1] - offsets_[p] + sizes_[end - 1]) * kFloat);
    return;
  }
  if (type.backward != nullptr) type.backward(PassFor(l, batch, global), layers_[l], params);
}

void NetWorkspace::Backward(int64_t batch, const LayerDone& layer_done) {
  for (size_t l = layers_.size(); l-- > first_trained_;) {
    BackwardLayer(l, batch, /*params=*/true);
    if (layer_done) layer_done(l);
  }
  if (layer_done) {
    for (size_t l = first_trained_; l-- > 0;) layer_done(l);
  }
}

void NetWorkspace::BackwardForNorms(int64_t batch, double* squared) {
  // The first trained layer's parameter gradients are formed in the second pass only.
  for (size_t l = layers_.size(); l-- > first_trained_;) {
    BackwardLayer(l, batch, /*params=*/l != first_trained_);
  }
  backend_->Zero(squared, batch * static_cast<int64_t>(sizeof(double)));
  for (size_t l = first_trained_; l < layers_.size(); ++l) {
    const LayerType& type = TypeOf(layers_[l].spec.kind);
    if (type.add_squared_norms != nullptr) {
      type.add_squared_norms(PassFor(l, batch, batch), layers_[l], squared);
    }
  }
}

void NetWorkspace::ClippedGradientSum(int64_t batch, const float* factors) {
  for (size_t l = first_trained_; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const LayerType& type = TypeOf(layer.spec.kind);
    if (type.num_trainable == 0) continue;
    backend_->ScaleRows(layer.dout, batch, layer.out_size, factors);
    // A kind without per-example norms (batch norm) is refused under DP-SGD (CheckDpSgdModel).
    if (type.add_squared_norms == nullptr) continue;
    layers::LayerPass pass = PassFor(l, batch, batch);
    pass.dx = nullptr;
    type.backward(pass, layer, /*params=*/true);
  }
}

Status NetWorkspace::EnsureVelocity() {
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

Status NetWorkspace::DownloadVelocity(TensorList* velocity) {
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

Status NetWorkspace::UploadVelocity(const TensorList& velocity) {
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

Status NetWorkspace::Step(const kernels::SgdHyper& hyper) {
  if (hyper.momentum != 0.0f) HUDDLE_RETURN_IF_ERROR(EnsureVelocity());
  for (size_t i = 0; i < num_trainable_; ++i) {
    float* velocity = velocity_.empty() ? nullptr : velocity_[i].as<float>();
    backend_->SgdStep(hyper, grad(i), param(i), velocity, sizes_[i]);
  }
  return absl::OkStatus();
}

StatusOr<kernels::LossAccumulator> NetWorkspace::ReadTotals() {
  kernels::LossAccumulator totals;
  HUDDLE_RETURN_IF_ERROR(backend_->CopyToHost(&totals, totals_.data(), sizeof totals));
  return totals;
}

void NetWorkspace::ResetTotals() { backend_->Zero(totals_.data(), totals_.bytes()); }

kernels::Backend& BackendFor(const TrainOptions& options,
                             std::unique_ptr<kernels::Backend>* owned) {
  if (options.backend != nullptr) return *options.backend;
  *owned = kernels::OpenCpuBackend();
  return **owned;
}

}  // namespace huddle::models::internal
