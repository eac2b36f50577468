// batch_norm {}: normalisation over the batch (BatchNorm1d on [features], BatchNorm2d per channel
// on [c, h, w]); weight and bias [channels], and the running statistics running_mean and
// running_var (state: training updates them from each batch with momentum kBatchNormMomentum,
// evaluation normalises with them). With a BatchNormSync the statistics are the global batch's
// (SyncBatchNorm). No per-example norm: it mixes examples, so DP-SGD refuses it.
// Kernels: kernels/batch_norm.h (its steps are numbered there).
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

constexpr auto kFloat = static_cast<int64_t>(sizeof(float));

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* params) {
  *params = 4 * q.in[0];
  return q.in;
}

LayerTensors Tensors(const LayerSpec& /*spec*/, const Shape& in) {
  return {.trainable = {{"weight", {in[0]}}, {"bias", {in[0]}}},
          .state = {{"running_mean", {in[0]}}, {"running_var", {in[0]}}}};
}

// Weight 1, bias 0, running mean 0, running variance 1.
void Init(size_t index, const Shape& /*shape*/, bool /*feeds_relu*/, uint64_t /*seed*/,
          std::vector<float>* data) {
  if (index == 0 || index == 3) std::fill(data->begin(), data->end(), 1.0f);
}

Status Allocate(kernels::Backend& backend, bool training, LayerState* layer) {
  const int64_t channels = layer->in_shape[0];
  HUDDLE_ASSIGN_OR_RETURN(layer->invstd, backend.Allocate(channels * kFloat));
  if (!training) return absl::OkStatus();
  HUDDLE_ASSIGN_OR_RETURN(layer->mean, backend.Allocate(channels * kFloat));
  HUDDLE_ASSIGN_OR_RETURN(layer->sums,
                          backend.Allocate(2 * channels * static_cast<int64_t>(sizeof(double))));
  return absl::OkStatus();
}

void Forward(const LayerPass& pass, LayerState* layer) {
  const int64_t channels = layer->in_shape[0], spatial = Spatial(layer->in_shape);
  float* invstd = layer->invstd.as<float>();
  if (pass.training) {
    auto* sums = layer->sums.as<double>();
    pass.backend.BatchNormSums(pass.x, pass.batch, channels, spatial, sums);
    if (pass.sync != nullptr) pass.sync->AllReduceSum(sums, 2 * channels);
    float* mean = layer->mean.as<float>();
    pass.backend.BatchNormMoments(sums, pass.global_rows * spatial, channels, kBatchNormEps, mean,
                                  invstd);
    pass.backend.BatchNormUpdateRunning(sums, pass.global_rows * spatial, channels,
                                        kBatchNormMomentum, pass.running_mean, pass.running_var);
    pass.backend.BatchNormForward(pass.x, pass.batch, channels, spatial, mean, invstd, pass.weight,
                                  pass.bias, layer->out);
  } else {
    pass.backend.BatchNormInvStd(pass.running_var, channels, kBatchNormEps, invstd);
    pass.backend.BatchNormForward(pass.x, pass.batch, channels, spatial, pass.running_mean, invstd,
                                  pass.weight, pass.bias, layer->out);
  }
}

// Through the batch norm, to the gradient of its input (kernels/batch_norm.h steps 6-8). The
// parameter gradients are always formed.
void Backward(const LayerPass& pass, const LayerState& layer, bool /*params*/) {
  const int64_t channels = layer.in_shape[0], spatial = Spatial(layer.in_shape);
  const float* mean = layer.mean.as<float>();
  const float* invstd = layer.invstd.as<float>();
  auto* sums = layer.sums.as<double>();
  pass.backend.BatchNormBackwardSums(layer.dout, pass.x, mean, invstd, pass.batch, channels,
                                     spatial, sums);
  pass.backend.BatchNormParamGrads(sums, channels, pass.dweight, pass.dbias);
  if (pass.sync != nullptr) pass.sync->AllReduceSum(sums, 2 * channels);
  if (pass.dx != nullptr) {
    pass.backend.BatchNormBackwardInput(layer.dout, pass.x, mean, invstd, pass.weight, sums,
                                        pass.global_rows * spatial, pass.batch, channels, spatial,
                                        pass.dx);
  }
}

}  // namespace

const LayerType kBatchNorm = {
    .kind = LayerKind::kBatchNorm,
    .name = "batch_norm",
    .param_prefix = "bn",
    .num_trainable = 2,
    .init_gain = InitGain::kLookPast,
    .runs_on_empty_batch = true,
    .output_shape = OutputShape,
    .tensors = Tensors,
    .init = Init,
    .allocate = Allocate,
    .forward = Forward,
    .backward = Backward,
};

}  // namespace huddle::models::layers
