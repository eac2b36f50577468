// Internal to models/layers/: the shape rule and kernel shape that max_pool2d and avg_pool2d
// share (PyTorch's pooling rules).
#pragma once

#include "kernels/pool.h"
#include "models/layers/layer_type.h"

namespace huddle::models::layers {

// [c, h, w] -> [c, h', w'] by the window; padding at most half the window (PyTorch's rule).
StatusOr<Shape> PoolOutputShape(const ShapeQuery& q, int64_t* params);
// {kernel (required), stride, padding}: the config ranges of both kinds.
inline constexpr LayerOption kPoolOptions[] = {
    {.key = "kernel", .integer = &LayerSpec::kernel, .required = true, .min = 1, .max = 64},
    {.key = "stride", .integer = &LayerSpec::stride, .min = 1, .max = 64},
    {.key = "padding", .integer = &LayerSpec::padding, .min = 0, .max = 32},
};
kernels::Pool2dShape PoolOf(const LayerState& layer, int64_t batch);

}  // namespace huddle::models::layers
