// conv2d {out, kernel, stride, padding}: 2-D convolution of an image [c, h, w], weight
// [out, c, k, k], bias [out]. Kernels: kernels/conv.h (forward, backward, per-example norms).
#include <algorithm>

#include "kernels/conv.h"
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

constexpr int64_t kMaxOut = int64_t{1} << 24;

kernels::Conv2dShape ConvOf(const LayerState& layer, int64_t batch) {
  const LayerSpec& l = layer.spec;
  kernels::Conv2dShape s;
  s.batch = batch;
  s.in_channels = layer.in_shape[0];
  s.height = layer.in_shape[1];
  s.width = layer.in_shape[2];
  s.out_channels = l.out;
  s.kernel_h = s.kernel_w = l.kernel;
  s.stride_h = s.stride_w = l.effective_stride();
  s.pad_h = s.pad_w = l.padding;
  return s;
}

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* params) {
  const LayerSpec& l = q.spec;
  HUDDLE_RETURN_IF_ERROR(NeedsImage(q));
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "out", l.out, 1, kMaxOut));
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "kernel", l.kernel, 1, 64));
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "stride", l.effective_stride(), 1, 64));
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "padding", l.padding, 0, l.kernel - 1));
  HUDDLE_ASSIGN_OR_RETURN(const int64_t h, WindowOut(q.where, "height", q.in[1], l));
  HUDDLE_ASSIGN_OR_RETURN(const int64_t w, WindowOut(q.where, "width", q.in[2], l));
  *params = (q.in[0] * l.kernel * l.kernel + 1) * l.out;
  return Shape{l.out, h, w};
}

LayerTensors Tensors(const LayerSpec& spec, const Shape& in) {
  return {
      .trainable = {{"weight", {spec.out, in[0], spec.kernel, spec.kernel}}, {"bias", {spec.out}}}};
}

StatusOr<int64_t> Reserve(kernels::Backend& /*backend*/, int64_t max_batch, LayerState* layer) {
  return kernels::Conv2dScratchFloats(ConvOf(*layer, max_batch));
}

void Forward(const LayerPass& pass, LayerState* layer) {
  pass.backend.Conv2dForward(ConvOf(*layer, pass.batch), pass.x, pass.weight, pass.bias, layer->out,
                             pass.scratch);
}

void Backward(const LayerPass& pass, const LayerState& layer, bool params) {
  if (!params && pass.dx == nullptr) return;
  pass.backend.Conv2dBackward(ConvOf(layer, pass.batch), pass.x, pass.weight, layer.dout,
                              pass.dweight, pass.dbias, pass.dx, pass.scratch);
}

void AddSquaredNorms(const LayerPass& pass, const LayerState& layer, double* squared) {
  pass.backend.AddConv2dSquaredNorms(ConvOf(layer, pass.batch), pass.x, layer.dout, squared,
                                     pass.scratch);
}

constexpr LayerOption kOptions[] = {
    {.key = "out", .integer = &LayerSpec::out, .required = true, .min = 1, .max = kMaxOut},
    {.key = "kernel", .integer = &LayerSpec::kernel, .required = true, .min = 1, .max = 64},
    {.key = "stride", .integer = &LayerSpec::stride, .min = 1, .max = 64},
    {.key = "padding", .integer = &LayerSpec::padding, .min = 0, .max = 63},
};

}  // namespace

const LayerType kConv2d = {
    .kind = LayerKind::kConv2d,
    .name = "conv2d",
    .param_prefix = "conv",
    .num_trainable = 2,
    .init_gain = InitGain::kLinear,
    .options = kOptions,
    .output_shape = OutputShape,
    .tensors = Tensors,
    .init = InitFanInUniform,
    .reserve = Reserve,
    .forward = Forward,
    .backward = Backward,
    .add_squared_norms = AddSquaredNorms,
};

}  // namespace huddle::models::layers
