// CPU kernels of kernels/exact_sum.h. The element arithmetic lives in kernels/exact_sum_math.h.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/exact_sum.h"
#include "kernels/exact_sum_math.h"

namespace huddle::kernels {
namespace {

using exact_sum_math::AboveAbsBits;
using exact_sum_math::FixedPointTerm;

// Fixed trip counts let GCC vectorise at -O2 (its "very cheap" cost model only vectorises loops
// whose iteration count is a known multiple of the vector width, leaving no scalar epilogue).
constexpr size_t kBlock = 512;
constexpr size_t kLanes = 8;

template <size_t N>
inline bool AddBlock(const float* __restrict x, uint64_t* __restrict acc, double scale,
                     uint32_t limit) {
  uint32_t bad = 0;
  for (size_t i = 0; i < N; ++i) {
    bad |= AboveAbsBits(x[i], limit);
    acc[i] += FixedPointTerm(x[i], scale);
  }
  return bad != 0;
}

}  // namespace

uint32_t AbsBitsLimit(double max_abs) {
  float f = static_cast<float>(max_abs);
  if (static_cast<double>(f) > max_abs) f = std::nextafter(f, 0.0f);
  return hd::FloatBits(f);
}

int64_t FixedPointReference(float x, double scale) {
  return static_cast<int64_t>(std::nearbyint(static_cast<double>(x) * scale));
}

// The hot loop: one pass over x (from DRAM) and acc. target_clones builds an AVX2 and a baseline
// version and picks one at load time (ifunc); both compute the same IEEE operations, so they give
// bitwise-identical results (contraction into FMA is disabled for this library).
__attribute__((target_clones("avx2", "default"))) bool AddFixedPoint(const float* x, size_t n,
                                                                     double scale, uint32_t limit,
                                                                     uint64_t* acc) {
  bool bad = false;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) bad |= AddBlock<kBlock>(x + i, acc + i, scale, limit);
  for (; i + kLanes <= n; i += kLanes) bad |= AddBlock<kLanes>(x + i, acc + i, scale, limit);
  for (; i < n; ++i) bad |= AddBlock<1>(x + i, acc + i, scale, limit);
  return bad;
}

void SubtractFixedPoint(const float* x, size_t n, double scale, uint64_t* acc) {
  for (size_t i = 0; i < n; ++i) acc[i] -= FixedPointTerm(x[i], scale);
}

int64_t FixedPointToFloat(const uint64_t* acc, size_t n, double inv_scale, double divisor,
                          float* out) {
  bool clipped = false;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(static_cast<int64_t>(acc[i])) * inv_scale / divisor;
    const double c = std::clamp(d, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX));
    clipped |= c != d;
    out[i] = static_cast<float>(c);
  }
  if (!clipped) return -1;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(static_cast<int64_t>(acc[i])) * inv_scale / divisor;
    if (!(std::fabs(d) <= static_cast<double>(FLT_MAX))) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace huddle::kernels
