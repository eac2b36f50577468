// flatten {}: [c, h, w] -> [c * h * w]; a view of its input (row-major NCHW is already flat),
// except as the first layer, where it copies the gathered input.
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* /*params*/) {
  return Shape{Product(q.in)};
}

void Forward(const LayerPass& pass, LayerState* layer) { CopyUnlessInPlace(pass, *layer); }

void Backward(const LayerPass& pass, const LayerState& layer, bool /*params*/) {
  StartElementwiseBackward(pass, layer);
}

}  // namespace

const LayerType kFlatten = {
    .kind = LayerKind::kFlatten,
    .name = "flatten",
    .init_gain = InitGain::kLookPast,
    .in_place = InPlace::kAlways,
    .output_shape = OutputShape,
    .forward = Forward,
    .backward = Backward,
};

}  // namespace huddle::models::layers
