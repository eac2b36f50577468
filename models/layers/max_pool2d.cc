// max_pool2d {kernel, stride, padding}: the maximum of each window (stride defaults to kernel);
// the forward pass keeps each output's argmax for the backward one. Kernels: kernels/pool.h.
#include "models/layers/kinds.h"
#include "models/layers/pool2d.h"

namespace huddle::models::layers {
namespace {

StatusOr<int64_t> Reserve(kernels::Backend& backend, int64_t max_batch, LayerState* layer) {
  HUDDLE_ASSIGN_OR_RETURN(layer->argmax, backend.Allocate(max_batch * layer->out_size *
                                                          static_cast<int64_t>(sizeof(int32_t))));
  return 0;
}

void Forward(const LayerPass& pass, LayerState* layer) {
  pass.backend.MaxPool2dForward(PoolOf(*layer, pass.batch), pass.x, layer->out,
                                layer->argmax.as<int32_t>());
}

void Backward(const LayerPass& pass, const LayerState& layer, bool /*params*/) {
  if (pass.dx == nullptr) return;
  pass.backend.MaxPool2dBackward(PoolOf(layer, pass.batch), layer.dout, layer.argmax.as<int32_t>(),
                                 pass.dx);
}

}  // namespace

const LayerType kMaxPool2d = {
    .kind = LayerKind::kMaxPool2d,
    .name = "max_pool2d",
    .init_gain = InitGain::kLookPast,
    .options = kPoolOptions,
    .output_shape = PoolOutputShape,
    .reserve = Reserve,
    .forward = Forward,
    .backward = Backward,
};

}  // namespace huddle::models::layers
