// group_norm {groups}: normalisation per example over groups of channels (the DP-friendly
// normaliser), on [features] or [c, h, w]; weight and bias [channels]. Kernels:
// kernels/group_norm.h (forward, backward, per-example norms).
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

constexpr auto kFloat = static_cast<int64_t>(sizeof(float));
constexpr int64_t kMaxGroups = int64_t{1} << 24;

kernels::GroupNormShape GroupNormOf(const LayerState& layer, int64_t batch) {
  return {batch, layer.in_shape[0], Spatial(layer.in_shape), layer.spec.groups};
}

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* params) {
  if (q.in.size() != 1 && q.in.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(q.where, " needs a [features] or [channels, height, width] input"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "groups", q.spec.groups, 1, q.in[0]));
  if (q.in[0] % q.spec.groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat(q.where, ": groups ", q.spec.groups,
                                                   " does not divide its ", q.in[0], " channels"));
  }
  *params = 2 * q.in[0];
  return q.in;
}

LayerTensors Tensors(const LayerSpec& /*spec*/, const Shape& in) {
  return {.trainable = {{"weight", {in[0]}}, {"bias", {in[0]}}}};
}

// Per-example statistics: [capacity, groups] means and inverse deviations.
StatusOr<int64_t> Reserve(kernels::Backend& backend, int64_t max_batch, LayerState* layer) {
  HUDDLE_ASSIGN_OR_RETURN(layer->mean, backend.Allocate(max_batch * layer->spec.groups * kFloat));
  HUDDLE_ASSIGN_OR_RETURN(layer->invstd, backend.Allocate(max_batch * layer->spec.groups * kFloat));
  return 0;
}

void Forward(const LayerPass& pass, LayerState* layer) {
  pass.backend.GroupNormForward(GroupNormOf(*layer, pass.batch), pass.x, pass.weight, pass.bias,
                                kGroupNormEps, layer->out, layer->mean.as<float>(),
                                layer->invstd.as<float>());
}

// The parameter gradients are always formed.
void Backward(const LayerPass& pass, const LayerState& layer, bool /*params*/) {
  pass.backend.GroupNormBackward(GroupNormOf(layer, pass.batch), pass.x, layer.dout, pass.weight,
                                 layer.mean.as<float>(), layer.invstd.as<float>(), pass.dweight,
                                 pass.dbias, pass.dx);
}

void AddSquaredNorms(const LayerPass& pass, const LayerState& layer, double* squared) {
  pass.backend.AddGroupNormSquaredNorms(GroupNormOf(layer, pass.batch), pass.x, layer.dout,
                                        layer.mean.as<float>(), layer.invstd.as<float>(), squared);
}

constexpr LayerOption kOptions[] = {
    {.key = "groups", .integer = &LayerSpec::groups, .required = true, .min = 1, .max = kMaxGroups},
};

}  // namespace

const LayerType kGroupNorm = {
    .kind = LayerKind::kGroupNorm,
    .name = "group_norm",
    .param_prefix = "gn",
    .num_trainable = 2,
    .init_gain = InitGain::kLookPast,
    .options = kOptions,
    .output_shape = OutputShape,
    .tensors = Tensors,
    .init = InitOnes,
    .reserve = Reserve,
    .forward = Forward,
    .backward = Backward,
    .add_squared_norms = AddSquaredNorms,
};

}  // namespace huddle::models::layers
