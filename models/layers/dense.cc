// dense {out}: fully connected, y = x W^T + b, weight [out, in], bias [out]; flat input.
// Kernels: kernels/dense.h, and kernels/dp.h for the per-example norm.
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

constexpr int64_t kMaxOut = int64_t{1} << 24;

kernels::DenseShape DenseOf(const LayerPass& pass, const LayerState& layer) {
  return {pass.batch, layer.in_size, layer.out_size};
}

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* params) {
  if (q.in.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(q.where, " needs a flat input; it gets ",
                                                   ShapeString(q.in),
                                                   ": add a flatten layer before it"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "out", q.spec.out, 1, kMaxOut));
  *params = (q.in[0] + 1) * q.spec.out;
  return Shape{q.spec.out};
}

LayerTensors Tensors(const LayerSpec& spec, const Shape& in) {
  return {.trainable = {{"weight", {spec.out, in[0]}}, {"bias", {spec.out}}}};
}

void Forward(const LayerPass& pass, LayerState* layer) {
  pass.backend.DenseForward(DenseOf(pass, *layer), pass.x, pass.weight, pass.bias, layer->out);
}

void Backward(const LayerPass& pass, const LayerState& layer, bool params) {
  if (!params && pass.dx == nullptr) return;
  pass.backend.DenseBackward(DenseOf(pass, layer), pass.x, pass.weight, layer.dout, pass.dweight,
                             pass.dbias, pass.dx);
}

// Ghost norms (kernels/dp.h): the per-example gradient is never formed.
void AddSquaredNorms(const LayerPass& pass, const LayerState& layer, double* squared) {
  pass.backend.AddGhostSquaredNorms(pass.x, layer.in_size, layer.dout, layer.out_size, pass.batch,
                                    squared);
}

constexpr LayerOption kOptions[] = {
    {.key = "out", .integer = &LayerSpec::out, .required = true, .min = 1, .max = kMaxOut},
};

}  // namespace

const LayerType kDense = {
    .kind = LayerKind::kDense,
    .name = "dense",
    .param_prefix = "fc",
    .num_trainable = 2,
    .init_gain = InitGain::kLinear,
    .options = kOptions,
    .output_shape = OutputShape,
    .tensors = Tensors,
    .init = InitFanInUniform,
    .forward = Forward,
    .backward = Backward,
    .add_squared_norms = AddSquaredNorms,
};

}  // namespace huddle::models::layers
