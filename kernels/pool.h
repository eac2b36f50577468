// 2-D max and average pooling (PyTorch nn.MaxPool2d / nn.AvgPool2d, floor mode, dilation 1).
//
// Layout: NCHW, row-major float32; every channel plane [height, width] of every example pools on
// its own into a plane [out_height(), out_width()]. The kernels/dense.h contract applies: the
// caller validates shapes (every dimension >= 1, strides >= 1, 0 <= pad <= kernel / 2 as PyTorch
// demands, so every window holds at least one input element); nothing here checks or fails. The
// CPU reference lives in pool_cpu.cc, the CUDA version in kernels/cuda/pool.cu; both sum each
// input gradient over its windows in the same order (row-major output order), so the backward
// passes agree bit for bit.
#pragma once

#include <cstdint>

namespace huddle::kernels {

// Dimensions of one pooling layer applied to a minibatch. A stride equal to the kernel (PyTorch's
// default) is the caller's to fill in.
struct Pool2dShape {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t kernel_h = 0, kernel_w = 0, stride_h = 0, stride_w = 0, pad_h = 0, pad_w = 0;
  int64_t out_height() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_width() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
};

// y [batch, channels, OH, OW] = the maximum of each window; argmax [same shape] = the index
// h * width + w within the input plane of that maximum. The first maximum in row-major window
// order wins; padding never wins (PyTorch pads with -inf); a NaN counts as a maximum.
void MaxPool2dForward(const Pool2dShape& s, const float* x, float* y, int32_t* argmax);

// dx [batch, channels, H, W] (overwritten) = Σ over the windows whose argmax is that element of
// their dy.
void MaxPool2dBackward(const Pool2dShape& s, const float* dy, const int32_t* argmax, float* dx);

// y = each window's sum / (kernel_h * kernel_w): padding counts as zeros (PyTorch's
// count_include_pad=True).
void AvgPool2dForward(const Pool2dShape& s, const float* x, float* y);

// dx (overwritten) = Σ over the windows holding that element of dy / (kernel_h * kernel_w).
void AvgPool2dBackward(const Pool2dShape& s, const float* dy, float* dx);

}  // namespace huddle::kernels
