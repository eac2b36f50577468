// relu {}: y = max(x, 0), element-wise, in place where its input is free. Its backward pass reads
// its output. Kernels: kernels/activation.h.
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* /*params*/) { return q.in; }

void Forward(const LayerPass& pass, LayerState* layer) {
  CopyUnlessInPlace(pass, *layer);
  pass.backend.ReluForward(layer->out, pass.batch * layer->out_size);
}

void Backward(const LayerPass& pass, const LayerState& layer, bool /*params*/) {
  if (!StartElementwiseBackward(pass, layer)) return;
  pass.backend.ReluBackward(layer.out, pass.dx, pass.batch * layer.out_size);
}

}  // namespace

const LayerType kRelu = {
    .kind = LayerKind::kRelu,
    .name = "relu",
    .init_gain = InitGain::kRelu,
    .in_place = InPlace::kIfInputFree,
    .backward_reads_output = true,
    .output_shape = OutputShape,
    .forward = Forward,
    .backward = Backward,
};

}  // namespace huddle::models::layers
