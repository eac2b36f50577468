// The element-wise activations, in place where their input is free; their backward passes read
// their outputs. Kernels: kernels/activation.h.
//   relu {}: y = max(x, 0)
//   tanh {}: y = tanh(x)
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

using ForwardKernel = void (kernels::Backend::*)(float* y, int64_t n);
using BackwardKernel = void (kernels::Backend::*)(const float* y, float* dy, int64_t n);

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* /*params*/) { return q.in; }

template <ForwardKernel kKernel>
void Forward(const LayerPass& pass, LayerState* layer) {
  CopyUnlessInPlace(pass, *layer);
  (pass.backend.*kKernel)(layer->out, pass.batch * layer->out_size);
}

template <BackwardKernel kKernel>
void Backward(const LayerPass& pass, const LayerState& layer, bool /*params*/) {
  if (!StartElementwiseBackward(pass, layer)) return;
  (pass.backend.*kKernel)(layer.out, pass.dx, pass.batch * layer.out_size);
}

template <ForwardKernel kForward, BackwardKernel kBackward>
constexpr LayerType Activation(LayerKind kind, const char* name, InitGain init_gain) {
  return {
      .kind = kind,
      .name = name,
      .init_gain = init_gain,
      .in_place = InPlace::kIfInputFree,
      .backward_reads_output = true,
      .output_shape = OutputShape,
      .forward = Forward<kForward>,
      .backward = Backward<kBackward>,
  };
}

}  // namespace

const LayerType kRelu = Activation<&kernels::Backend::ReluForward, &kernels::Backend::ReluBackward>(
    LayerKind::kRelu, "relu", InitGain::kRelu);
const LayerType kTanh = Activation<&kernels::Backend::TanhForward, &kernels::Backend::TanhBackward>(
    LayerKind::kTanh, "tanh", InitGain::kLinear);

}  // namespace huddle::models::layers
