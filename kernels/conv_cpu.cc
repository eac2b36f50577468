// CPU reference of kernels/conv.h: one example at a time, the input unfolded
// (im2col) into the scratch buffer and one Eigen GEMM per product
// (single-threaded, no allocation). A 1x1 kernel at stride 1 without padding
// needs no unfolding: x_i [C, H*W] is already unfold(x_i).
//
// Compiled once per CPU instruction set (kernels/cpu_isa_variant.h); the entry
// points at the end run the active set's variant.
#include "kernels/conv.h"
#include "kernels/cpu_isa_variant.h"

#if HUDDLE_CPU_ISA_DISPATCH

namespace huddle::kernels {

HUDDLE_CPU_ISA_DECLARE(Conv2dForward);
HUDDLE_CPU_ISA_DECLARE(Conv2dBackward);
HUDDLE_CPU_ISA_DECLARE(AddConv2dSquaredNorms);

void Conv2dForward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                   float* y, float* scratch) {
  HUDDLE_CPU_ISA_CALL(Conv2dForward, s, x, w, bias, y, scratch);
}

void Conv2dBackward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                    float* dw, float* dbias, float* dx, float* scratch) {
  HUDDLE_CPU_ISA_CALL(Conv2dBackward, s, x, w, dy, dw, dbias, dx, scratch);
}

void AddConv2dSquaredNorms(const Conv2dShape& s, const float* x, const float* dy,
                           double* squared_norms, float* scratch) {
  HUDDLE_CPU_ISA_CALL(AddConv2dSquaredNorms, s, x, dy, squared_norms, scratch);
}

}  // namespace huddle::kernels

#else  // the variant of one instruction set

#include <Eigen/Core>
#include <algorithm>
#include <cstring>

namespace huddle::kernels::HUDDLE_CPU_ISA_VARIANT {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
using MatrixMap = Eigen::Map<RowMajorMatrix>;
using ConstColumnMap = Eigen::Map<const Eigen::VectorXf>;
using ColumnMap = Eigen::Map<Eigen::VectorXf>;

// The sizes one example's unfolding works with.
struct Geometry {
  explicit Geometry(const Conv2dShape& s)
      : out_h(s.out_height()),
        out_w(s.out_width()),
        positions(out_h * out_w),
        rows(s.in_channels * s.kernel_h * s.kernel_w),
        plane(s.height * s.width),
        pointwise(s.kernel_h == 1 && s.kernel_w == 1 && s.stride_h == 1 && s.stride_w == 1 &&
                  s.pad_h == 0 && s.pad_w == 0) {}
  int64_t out_h, out_w;
  int64_t positions;  // P = out_h * out_w: columns of unfold(x_i)
  int64_t rows;       // K = in_channels * kernel_h * kernel_w: rows of unfold(x_i)
  int64_t plane;      // H * W
  bool pointwise;     // unfold(x_i) = x_i
};

// Outputs o in [*lo, *hi) read input o * stride - pad + k inside [0, size): the
// rest read padding.
void ValidOutputs(int64_t k, int64_t pad, int64_t stride, int64_t size, int64_t outputs,
                  int64_t* lo, int64_t* hi) {
  const int64_t first = pad - k;            // o * stride >= pad - k
  const int64_t last = size - 1 + pad - k;  // o * stride <= size - 1 + pad - k
  *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  *hi = last < 0 ? 0 : std::min(outputs, last / stride + 1);
  if (*lo > *hi) *lo = *hi;
}

// col [K, P] = unfold(x_i) for x_i [C, H, W]: row (c, ki, kj), column (oh, ow)
// holds x_i[c, oh*sh - ph + ki, ow*sw - pw + kj], or 0 in the padding.
void Unfold(const Conv2dShape& s, const Geometry& g, const float* x_i, float* col) {
  for (int64_t c = 0; c < s.in_channels; ++c) {
    const float* plane = x_i + c * g.plane;
    for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
      int64_t oh_lo, oh_hi;
      ValidOutputs(ki, s.pad_h, s.stride_h, s.height, g.out_h, &oh_lo, &oh_hi);
      for (int64_t kj = 0; kj < s.kernel_w; ++kj, col += g.positions) {
        int64_t ow_lo, ow_hi;
        ValidOutputs(kj, s.pad_w, s.stride_w, s.width, g.out_w, &ow_lo, &ow_hi);
        std::fill(col, col + oh_lo * g.out_w, 0.0f);
        std::fill(col + oh_hi * g.out_w, col + g.positions, 0.0f);
        const int64_t n = ow_hi - ow_lo;
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          float* dst = col + oh * g.out_w;
          const float* src = plane + (oh * s.stride_h - s.pad_h + ki) * s.width +
                             ow_lo * s.stride_w - s.pad_w + kj;
          std::fill(dst, dst + ow_lo, 0.0f);
          if (s.stride_w == 1) {
            std::memcpy(dst + ow_lo, src, static_cast<size_t>(n) * sizeof(float));
          } else {
            for (int64_t j = 0; j < n; ++j) dst[ow_lo + j] = src[j * s.stride_w];
          }
          std::fill(dst + ow_hi, dst + g.out_w, 0.0f);
        }
      }
    }
  }
}

// dx_i [C, H, W] = fold(dcol): the adjoint of Unfold, each column entry added
// back onto the input element it was read from (padding entries dropped). dx_i
// is overwritten.
void Fold(const Conv2dShape& s, const Geometry& g, const float* dcol, float* dx_i) {
  std::fill(dx_i, dx_i + s.in_channels * g.plane, 0.0f);
  for (int64_t c = 0; c < s.in_channels; ++c) {
    float* plane = dx_i + c * g.plane;
    for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
      int64_t oh_lo, oh_hi;
      ValidOutputs(ki, s.pad_h, s.stride_h, s.height, g.out_h, &oh_lo, &oh_hi);
      for (int64_t kj = 0; kj < s.kernel_w; ++kj, dcol += g.positions) {
        int64_t ow_lo, ow_hi;
        ValidOutputs(kj, s.pad_w, s.stride_w, s.width, g.out_w, &ow_lo, &ow_hi);
        const int64_t n = ow_hi - ow_lo;
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          const float* src = dcol + oh * g.out_w + ow_lo;
          float* dst = plane + (oh * s.stride_h - s.pad_h + ki) * s.width + ow_lo * s.stride_w -
                       s.pad_w + kj;
          if (s.stride_w == 1) {
            for (int64_t j = 0; j < n; ++j) dst[j] += src[j];
          } else {
            for (int64_t j = 0; j < n; ++j) dst[j * s.stride_w] += src[j];
          }
        }
      }
    }
  }
}

// unfold(x_i): x_i itself for a pointwise convolution, else unfolded into
// `scratch`.
const float* Unfolded(const Conv2dShape& s, const Geometry& g, const float* x_i, float* scratch) {
  if (g.pointwise) return x_i;
  Unfold(s, g, x_i, scratch);
  return scratch;
}

double SumSquares(const float* v, int64_t n) {
  double sum = 0.0;
  for (int64_t k = 0; k < n; ++k) sum += static_cast<double>(v[k]) * v[k];
  return sum;
}

}  // namespace

void Conv2dForward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                   float* y, float* scratch) {
  const Geometry g(s);
  const ConstMatrixMap w_m(w, s.out_channels, g.rows);  // [out, K]
  const ConstColumnMap bias_v(bias, s.out_channels);    // [out]
  for (int64_t i = 0; i < s.batch; ++i) {
    const ConstMatrixMap col(Unfolded(s, g, x + i * s.in_channels * g.plane, scratch), g.rows,
                             g.positions);  // [K, P]
    MatrixMap y_i(y + i * s.out_channels * g.positions, s.out_channels,
                  g.positions);  // [out, P]
    y_i.noalias() = w_m * col;
    y_i.colwise() += bias_v;
  }
}

void Conv2dBackward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                    float* dw, float* dbias, float* dx, float* scratch) {
  const Geometry g(s);
  const ConstMatrixMap w_m(w, s.out_channels, g.rows);  // [out, K]
  MatrixMap dw_m(dw, s.out_channels, g.rows);           // [out, K]
  ColumnMap dbias_v(dbias, s.out_channels);             // [out]
  dw_m.setZero();
  dbias_v.setZero();
  for (int64_t i = 0; i < s.batch; ++i) {
    const int64_t in_offset = i * s.in_channels * g.plane;
    const ConstMatrixMap dy_i(dy + i * s.out_channels * g.positions, s.out_channels,
                              g.positions);  // [out, P]
    const ConstMatrixMap col(Unfolded(s, g, x + in_offset, scratch), g.rows, g.positions);
    dw_m.noalias() += dy_i * col.transpose();
    dbias_v += dy_i.rowwise().sum();
    if (dx == nullptr) continue;
    // dcol [K, P] = wᵀ · dy_i, written over the unfolded input (no longer
    // needed), then folded.
    float* dcol = g.pointwise ? dx + in_offset : scratch;
    MatrixMap(dcol, g.rows, g.positions).noalias() = w_m.transpose() * dy_i;
    if (!g.pointwise) Fold(s, g, dcol, dx + in_offset);
  }
}

void AddConv2dSquaredNorms(const Conv2dShape& s, const float* x, const float* dy,
                           double* squared_norms, float* scratch) {
  const Geometry g(s);
  const bool ghost = Conv2dUsesGhostNorm(s);
  float* block = scratch + g.rows * g.positions;  // after the unfolded input
  for (int64_t i = 0; i < s.batch; ++i) {
    const float* dy_row = dy + i * s.out_channels * g.positions;
    const ConstMatrixMap dy_i(dy_row, s.out_channels, g.positions);  // [out, P]
    const ConstMatrixMap col(Unfolded(s, g, x + i * s.in_channels * g.plane, scratch), g.rows,
                             g.positions);  // [K, P]
    double norm = 0.0;
    if (ghost) {
      // Σ_{p,q} (<a_p, a_q> + 1) <d_p, d_q>: the Gram matrices of unfold(x_i)
      // and dy_i.
      MatrixMap gram_a(block, g.positions, g.positions);
      MatrixMap gram_d(block + g.positions * g.positions, g.positions, g.positions);
      gram_a.noalias() = col.transpose() * col;
      gram_d.noalias() = dy_i.transpose() * dy_i;
      const int64_t n = g.positions * g.positions;
      for (int64_t k = 0; k < n; ++k) {
        norm += (static_cast<double>(gram_a.data()[k]) + 1.0) * gram_d.data()[k];
      }
    } else {
      // dW_i [out, K] instantiated; dbias_i[o] = Σ_p dy_i[o, p].
      MatrixMap dw_i(block, s.out_channels, g.rows);
      dw_i.noalias() = dy_i * col.transpose();
      norm = SumSquares(block, s.out_channels * g.rows);
      for (int64_t o = 0; o < s.out_channels; ++o) {
        double bias = 0.0;
        for (int64_t p = 0; p < g.positions; ++p) bias += dy_row[o * g.positions + p];
        norm += bias * bias;
      }
    }
    squared_norms[i] += norm;
  }
}

}  // namespace huddle::kernels::HUDDLE_CPU_ISA_VARIANT

#endif
