// CPU backend of kernels/dense.h: Eigen maps over the caller's buffers (no copies, no threads).
#include <Eigen/Core>

#include "kernels/dense.h"

namespace huddle::kernels {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
using MatrixMap = Eigen::Map<RowMajorMatrix>;
using ConstVectorMap = Eigen::Map<const Eigen::RowVectorXf>;
using VectorMap = Eigen::Map<Eigen::RowVectorXf>;

}  // namespace

void DenseForward(const DenseShape& shape, const float* x, const float* w, const float* bias,
                  float* y) {
  const ConstMatrixMap x_m(x, shape.batch, shape.in);  // [batch, in]
  const ConstMatrixMap w_m(w, shape.out, shape.in);    // [out, in]
  const ConstVectorMap bias_v(bias, shape.out);        // [out]
  MatrixMap y_m(y, shape.batch, shape.out);            // [batch, out]
  y_m.noalias() = x_m * w_m.transpose();
  y_m.rowwise() += bias_v;
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

}  // namespace huddle::kernels
