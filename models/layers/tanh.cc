// tanh {}: y = tanh(x), element-wise, in place where its input is free. Its backward pass reads
// its output. Kernels: kernels/activation.h.
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* /*params*/) { return q.in; }

void Forward(const LayerPass& pass, LayerState* layer) {
  CopyUnlessInPlace(pass, *layer);
  pass.backend.TanhForward(layer->out, pass.batch * layer->out_size);
}

void Backward(const LayerPass& pass, const LayerState& layer, bool /*params*/) {
  if (!StartElementwiseBackward(pass, layer)) return;
  pass.backend.TanhBackward(layer.out, pass.dx, pass.batch * layer.out_size);
}

}  // namespace

const LayerType kTanh = {
    .kind = LayerKind::kTanh,
    .name = "tanh",
    .init_gain = InitGain::kLinear,
    .in_place = InPlace::kIfInputFree,
    .backward_reads_output = true,
    .output_shape = OutputShape,
    .forward = Forward,
    .backward = Backward,
};

}  // namespace huddle::models::layers
