// CPU reference of kernels/pool.h: plain loops, plane by plane, each window clipped to the input
// (padding cells are skipped: they never win a max and add zero to an average).
#include <algorithm>
#include <cmath>

#include "kernels/pool.h"

namespace huddle::kernels {
namespace {

// The input rows (or columns) [*lo, *hi) under output o's window.
void WindowRange(int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t size, int64_t* lo,
                 int64_t* hi) {
  const int64_t start = o * stride - pad;
  *lo = std::max<int64_t>(start, 0);
  *hi = std::min(start + kernel, size);
}

// The first maximum of the window, a NaN counting as larger than any number.
int64_t FirstMaxWithNan(const float* in, int64_t width, int64_t h_lo, int64_t h_hi, int64_t w_lo,
                        int64_t w_hi, float* best) {
  int64_t best_index = h_lo * width + w_lo;
  *best = in[best_index];
  for (int64_t h = h_lo; h < h_hi; ++h) {
    for (int64_t w = w_lo; w < w_hi; ++w) {
      const float v = in[h * width + w];
      if (std::isnan(*best)) return best_index;
      if (v > *best || std::isnan(v)) {
        *best = v;
        best_index = h * width + w;
      }
    }
  }
  return best_index;
}

}  // namespace

void MaxPool2dForward(const Pool2dShape& s, const float* x, float* y, int32_t* argmax) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width(), planes = s.batch * s.channels;
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* in = x + plane * s.height * s.width;
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      int64_t h_lo, h_hi;
      WindowRange(oh, s.stride_h, s.pad_h, s.kernel_h, s.height, &h_lo, &h_hi);
      for (int64_t ow = 0; ow < ow_n; ++ow, ++y, ++argmax) {
        int64_t w_lo, w_hi;
        WindowRange(ow, s.stride_w, s.pad_w, s.kernel_w, s.width, &w_lo, &w_hi);
        // The common case without branches on the data (on real data each comparison is a coin
        // flip); a window holding a NaN (its sum is NaN) is rescanned with the NaN rule.
        int64_t best_index = h_lo * s.width + w_lo;
        float best = in[best_index], sum = 0.0f;
        for (int64_t h = h_lo; h < h_hi; ++h) {
          for (int64_t w = w_lo; w < w_hi; ++w) {
            const float v = in[h * s.width + w];
            sum += v;
            best_index = v > best ? h * s.width + w : best_index;
            best = v > best ? v : best;
          }
        }
        if (std::isnan(sum)) {
          best_index = FirstMaxWithNan(in, s.width, h_lo, h_hi, w_lo, w_hi, &best);
        }
        *y = best;
        *argmax = static_cast<int32_t>(best_index);
      }
    }
  }
}

void MaxPool2dBackward(const Pool2dShape& s, const float* dy, const int32_t* argmax, float* dx) {
  const int64_t outputs = s.out_height() * s.out_width(), plane = s.height * s.width;
  std::fill(dx, dx + s.batch * s.channels * plane, 0.0f);
  for (int64_t p = 0; p < s.batch * s.channels; ++p, dx += plane) {
    for (int64_t o = 0; o < outputs; ++o, ++dy, ++argmax) dx[*argmax] += *dy;
  }
}

void AvgPool2dForward(const Pool2dShape& s, const float* x, float* y) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width(), planes = s.batch * s.channels;
  const auto count = static_cast<float>(s.kernel_h * s.kernel_w);
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* in = x + plane * s.height * s.width;
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      int64_t h_lo, h_hi;
      WindowRange(oh, s.stride_h, s.pad_h, s.kernel_h, s.height, &h_lo, &h_hi);
      for (int64_t ow = 0; ow < ow_n; ++ow, ++y) {
        int64_t w_lo, w_hi;
        WindowRange(ow, s.stride_w, s.pad_w, s.kernel_w, s.width, &w_lo, &w_hi);
        float sum = 0.0f;
        for (int64_t h = h_lo; h < h_hi; ++h) {
          for (int64_t w = w_lo; w < w_hi; ++w) sum += in[h * s.width + w];
        }
        *y = sum / count;
      }
    }
  }
}

void AvgPool2dBackward(const Pool2dShape& s, const float* dy, float* dx) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width(), plane = s.height * s.width;
  const auto count = static_cast<float>(s.kernel_h * s.kernel_w);
  std::fill(dx, dx + s.batch * s.channels * plane, 0.0f);
  for (int64_t p = 0; p < s.batch * s.channels; ++p, dx += plane) {
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      int64_t h_lo, h_hi;
      WindowRange(oh, s.stride_h, s.pad_h, s.kernel_h, s.height, &h_lo, &h_hi);
      for (int64_t ow = 0; ow < ow_n; ++ow, ++dy) {
        int64_t w_lo, w_hi;
        WindowRange(ow, s.stride_w, s.pad_w, s.kernel_w, s.width, &w_lo, &w_hi);
        const float share = *dy / count;
        for (int64_t h = h_lo; h < h_hi; ++h) {
          for (int64_t w = w_lo; w < w_hi; ++w) dx[h * s.width + w] += share;
        }
      }
    }
  }
}

}  // namespace huddle::kernels
