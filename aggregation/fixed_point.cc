#include "aggregation/internal/fixed_point.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>

namespace huddle::aggregation::internal {
namespace {

constexpr uint64_t kMagicBits = std::bit_cast<uint64_t>(kMagic);

// Fixed trip counts let GCC vectorise at -O2 (its "very cheap" cost model only vectorises loops
// whose iteration count is a known multiple of the vector width, leaving no scalar epilogue).
constexpr size_t kBlock = 512;
constexpr size_t kLanes = 8;

inline uint64_t Term(double v, double scale) {
  return std::bit_cast<uint64_t>(v * scale + kMagic) - kMagicBits;
}

// The bound check is integer arithmetic on the float's bits, (limit - |bits|) >> 31 is 1 exactly
// when |bits| > limit, rather than a comparison: baseline SSE2 cannot vectorise the select that a
// comparison-to-flag becomes.
template <size_t N>
inline bool AddBlock(const float* __restrict x, uint64_t* __restrict acc, double scale,
                     uint32_t limit) {
  uint32_t bad = 0;
  for (size_t i = 0; i < N; ++i) {
    bad |= (limit - (std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu)) >> 31;
    acc[i] += Term(x[i], scale);
  }
  return bad != 0;
}

}  // namespace

uint32_t AbsBitsLimit(double max_abs) {
  float f = static_cast<float>(max_abs);
  if (static_cast<double>(f) > max_abs) f = std::nextafter(f, 0.0f);
  return std::bit_cast<uint32_t>(f);
}

int64_t QuantizeReference(float x, double scale) {
  return static_cast<int64_t>(std::nearbyint(static_cast<double>(x) * scale));
}

// The hot loop: one pass over x (from DRAM) and acc. target_clones builds an AVX2 and a baseline
// version and picks one at load time (ifunc); both compute the same IEEE operations, so they give
// bitwise-identical results (contraction into FMA is disabled for this library).
__attribute__((target_clones("avx2", "default"))) bool AddQuantized(const float* x, size_t n,
                                                                    double scale, uint32_t limit,
                                                                    uint64_t* acc) {
  bool bad = false;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) bad |= AddBlock<kBlock>(x + i, acc + i, scale, limit);
  for (; i + kLanes <= n; i += kLanes) bad |= AddBlock<kLanes>(x + i, acc + i, scale, limit);
  for (; i < n; ++i) bad |= AddBlock<1>(x + i, acc + i, scale, limit);
  return bad;
}

void SubtractQuantized(const float* x, size_t n, double scale, uint64_t* acc) {
  for (size_t i = 0; i < n; ++i) acc[i] -= Term(x[i], scale);
}

int64_t Dequantize(const uint64_t* acc, size_t n, double inv_scale, double divisor, float* out) {
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

}  // namespace huddle::aggregation::internal
