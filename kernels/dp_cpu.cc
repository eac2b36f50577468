// CPU references of kernels/dp.h: plain loops, shapes in comments.
#include <cmath>
#include <cstring>

#include "kernels/dp.h"

namespace huddle::kernels {
namespace {

// Σ double(v[k])², four accumulators (breaks the add dependency chain).
double SumSquares(const float* v, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    s0 += double{v[k]} * v[k];
    s1 += double{v[k + 1]} * v[k + 1];
    s2 += double{v[k + 2]} * v[k + 2];
    s3 += double{v[k + 3]} * v[k + 3];
  }
  for (; k < n; ++k) s0 += double{v[k]} * v[k];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace

void GatherRows(const float* features, const int32_t* labels, int64_t cols, const int64_t* rows,
                int64_t count, float* x, int32_t* y) {
  for (int64_t r = 0; r < count; ++r) {
    std::memcpy(x + r * cols, features + rows[r] * cols, static_cast<size_t>(cols) * sizeof(float));
    y[r] = labels[rows[r]];
  }
}

void AddGhostSquaredNorms(const float* a, int64_t in, const float* d, int64_t out, int64_t batch,
                          double* squared_norms) {
  for (int64_t i = 0; i < batch; ++i) {
    // ||d_i a_iᵀ||² + ||d_i||² = ||d_i||² (||a_i||² + 1)
    squared_norms[i] += SumSquares(d + i * out, out) * (SumSquares(a + i * in, in) + 1.0);
  }
}

void ClipFactors(const double* squared_norms, int64_t batch, const ClipFactorParams& params,
                 float* factors) {
  for (int64_t i = 0; i < batch; ++i) {
    const double norm = params.norm_scale * std::sqrt(squared_norms[i]);
    const double clip = norm > params.clip_norm ? params.clip_norm / norm : 1.0;
    factors[i] = static_cast<float>(params.multiplier * clip);
  }
}

void ScaleRows(float* m, int64_t rows, int64_t cols, const float* factors) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = m + r * cols;  // [cols]
    for (int64_t k = 0; k < cols; ++k) row[k] *= factors[r];
  }
}

}  // namespace huddle::kernels
