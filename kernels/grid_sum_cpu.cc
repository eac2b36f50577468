// CPU reference of kernels/grid_sum.h: plain loops over kernels/grid_sum_math.h's element
// arithmetic, which the CUDA kernels (kernels/cuda/grid_sum.cu) share.
#include "kernels/grid_sum.h"
#include "kernels/grid_sum_math.h"

namespace huddle::kernels {

void AccumulateOnGrid(const float* x, int64_t n, int exponent, double limit, int64_t* acc,
                      int64_t* rejected) {
  const double inverse_grid = grid_sum_math::Scale(-exponent);
  int64_t refused = 0;
  for (int64_t i = 0; i < n; ++i) {  // x[n], acc[n]
    int64_t units = 0;
    if (grid_sum_math::GridUnits(x[i], inverse_grid, limit, &units)) {
      acc[i] = grid_sum_math::WrappingAdd(acc[i], units);
    } else {
      ++refused;
    }
  }
  if (refused > 0) *rejected = grid_sum_math::WrappingAdd(*rejected, refused);
}

void AddUnits(const int64_t* units, int64_t n, int64_t* acc) {
  for (int64_t i = 0; i < n; ++i) acc[i] = grid_sum_math::WrappingAdd(acc[i], units[i]);
}

void UnitsToFloat(const int64_t* acc, int64_t n, int exponent, double divisor, float* out) {
  const double grid = grid_sum_math::Scale(exponent);
  for (int64_t i = 0; i < n; ++i) out[i] = grid_sum_math::UnitsValue(acc[i], grid, divisor);
}

}  // namespace huddle::kernels
