// avg_pool2d {kernel, stride, padding}: the mean of each window, counting the padding (PyTorch's
// count_include_pad). Kernels: kernels/pool.h.
#include "models/layers/kinds.h"
#include "models/layers/pool2d.h"

namespace huddle::models::layers {
namespace {

void Forward(const LayerPass& pass, LayerState* layer) {
  pass.backend.AvgPool2dForward(PoolOf(*layer, pass.batch), pass.x, layer->out);
}

void Backward(const LayerPass& pass, const LayerState& layer, bool /*params*/) {
  if (pass.dx == nullptr) return;
  pass.backend.AvgPool2dBackward(PoolOf(layer, pass.batch), layer.dout, pass.dx);
}

}  // namespace

const LayerType kAvgPool2d = {
    .kind = LayerKind::kAvgPool2d,
    .name = "avg_pool2d",
    .init_gain = InitGain::kLookPast,
    .options = kPoolOptions,
    .output_shape = PoolOutputShape,
    .forward = Forward,
    .backward = Backward,
};

}  // namespace huddle::models::layers
