// The pooling kinds' shared shape rule and kernel shape (see pool2d.h).
#include "models/layers/pool2d.h"

namespace huddle::models::layers {

StatusOr<Shape> PoolOutputShape(const ShapeQuery& q, int64_t* params) {
  const LayerSpec& l = q.spec;
  *params = 0;
  HUDDLE_RETURN_IF_ERROR(NeedsImage(q));
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "kernel", l.kernel, 1, 64));
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "stride", l.effective_stride(), 1, 64));
  // PyTorch's rule: padding at most half the window.
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "padding", l.padding, 0, l.kernel / 2));
  HUDDLE_ASSIGN_OR_RETURN(const int64_t h, WindowOut(q.where, "height", q.in[1], l));
  HUDDLE_ASSIGN_OR_RETURN(const int64_t w, WindowOut(q.where, "width", q.in[2], l));
  return Shape{q.in[0], h, w};
}

kernels::Pool2dShape PoolOf(const LayerState& layer, int64_t batch) {
  const LayerSpec& l = layer.spec;
  kernels::Pool2dShape s;
  s.batch = batch;
  s.channels = layer.in_shape[0];
  s.height = layer.in_shape[1];
  s.width = layer.in_shape[2];
  s.kernel_h = s.kernel_w = l.kernel;
  s.stride_h = s.stride_w = l.effective_stride();
  s.pad_h = s.pad_w = l.padding;
  return s;
}

}  // namespace huddle::models::layers
