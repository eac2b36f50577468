// CUDA version of kernels/pool.h: one thread per output element for the forward passes, one per
// input element for the backward passes, which gather (no atomics) the windows covering their
// element in row-major output order, the order in which the CPU reference scatters: results
// match it bit for bit.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace huddle::kernels::cuda {
namespace {

// The input rows (or columns) [*lo, *hi) under output o's window.
__device__ void WindowRange(int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t size,
                            int64_t* lo, int64_t* hi) {
  const int64_t start = o * stride - pad;
  *lo = start > 0 ? start : 0;
  *hi = start + kernel < size ? start + kernel : size;
}

// The outputs [*lo, *hi) whose windows cover input i.
__device__ void CoveringOutputs(int64_t i, int64_t stride, int64_t pad, int64_t kernel,
                                int64_t outputs, int64_t* lo, int64_t* hi) {
  const int64_t first = i + pad - kernel + 1;  // o * stride >= first
  *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const int64_t last = (i + pad) / stride + 1;  // o * stride <= i + pad
  *hi = last < outputs ? last : outputs;
}

__global__ void MaxPoolForwardKernel(Pool2dShape s, int64_t oh_n, int64_t ow_n,
                                     const float* __restrict__ x, float* __restrict__ y,
                                     int32_t* __restrict__ argmax) {
  const int64_t total = s.batch * s.channels * oh_n * ow_n;
  for (int64_t t = GlobalThread(); t < total; t += GridThreads()) {
    const int64_t plane = t / (oh_n * ow_n), oh = (t / ow_n) % oh_n, ow = t % ow_n;
    const float* in = x + plane * s.height * s.width;
    int64_t h_lo, h_hi, w_lo, w_hi;
    WindowRange(oh, s.stride_h, s.pad_h, s.kernel_h, s.height, &h_lo, &h_hi);
    WindowRange(ow, s.stride_w, s.pad_w, s.kernel_w, s.width, &w_lo, &w_hi);
    int64_t best_index = h_lo * s.width + w_lo;
    float best = in[best_index];
    for (int64_t h = h_lo; h < h_hi; ++h) {
      for (int64_t w = w_lo; w < w_hi; ++w) {
        const float v = in[h * s.width + w];
        if (v > best || (isnan(v) && !isnan(best))) {
          best = v;
          best_index = h * s.width + w;
        }
      }
    }
    y[t] = best;
    argmax[t] = static_cast<int32_t>(best_index);
  }
}

__global__ void MaxPoolBackwardKernel(Pool2dShape s, int64_t oh_n, int64_t ow_n,
                                      const float* __restrict__ dy,
                                      const int32_t* __restrict__ argmax, float* __restrict__ dx) {
  const int64_t plane_size = s.height * s.width;
  const int64_t total = s.batch * s.channels * plane_size;
  for (int64_t t = GlobalThread(); t < total; t += GridThreads()) {
    const int64_t plane = t / plane_size, index = t % plane_size;
    const int64_t h = index / s.width, w = index % s.width;
    int64_t oh_lo, oh_hi, ow_lo, ow_hi;
    CoveringOutputs(h, s.stride_h, s.pad_h, s.kernel_h, oh_n, &oh_lo, &oh_hi);
    CoveringOutputs(w, s.stride_w, s.pad_w, s.kernel_w, ow_n, &ow_lo, &ow_hi);
    const int64_t base = plane * oh_n * ow_n;
    float sum = 0.0f;
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
      for (int64_t ow = ow_lo; ow < ow_hi; ++ow) {
        const int64_t o = base + oh * ow_n + ow;
        if (argmax[o] == index) sum += dy[o];
      }
    }
    dx[t] = sum;
  }
}

__global__ void AvgPoolForwardKernel(Pool2dShape s, int64_t oh_n, int64_t ow_n,
                                     const float* __restrict__ x, float* __restrict__ y) {
  const int64_t total = s.batch * s.channels * oh_n * ow_n;
  const auto count = static_cast<float>(s.kernel_h * s.kernel_w);
  for (int64_t t = GlobalThread(); t < total; t += GridThreads()) {
    const int64_t plane = t / (oh_n * ow_n), oh = (t / ow_n) % oh_n, ow = t % ow_n;
    const float* in = x + plane * s.height * s.width;
    int64_t h_lo, h_hi, w_lo, w_hi;
    WindowRange(oh, s.stride_h, s.pad_h, s.kernel_h, s.height, &h_lo, &h_hi);
    WindowRange(ow, s.stride_w, s.pad_w, s.kernel_w, s.width, &w_lo, &w_hi);
    float sum = 0.0f;
    for (int64_t h = h_lo; h < h_hi; ++h) {
      for (int64_t w = w_lo; w < w_hi; ++w) sum += in[h * s.width + w];
    }
    y[t] = sum / count;
  }
}

__global__ void AvgPoolBackwardKernel(Pool2dShape s, int64_t oh_n, int64_t ow_n,
                                      const float* __restrict__ dy, float* __restrict__ dx) {
  const int64_t plane_size = s.height * s.width;
  const int64_t total = s.batch * s.channels * plane_size;
  const auto count = static_cast<float>(s.kernel_h * s.kernel_w);
  for (int64_t t = GlobalThread(); t < total; t += GridThreads()) {
    const int64_t plane = t / plane_size, h = (t % plane_size) / s.width, w = t % s.width;
    int64_t oh_lo, oh_hi, ow_lo, ow_hi;
    CoveringOutputs(h, s.stride_h, s.pad_h, s.kernel_h, oh_n, &oh_lo, &oh_hi);
    CoveringOutputs(w, s.stride_w, s.pad_w, s.kernel_w, ow_n, &ow_lo, &ow_hi);
    const float* dy_plane = dy + plane * oh_n * ow_n;
    float sum = 0.0f;
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
      for (int64_t ow = ow_lo; ow < ow_hi; ++ow) sum += dy_plane[oh * ow_n + ow] / count;
    }
    dx[t] = sum;
  }
}

}  // namespace

void LaunchMaxPool2dForward(cudaStream_t stream, const Pool2dShape& s, const float* x, float* y,
                            int32_t* argmax) {
  const int64_t n = s.batch * s.channels * s.out_height() * s.out_width();
  MaxPoolForwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(s, s.out_height(), s.out_width(), x,
                                                              y, argmax);
}

void LaunchMaxPool2dBackward(cudaStream_t stream, const Pool2dShape& s, const float* dy,
                             const int32_t* argmax, float* dx) {
  const int64_t n = s.batch * s.channels * s.height * s.width;
  MaxPoolBackwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(s, s.out_height(), s.out_width(), dy,
                                                               argmax, dx);
}

void LaunchAvgPool2dForward(cudaStream_t stream, const Pool2dShape& s, const float* x, float* y) {
  const int64_t n = s.batch * s.channels * s.out_height() * s.out_width();
  AvgPoolForwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(s, s.out_height(), s.out_width(), x,
                                                              y);
}

void LaunchAvgPool2dBackward(cudaStream_t stream, const Pool2dShape& s, const float* dy,
                             float* dx) {
  const int64_t n = s.batch * s.channels * s.height * s.width;
  AvgPoolBackwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(s, s.out_height(), s.out_width(), dy,
                                                               dx);
}

}  // namespace huddle::kernels::cuda
