// CPU backend of kernels/dense.h: Eigen maps over the caller's buffers (no copies, no threads).
// Compiled once per CPU instruction set (kernels/cpu_isa_variant.h); the entry points at the end
// run the active set's variant.
#include "kernels/cpu_isa_variant.h"
#include "kernels/dense.h"

#if HUDDLE_CPU_ISA_DISPATCH

namespace huddle::kernels {

HUDDLE_CPU_ISA_DECLARE(DenseForward);
HUDDLE_CPU_ISA_DECLARE(DenseBackward);

void DenseForward(const DenseShape& shape, const float* x, const float* w, const float* bias,
                  float* y) {
  HUDDLE_CPU_ISA_CALL(DenseForward, shape, x, w, bias, y);
}

void DenseBackward(const DenseShape& shape, const float* x, const float* w, const float* dy,
                   float* dw, float* dbias, float* dx) {
  HUDDLE_CPU_ISA_CALL(DenseBackward, shape, x, w, dy, dw, dbias, dx);
}

}  // namespace huddle::kernels

#else  // the variant of one instruction set

#include <Eigen/Core>

namespace huddle::kernels::HUDDLE_CPU_ISA_VARIANT {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
using MatrixMap = Eigen::Map<RowMajorMatrix>;
using ConstVectorMap = Eigen::Map<const Eigen::RowVectorXf>;
using VectorMap = Eigen::Map<Eigen::RowVectorXf>;

// Weights (in * out) from which DenseForward packs w as the product's right operand.
constexpr int64_t kLargeWeights = int64_t{1} << 20;

}  // namespace

void DenseForward(const DenseShape& shape, const float* x, const float* w, const float* bias,
                  float* y) {
  const ConstMatrixMap x_m(x, shape.batch, shape.in);  // [batch, in]
  const ConstMatrixMap w_m(w, shape.out, shape.in);    // [out, in]
  const ConstVectorMap bias_v(bias, shape.out);        // [out]
  MatrixMap y_m(y, shape.batch, shape.out);            // [batch, out]
  if (shape.in * shape.out < kLargeWeights) {
    y_m.noalias() = x_m * w_m.transpose();
    y_m.rowwise() += bias_v;
    return;
  }
  // Eigen computes a product into a row-major y as its transpose, y^T = w * x^T, packing w as the
  // left operand 24 rows at a time. A large w, read from memory, packs faster as the right
  // operand (4 rows at a time): the product goes to a column-major scratch [batch, out] (Eigen
  // allocates its own blocks for such sizes anyway) and is copied into y with the bias.
  // 1.2-1.3x faster on 2048 x 2048 at batch 64; results differ in rounding from the path above
  // but are the same on every run.
  Eigen::MatrixXf product(shape.batch, shape.out);
  product.noalias() = x_m * w_m.transpose();
  y_m = product.rowwise() + bias_v;
}

void DenseBackward(const DenseShape& shape, const float* x, const float* w, const float* dy,
                   float* dw, float* dbias, float* dx) {
  const ConstMatrixMap x_m(x, shape.batch, shape.in);     // [batch, in]
  const ConstMatrixMap w_m(w, shape.out, shape.in);       // [out, in]
  const ConstMatrixMap dy_m(dy, shape.batch, shape.out);  // [batch, out]
  MatrixMap dw_m(dw, shape.out, shape.in);                // [out, in]
  VectorMap dbias_v(dbias, shape.out);                    // [out]
  dw_m.noalias() = dy_m.transpose() * x_m;
  dbias_v = dy_m.colwise().sum();
  if (dx != nullptr) {
    MatrixMap dx_m(dx, shape.batch, shape.in);  // [batch, in]
    dx_m.noalias() = dy_m * w_m;
  }
}

}  // namespace huddle::kernels::HUDDLE_CPU_ISA_VARIANT

#endif
