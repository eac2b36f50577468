// Aggregation's exact weighted sum in fixed point: the kernel behind StreamingAggregator's Fold
// (aggregation/streaming_aggregator.h). See kernels/dense.h for the contract shared by all kernels;
// there is no CUDA version (the aggregator folds on the host).
//
// A value x with weight w becomes the integer term q = round_half_even(double(x) * scale), where
// scale = double(w) * 2^S is computed once per update. Because 2^S is a power of two,
// double(x) * scale equals round_to_double(double(x) * double(w)) * 2^S, so q depends on (x, w, S)
// alone. Callers guarantee |double(x) * scale| <= 2^51 for every accepted x; then the rounding is
// exact_sum_math's magic-number addition (kernels/exact_sum_math.h, shared with the grid sums of
// kernels/grid_sum.h). Integer addition is exact and associative, so the sum of the terms does not
// depend on the order the updates arrive in. Accumulators are uint64_t so that the deterministic
// garbage term of a rejected value (NaN, inf, out of bound) wraps instead of overflowing;
// subtracting the same term restores the accumulator exactly.
//
// Instruction sets: the add loop is compiled for AVX2 and for baseline x86-64 and the loader picks
// one (target_clones). Both compute the same IEEE operations (no contraction into FMA:
// -ffp-contract=off, huddle_kernels' flags), so the results are bitwise identical.
//
// Thread-safety: pure functions; callers own the buffers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace huddle::kernels {

// Readable reference for one term (valid for |double(x) * scale| <= 2^51): nearbyint in the
// default rounding mode.
int64_t FixedPointReference(float x, double scale);

// The bit pattern of the largest float f <= max_abs (max_abs > 0 and finite). For a float x,
// |x| <= max_abs exactly when (bits(x) & 0x7fffffff) <= AbsBitsLimit(max_abs); inf and NaN have
// larger patterns than any finite float, so one integer comparison rejects them too.
uint32_t AbsBitsLimit(double max_abs);

// acc[i] += q(x[i]) for i in [0, n). Returns true iff some x[i] fails the check above against
// abs_bits_limit; such elements still receive a deterministic term, which SubtractFixedPoint
// removes exactly. x and acc must not overlap.
bool AddFixedPoint(const float* x, size_t n, double scale, uint32_t abs_bits_limit, uint64_t* acc);

// acc[i] -= q(x[i]) for i in [0, n): the exact inverse of AddFixedPoint with the same arguments.
void SubtractFixedPoint(const float* x, size_t n, double scale, uint64_t* acc);

// out[i] = float((double(int64(acc[i])) * inv_scale) / divisor) for i in [0, n). Returns the
// index of the first element whose result is outside the float range, or -1 (then all of out is
// written). inv_scale is a power of two, so the only roundings are int64 -> double (exact below
// 2^53), the division, and double -> float.
int64_t FixedPointToFloat(const uint64_t* acc, size_t n, double inv_scale, double divisor,
                          float* out);

}  // namespace huddle::kernels
