// Exact sums on a power-of-two grid: the kernels of DP-SGD's exact gradient sum (models/dp_sgd.h).
// See kernels/dense.h for the contract shared by all kernels.
//
// A float sum computed in several parts (chunks of a batch, ranks of a data-parallel job) has
// bits that depend on how it was split. Rounding every part to a grid of g = 2^exponent first
// and adding the integers (units of g) makes the total an exact function of the parts' rounded
// values: integer addition is exact and associative, so any split and any reduction order give
// the same integers. The accumulators are int64 with two's-complement wrap-around (the
// arithmetic is done on uint64, so no overflow is undefined): a total is exact whenever its true
// value lies in [-2^63, 2^63); the caller bounds the parts (`limit`) so that it does.
//
// The element arithmetic lives in kernels/grid_sum_math.h, shared by the CPU reference
// (grid_sum_cpu.cc) and the CUDA kernels (cuda/grid_sum.cu): both give the same bits.
#pragma once

#include <cstdint>

namespace huddle::kernels {

// acc[i] += round_half_even(double(x[i]) * 2^-exponent) for i in [0, n), where
// |double(x[i]) * 2^-exponent| <= limit. An element outside that range (too large, inf or NaN)
// adds nothing and counts once into *rejected. limit in [0, 2^62]; exponent in [-1000, 1000].
// `rejected` may point just past acc's n elements (it must not point into them).
void AccumulateOnGrid(const float* x, int64_t n, int exponent, double limit, int64_t* acc,
                      int64_t* rejected);

// acc[i] += units[i] for i in [0, n) (wrapping).
void AddUnits(const int64_t* units, int64_t n, int64_t* acc);

// out[i] = float((double(acc[i]) * 2^exponent) / divisor) for i in [0, n): the int64 to double
// conversion, the product (exact: a power of two) and the division each rounded to nearest-even
// once, then rounded to float; a result of magnitude below 2^-126 (the smallest normal float)
// becomes a zero of its sign, so flush-to-zero modes change nothing. divisor > 0 and finite;
// exponent in [-1000, 1000].
void UnitsToFloat(const int64_t* acc, int64_t n, int exponent, double divisor, float* out);

}  // namespace huddle::kernels
