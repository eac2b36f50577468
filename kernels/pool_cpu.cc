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

// MaxPool2dForward for the common 2x2 window at stride 2 without padding: the general loop's
// comparisons in its order (each window's four values row by row, a later value winning only when
// strictly larger), as selects over a row of outputs that the compiler vectorises (pool_cpu.cc is
// built with GCC's dynamic cost model, kernels/CMakeLists.txt), then the general NaN rule for the
// windows of a row holding a NaN. The same results, bit for bit: maxima and indices are chosen,
// never computed.
void MaxPool2x2(const Pool2dShape& s, const float* x, float* y, int32_t* argmax) {
  const int64_t oh_n = s.out_height(), ow_n = s.out_width(), planes = s.batch * s.channels;
  const int64_t width = s.width;
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* in = x + plane * s.height * width;
    for (int64_t oh = 0; oh < oh_n; ++oh, y += ow_n, argmax += ow_n) {
      const float* r0 = in + 2 * oh * width;
      const float* r1 = r0 + width;
      const auto base = static_cast<int32_t>(2 * oh * width);
      const auto w = static_cast<int32_t>(width);
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
        const int32_t at = base + static_cast<int32_t>(2 * ow);
        float best = a;
        int32_t index = at;
        index = b > best ? at + 1 : index;
        best = b > best ? b : best;
        index = c > best ? at + w : index;
        best = c > best ? c : best;
        index = d > best ? at + w + 1 : index;
        best = d > best ? d : best;
        y[ow] = best;
        argmax[ow] = index;
      }
      int nan = 0;  // (x != x: a NaN)
      for (int64_t j = 0; j < 2 * ow_n; ++j) nan |= (r0[j] != r0[j]) | (r1[j] != r1[j]);
      if (nan == 0) continue;
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
        if (!std::isnan(a) && !std::isnan(b) && !std::isnan(c) && !std::isnan(d)) continue;
        argmax[ow] = static_cast<int32_t>(
            FirstMaxWithNan(in, width, 2 * oh, 2 * oh + 2, 2 * ow, 2 * ow + 2, &y[ow]));
      }
    }
  }
}

}  // namespace

void MaxPool2dForward(const Pool2dShape& s, const float* x, float* y, int32_t* argmax) {
  if (s.kernel_h == 2 && s.kernel_w == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 &&
      s.pad_w == 0) {
    return MaxPool2x2(s, x, y, argmax);
  }
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
