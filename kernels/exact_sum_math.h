// The rounding of Huddle's exact integer sums, written once for the CPU and the CUDA kernels
// (HUDDLE_HD, correctly rounded IEEE operations only), so that every sum rounds its terms to the
// same integers. Used by aggregation's fixed-point fold (kernels/exact_sum.h) and by DP-SGD's sums
// on a power-of-two grid (kernels/grid_sum_math.h). Internal to kernels/ and the exact sums.
//
// The magic-number rounding: for a double u with |u| <= 2^51, u + kMagic (kMagic = 1.5 * 2^52)
// lies in [2^52, 2^53], where doubles are spaced exactly 1 apart, so the addition rounds u to the
// nearest integer (ties to even, the default rounding mode), and the bit pattern of the sum minus
// the bit pattern of kMagic is that integer in two's complement. One addition and one integer
// subtraction, no libm call and no float-to-integer conversion, so the loops vectorise on every
// instruction set. Outside |u| <= 2^51 (inf and NaN included) the result is a deterministic
// garbage value: callers bound or reject such inputs.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace huddle::kernels::exact_sum_math {

inline constexpr double kMagic = 0x1.8p52;

// round_half_even(u) as a two's-complement uint64, for |u| <= 2^51.
HUDDLE_HD inline uint64_t RoundToInteger(double u) {
  return hd::DoubleBits(hd::Add(u, kMagic)) - hd::DoubleBits(kMagic);
}

// The fold's term of x with weight scale: round_half_even(double(x) * scale) (kernels/exact_sum.h).
HUDDLE_HD inline uint64_t FixedPointTerm(float x, double scale) {
  return RoundToInteger(hd::Mul(static_cast<double>(x), scale));
}

// |x| as its bit pattern with the sign cleared: orders like |x| among finite floats, with inf and
// NaN above every finite float, so one integer comparison with a bound's pattern (AbsBitsLimit)
// rejects values above the bound, infinities and NaNs together. int32 (the pattern is below 2^31)
// so that a running maximum vectorises on baseline SSE2, which has no unsigned 32-bit compare.
HUDDLE_HD inline int32_t AbsBits(float x) {
  return static_cast<int32_t>(hd::FloatBits(x) & 0x7fffffffu);
}

}  // namespace huddle::kernels::exact_sum_math
