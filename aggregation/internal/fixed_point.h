// Fixed-point kernels behind StreamingAggregator. Internal to aggregation/: no other module
// includes this header (tests do, to check the fast kernel against the scalar reference).
//
// A value x with weight w becomes the integer term q = round_half_even(double(x) * scale), where
// scale = double(w) * 2^S is computed once per update. Because 2^S is a power of two,
// double(x) * scale equals round_to_double(double(x) * double(w)) * 2^S, so q depends on (x, w, S)
// alone. Callers guarantee |double(x) * scale| <= 2^51 for every accepted x; then adding
// kMagic = 1.5 * 2^52 lands in [2^52, 2^53], where doubles are spaced exactly 1 apart, so the
// addition rounds to the nearest integer (ties to even, the default rounding mode) and the bit
// pattern of the sum minus the bit pattern of kMagic is q. Accumulators are uint64_t so that the
// deterministic garbage term of a rejected value (NaN, inf, out of bound) wraps instead of
// overflowing; subtracting the same term restores the accumulator exactly.
//
// Thread-safety: pure functions; callers own the buffers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace huddle::aggregation::internal {

inline constexpr double kMagic = 0x1.8p52;

// Readable reference for one term (valid for |double(x) * scale| <= 2^51).
int64_t QuantizeReference(float x, double scale);

// The bit pattern of the largest float f <= max_abs (max_abs > 0 and finite). For a float x,
// |x| <= max_abs exactly when (bits(x) & 0x7fffffff) <= AbsBitsLimit(max_abs); inf and NaN have
// larger patterns than any finite float, so one integer comparison rejects them too.
uint32_t AbsBitsLimit(double max_abs);

// acc[i] += q(x[i]) for i in [0, n). Returns true iff some x[i] fails the check above against
// abs_bits_limit; such elements still receive a deterministic term, which SubtractQuantized
// removes exactly. x and acc must not overlap.
bool AddQuantized(const float* x, size_t n, double scale, uint32_t abs_bits_limit, uint64_t* acc);

// acc[i] -= q(x[i]) for i in [0, n): the exact inverse of AddQuantized with the same arguments.
void SubtractQuantized(const float* x, size_t n, double scale, uint64_t* acc);

// out[i] = float((double(int64(acc[i])) * inv_scale) / divisor) for i in [0, n). Returns the
// index of the first element whose result is outside the float range, or -1 (then all of out is
// written). inv_scale is a power of two, so the only roundings are int64 -> double (exact below
// 2^53), the division, and double -> float.
int64_t Dequantize(const uint64_t* acc, size_t n, double inv_scale, double divisor, float* out);

}  // namespace huddle::aggregation::internal
