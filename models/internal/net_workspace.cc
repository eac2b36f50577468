// NetWorkspace and the shared input checks (see net_workspace.h).
#include "models/internal/net_workspace.h"

#include <algorithm>
#include <cmath>
#include <new>

#include "common/rng.h"

namespace huddle::models::internal {

namespace {

constexpr auto kFloat = static_cast<int64_t>(sizeof(float));

kernels::DenseShape DenseOf(int64_t batch, int64_t in, int64_t out) { return {batch, in, out}; }

kernels::Conv2dShape ConvOf(const LayerSpec& l, const std::vector<int64_t>& in, int64_t batch) {
  kernels::Conv2dShape s;
  s.batch = batch;
  s.in_channels = in[0];
  s.height = in[1];
  s.width = in[2];
  s.out_channels = l.out;
  s.kernel_h = s.kernel_w = l.kernel;
  s.stride_h = s.stride_w = l.effective_stride();
  s.pad_h = s.pad_w = l.padding;
  return s;
}

kernels::Pool2dShape PoolOf(const LayerSpec& l, const std::vector<int64_t>& in, int64_t batch) {
  kernels::Pool2dShape s;
  s.batch = batch;
  s.channels = in[0];
  s.height = in[1];
  s.width = in[2];
  s.kernel_h = s.kernel_w = l.kernel;
  s.stride_h = s.stride_w = l.effective_stride();
  s.pad_h = s.pad_w = l.padding;
  return s;
}

// Values per channel of one example (1 for flat features).
int64_t Spatial(const std::vector<int64_t>& shape) {
  int64_t spatial = 1;
  for (size_t d = 1; d < shape.size(); ++d) spatial *= shape[d];
  return spatial;
}

kernels::GroupNormShape GroupNormOf(const LayerSpec& l, const std::vector<int64_t>& in,
                                    int64_t batch) {
  return {batch, in[0], Spatial(in), l.groups};
}

}  // namespace

NetWorkspace::NetWorkspace(kernels::Backend& backend, const ModelSpec& spec, bool training)
    : backend_(&backend), batch_norm_(spec.has_batch_norm()), training_(training) {
  const std::vector<std::vector<int64_t>> shapes = LayerShapes(spec).value();
  input_size_ = spec.input_dim();
  for (const TensorSpec& t : Layout(spec)) sizes_.push_back(t.NumElements());
  num_trainable_ = NumTrainable(spec);
  std::vector<int64_t> in_shape = spec.input;
  size_t param = 0, bn = 0;
  first_trained_ = spec.layers.size();
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    Layer& layer = layers_.emplace_back();
    layer.spec = spec.layers[l];
    layer.in_shape = in_shape;
    layer.out_shape = shapes[l];
    layer.in_size = l == 0 ? input_size_ : layers_[l - 1].out_size;
    layer.out_size = 1;
    for (int64_t d : shapes[l]) layer.out_size *= d;
    const LayerKind kind = layer.spec.kind;
    // In place where nothing needs the input afterwards: never on the gathered input, and an
    // activation or dropout not on a ReLU's or tanh's output (their backward passes read it).
    // (A flatten aliases its input, so look through it.)
    size_t p = l;
    while (p > 0 && spec.layers[p - 1].kind == LayerKind::kFlatten) --p;
    const LayerKind prev = p == 0 ? LayerKind::kFlatten : spec.layers[p - 1].kind;
    const bool prev_reads_output = prev == LayerKind::kRelu || prev == LayerKind::kTanh;
    layer.in_place =
        kind == LayerKind::kFlatten ||
        (l > 0 && !prev_reads_output &&
         (kind == LayerKind::kRelu || kind == LayerKind::kTanh || kind == LayerKind::kDropout));
    if (kind == LayerKind::kFlatten && l == 0) layer.in_place = false;
    if (kind == LayerKind::kBatchNorm) layer.bn_index = bn++;
    first_param_.push_back(param);
    if (HasParameters(kind)) {
      if (first_trained_ == spec.layers.size()) first_trained_ = l;
      param += 2;
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
    if (layer.spec.kind != LayerKind::kBatchNorm) continue;
    const int64_t channels = layer.in_shape[0];
    HUDDLE_ASSIGN_OR_RETURN(layer.invstd, backend.Allocate(channels * kFloat));
    if (!training) continue;
    HUDDLE_ASSIGN_OR_RETURN(layer.mean, backend.Allocate(channels * kFloat));
    HUDDLE_ASSIGN_OR_RETURN(layer.sums,
                            backend.Allocate(2 * channels * static_cast<int64_t>(sizeof(double))));
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
    switch (layer.spec.kind) {
      case LayerKind::kConv2d:
        scratch = std::max(
            scratch, kernels::Conv2dScratchFloats(ConvOf(layer.spec, layer.in_shape, max_batch)));
        break;
      case LayerKind::kMaxPool2d: {
        HUDDLE_ASSIGN_OR_RETURN(layer.argmax,
                                backend_->Allocate(floats * static_cast<int64_t>(sizeof(int32_t))));
        break;
      }
      case LayerKind::kGroupNorm: {
        HUDDLE_ASSIGN_OR_RETURN(layer.mean,
                                backend_->Allocate(max_batch * layer.spec.groups * kFloat));
        HUDDLE_ASSIGN_OR_RETURN(layer.invstd,
                                backend_->Allocate(max_batch * layer.spec.groups * kFloat));
        break;
      }
      default:
        break;
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

void NetWorkspace::Forward(int64_t batch, bool training) {
  const int64_t global = sync_ != nullptr ? sync_->global_rows() : batch;
  if (training) ++passes_;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    const LayerSpec& spec = layer.spec;
    const float* x = in(l);
    float* y = layer.out;
    const int64_t n = batch * layer.out_size;
    // Only batch norm works on an empty batch (a data-parallel rank's share of the statistics).
    if (batch == 0 && spec.kind != LayerKind::kBatchNorm) continue;
    switch (spec.kind) {
      case LayerKind::kDense:
        backend_->DenseForward(DenseOf(batch, layer.in_size, layer.out_size), x,
                               param(first_param_[l]), param(first_param_[l] + 1), y);
        break;
      case LayerKind::kConv2d:
        backend_->Conv2dForward(ConvOf(spec, layer.in_shape, batch), x, param(first_param_[l]),
                                param(first_param_[l] + 1), y, scratch_.as<float>());
        break;
      case LayerKind::kMaxPool2d:
        backend_->MaxPool2dForward(PoolOf(spec, layer.in_shape, batch), x, y,
                                   layer.argmax.as<int32_t>());
        break;
      case LayerKind::kAvgPool2d:
        backend_->AvgPool2dForward(PoolOf(spec, layer.in_shape, batch), x, y);
        break;
      case LayerKind::kBatchNorm: {
        const int64_t channels = layer.in_shape[0], spatial = Spatial(layer.in_shape);
        const float* gamma = param(first_param_[l]);
        const float* beta = param(first_param_[l] + 1);
        float* running_mean = param(num_trainable_ + 2 * layer.bn_index);
        float* running_var = param(num_trainable_ + 2 * layer.bn_index + 1);
        float* invstd = layer.invstd.as<float>();
        if (training) {
          auto* sums = layer.sums.as<double>();
          backend_->BatchNormSums(x, batch, channels, spatial, sums);
          if (sync_ != nullptr) sync_->AllReduceSum(sums, 2 * channels);
          float* mean = layer.mean.as<float>();
          backend_->BatchNormMoments(sums, global * spatial, channels, kBatchNormEps, mean, invstd);
          backend_->BatchNormUpdateRunning(sums, global * spatial, channels, kBatchNormMomentum,
                                           running_mean, running_var);
          backend_->BatchNormForward(x, batch, channels, spatial, mean, invstd, gamma, beta, y);
        } else {
          backend_->BatchNormInvStd(running_var, channels, kBatchNormEps, invstd);
          backend_->BatchNormForward(x, batch, channels, spatial, running_mean, invstd, gamma, beta,
                                     y);
        }
        break;
      }
      case LayerKind::kGroupNorm:
        backend_->GroupNormForward(GroupNormOf(spec, layer.in_shape, batch), x,
                                   param(first_param_[l]), param(first_param_[l] + 1),
                                   kGroupNormEps, y, layer.mean.as<float>(),
                                   layer.invstd.as<float>());
        break;
      case LayerKind::kRelu:
        if (y != x) backend_->CopyOnDevice(y, x, n * kFloat);
        backend_->ReluForward(y, n);
        break;
      case LayerKind::kTanh:
        if (y != x) backend_->CopyOnDevice(y, x, n * kFloat);
        backend_->TanhForward(y, n);
        break;
      case LayerKind::kDropout:
        if (y != x) backend_->CopyOnDevice(y, x, n * kFloat);
        if (training && spec.rate > 0) {
          layer.dropout_seed = DeriveSeed(DeriveSeed(dropout_seed_, passes_), l);
          backend_->DropoutForward(y, n, static_cast<float>(spec.rate), layer.dropout_seed,
                                   DropoutOffset(layer));
        }
        break;
      case LayerKind::kFlatten:
        if (y != x) backend_->CopyOnDevice(y, x, n * kFloat);
        break;
      case LayerKind::kScattering2d:  // applied by LoadData, never a workspace layer
        break;
    }
  }
  const Layer& last = layers_.back();
  backend_->SoftmaxCrossEntropy(last.out, labels_.as<int32_t>(), batch, last.out_size,
                                training ? last.dout : nullptr,
                                totals_.as<kernels::LossAccumulator>());
}

void NetWorkspace::BackwardLayer(size_t l, int64_t batch, bool params) {
  Layer& layer = layers_[l];
  const LayerSpec& spec = layer.spec;
  const float* x = in(l);
  const float* dy = layer.dout;
  float* dx = l > first_trained_ ? din(l) : nullptr;
  const int64_t n = batch * layer.out_size;
  const size_t p = first_param_[l];
  const int64_t global = sync_ != nullptr ? sync_->global_rows() : batch;
  if (batch == 0 && spec.kind != LayerKind::kBatchNorm) {
    // An empty share: this rank's parameter gradients are zeros.
    if (HasParameters(spec.kind)) {
      backend_->Zero(grad(p), (offsets_[p + 1] - offsets_[p] + sizes_[p + 1]) * kFloat);
    }
    return;
  }
  switch (spec.kind) {
    case LayerKind::kDense:
      if (!params && dx == nullptr) return;
      backend_->DenseBackward(DenseOf(batch, layer.in_size, layer.out_size), x, param(p), dy,
                              grad(p), grad(p + 1), dx);
      return;
    case LayerKind::kConv2d:
      if (!params && dx == nullptr) return;
      backend_->Conv2dBackward(ConvOf(spec, layer.in_shape, batch), x, param(p), dy, grad(p),
                               grad(p + 1), dx, scratch_.as<float>());
      return;
    case LayerKind::kMaxPool2d:
      if (dx != nullptr) {
        backend_->MaxPool2dBackward(PoolOf(spec, layer.in_shape, batch), dy,
                                    layer.argmax.as<int32_t>(), dx);
      }
      return;
    case LayerKind::kAvgPool2d:
      if (dx != nullptr) backend_->AvgPool2dBackward(PoolOf(spec, layer.in_shape, batch), dy, dx);
      return;
    case LayerKind::kBatchNorm: {
      // Through the batch norm, to the gradient of its input (kernels/batch_norm.h steps 6-8).
      const int64_t channels = layer.in_shape[0], spatial = Spatial(layer.in_shape);
      const float* mean = layer.mean.as<float>();
      const float* invstd = layer.invstd.as<float>();
      auto* sums = layer.sums.as<double>();
      backend_->BatchNormBackwardSums(dy, x, mean, invstd, batch, channels, spatial, sums);
      backend_->BatchNormParamGrads(sums, channels, grad(p), grad(p + 1));
      if (sync_ != nullptr) sync_->AllReduceSum(sums, 2 * channels);
      if (dx != nullptr) {
        backend_->BatchNormBackwardInput(dy, x, mean, invstd, param(p), sums, global * spatial,
                                         batch, channels, spatial, dx);
      }
      return;
    }
    case LayerKind::kGroupNorm:
      backend_->GroupNormBackward(GroupNormOf(spec, layer.in_shape, batch), x, dy, param(p),
                                  layer.mean.as<float>(), layer.invstd.as<float>(), grad(p),
                                  grad(p + 1), dx);
      return;
    case LayerKind::kScattering2d:  // applied by LoadData, never a workspace layer
      return;
    case LayerKind::kRelu:
    case LayerKind::kTanh:
    case LayerKind::kDropout:
    case LayerKind::kFlatten: {
      if (dx == nullptr) return;
      float* g = dx;
      if (!layer.in_place) backend_->CopyOnDevice(dx, dy, n * kFloat);
      if (spec.kind == LayerKind::kRelu) backend_->ReluBackward(layer.out, g, n);
      if (spec.kind == LayerKind::kTanh) backend_->TanhBackward(layer.out, g, n);
      if (spec.kind == LayerKind::kDropout && spec.rate > 0) {
        backend_->DropoutBackward(g, n, static_cast<float>(spec.rate), layer.dropout_seed,
                                  DropoutOffset(layer));
      }
      return;
    }
  }
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

void NetWorkspace::AddSquaredNorms(size_t l, int64_t batch, double* squared) {
  const Layer& layer = layers_[l];
  switch (layer.spec.kind) {
    case LayerKind::kDense:
      backend_->AddGhostSquaredNorms(in(l), layer.in_size, layer.dout, layer.out_size, batch,
                                     squared);
      return;
    case LayerKind::kConv2d:
      backend_->AddConv2dSquaredNorms(ConvOf(layer.spec, layer.in_shape, batch), in(l), layer.dout,
                                      squared, scratch_.as<float>());
      return;
    case LayerKind::kGroupNorm:
      backend_->AddGroupNormSquaredNorms(GroupNormOf(layer.spec, layer.in_shape, batch), in(l),
                                         layer.dout, layer.mean.as<float>(),
                                         layer.invstd.as<float>(), squared);
      return;
    default:
      return;
  }
}

void NetWorkspace::BackwardForNorms(int64_t batch, double* squared) {
  // The first trained layer's parameter gradients are formed in the second pass only.
  for (size_t l = layers_.size(); l-- > first_trained_;) {
    BackwardLayer(l, batch, /*params=*/l != first_trained_);
  }
  backend_->Zero(squared, batch * static_cast<int64_t>(sizeof(double)));
  for (size_t l = first_trained_; l < layers_.size(); ++l) AddSquaredNorms(l, batch, squared);
}

void NetWorkspace::ClippedGradientSum(int64_t batch, const float* factors) {
  for (size_t l = first_trained_; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    if (!HasParameters(layer.spec.kind)) continue;
    backend_->ScaleRows(layer.dout, batch, layer.out_size, factors);
    const size_t p = first_param_[l];
    const float* x = in(l);
    switch (layer.spec.kind) {
      case LayerKind::kDense:
        backend_->DenseBackward(DenseOf(batch, layer.in_size, layer.out_size), x, param(p),
                                layer.dout, grad(p), grad(p + 1), nullptr);
        break;
      case LayerKind::kConv2d:
        backend_->Conv2dBackward(ConvOf(layer.spec, layer.in_shape, batch), x, param(p), layer.dout,
                                 grad(p), grad(p + 1), nullptr, scratch_.as<float>());
        break;
      case LayerKind::kGroupNorm:
        backend_->GroupNormBackward(GroupNormOf(layer.spec, layer.in_shape, batch), x, layer.dout,
                                    param(p), layer.mean.as<float>(), layer.invstd.as<float>(),
                                    grad(p), grad(p + 1), nullptr);
        break;
      default:
        break;  // batch norm: refused under DP-SGD (CheckDpSgdModel)
    }
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
