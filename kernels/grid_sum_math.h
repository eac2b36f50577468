// The element arithmetic of kernels/grid_sum.h, written once for the CPU reference and the CUDA
// kernels (HUDDLE_HD, correctly rounded IEEE operations only), so that both give the same bits.
// Internal to kernels/.
#pragma once

#include <cstdint>

#include "kernels/exact_sum_math.h"
#include "kernels/hd.h"

namespace huddle::kernels::grid_sum_math {

// 2^e as a double, for e in [-1022, 1023] (built from its bits: no libm, the same everywhere).
HUDDLE_HD inline double PowerOfTwo(int e) {
  return hd::BitsToDouble(static_cast<uint64_t>(e + 1023) << 52);
}
// 2^e for e in [-1000, 1000] as the product of two factors in range (a power of two: exact).
HUDDLE_HD inline double Scale(int e) {
  const int half = e / 2;
  return hd::Mul(PowerOfTwo(half), PowerOfTwo(e - half));
}

// round_half_even(v * inverse_grid) into *units, or false when |v * inverse_grid| > limit or it
// is NaN. inverse_grid is a power of two, so the product u is exact unless it overflows (then it
// is inf, refused) or underflows (then it is below 2^-1022 and rounds to 0 either way, also
// where a denormals-are-zero mode reads it as 0). limit <= 2^62, so every accepted value and its
// rounding convert to int64 exactly. Below 2^51 in magnitude the rounding is the magic-number
// addition that every exact sum shares (exact_sum_math::RoundToInteger, kernels/exact_sum_math.h:
// round to nearest even in the default mode); from 2^52 on, u is an integer; in between, u has one
// fractional bit at most and is rounded by hand. No libm call, so the loops vectorise.
HUDDLE_HD inline bool GridUnits(float v, double inverse_grid, double limit, int64_t* units) {
  const double u = hd::Mul(static_cast<double>(v), inverse_grid);
  if (!(u <= limit && u >= -limit)) return false;
  if (u < 0x1p51 && u > -0x1p51) {
    *units = static_cast<int64_t>(exact_sum_math::RoundToInteger(u));
    return true;
  }
  auto k = static_cast<int64_t>(u);  // toward zero: exact for |u| >= 2^52, else drops a half
  const double rest = hd::Sub(u, static_cast<double>(k));  // exact: 0 or +-0.5
  if (rest != 0 && (k & 1) != 0) k += rest > 0 ? 1 : -1;   // a tie: to the even neighbour
  *units = k;
  return true;
}

// a + b modulo 2^64, in two's complement.
HUDDLE_HD inline int64_t WrappingAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// float((double(units) * grid) / divisor), magnitudes below 2^-126 flushed to a signed zero.
HUDDLE_HD inline float UnitsValue(int64_t units, double grid, double divisor) {
  const double v = hd::Div(hd::Mul(static_cast<double>(units), grid), divisor);
  constexpr double kSmallestNormalFloat = 0x1p-126;
  if (v < kSmallestNormalFloat && v > -kSmallestNormalFloat) return v < 0 ? -0.0f : 0.0f;
  return static_cast<float>(v);
}

}  // namespace huddle::kernels::grid_sum_math
