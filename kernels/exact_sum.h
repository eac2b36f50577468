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
// Instruction sets: the add loops are compiled for x86-64-v4 (AVX-512, whose one-instruction
// narrowing of 64-bit lanes is most of the int32 path's speed), AVX2 and baseline x86-64, and the
// loader picks one (target_clones). All compute the same IEEE operations (no contraction into FMA:
// -ffp-contract=off, huddle_kernels' flags), so the results are bitwise identical.
//
// Narrow sums: the same terms can also be added into int32 partial sums, 4 bytes of accumulator
// traffic a value instead of 8. The additions wrap modulo 2^32, so they are exact while every
// partial sum stays in [-2^31, 2^31) and exactly undone by the matching subtraction otherwise;
// StreamingAggregator keeps a running bound per chunk of partial sums, checks it after each add
// (TermBound of the largest value the add saw) and moves a chunk's terms elsewhere when it fails.
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

// A bound on |q(x)| for every float x with (bits(x) & 0x7fffffff) <= max_abs_bits (a finite
// float's pattern): ceil(|double(f) * scale|) for that largest f, since the rounding is monotonic.
int64_t TermBound(uint32_t max_abs_bits, double scale);

// acc[i] += q(x[i]) for i in [0, n). Returns the largest (bits(x[i]) & 0x7fffffff), 0 for n == 0:
// compared with AbsBitsLimit, whether every |x[i]| is within the bound; otherwise the largest
// |x[i]|, for TermBound. An element that fails that check still receives a deterministic term,
// which SubtractFixedPoint removes exactly. x and acc must not overlap.
uint32_t AddFixedPoint(const float* x, size_t n, double scale, uint64_t* acc);

// acc[i] -= q(x[i]) for i in [0, n): the exact inverse of AddFixedPoint with the same arguments.
void SubtractFixedPoint(const float* x, size_t n, double scale, uint64_t* acc);

// narrow[i] += q(x[i]) modulo 2^32 for i in [0, n): the int32 sum when no partial sum leaves the
// int32 range (see the top). Returns what AddFixedPoint returns. x and narrow must not overlap.
uint32_t AddFixedPointNarrow(const float* x, size_t n, double scale, int32_t* narrow);

// narrow[i] -= q(x[i]) modulo 2^32: the exact inverse of AddFixedPointNarrow, wrapped or not.
void SubtractFixedPointNarrow(const float* x, size_t n, double scale, int32_t* narrow);

// wide[i] += narrow[i]; narrow[i] = 0 for i in [0, n): moves partial sums into the int64 sums.
void MoveNarrowToWide(int32_t* narrow, size_t n, uint64_t* wide);

// out[i] = float((double(s) * inv_scale) / divisor) for i in [0, n), where s is the sum
// int64(acc[i]) + narrow[i] (narrow may be null: no partial sums). Returns the index of the first
// element whose result is outside the float range, or -1 (then all of out is written). inv_scale
// is a power of two, so the only roundings are int64 -> double (exact below 2^53), the division,
// and double -> float.
int64_t FixedPointToFloat(const uint64_t* acc, const int32_t* narrow, size_t n, double inv_scale,
                          double divisor, float* out);

}  // namespace huddle::kernels
