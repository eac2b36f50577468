// CPU kernels of kernels/exact_sum.h. The element arithmetic lives in kernels/exact_sum_math.h.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>

#include "kernels/exact_sum.h"
#include "kernels/exact_sum_math.h"

namespace huddle::kernels {
namespace {

using exact_sum_math::AbsBits;
using exact_sum_math::FixedPointTerm;

// Fixed trip counts let GCC vectorise at -O2 (its "very cheap" cost model only vectorises loops
// whose iteration count is a known multiple of the vector width, leaving no scalar epilogue).
constexpr size_t kBlock = 512;
constexpr size_t kLanes = 8;

// Each whole block first asks for the cache lines kPrefetchAhead values ahead of it, of x (1 KB
// ahead) and of acc. The loop's arithmetic fills the core's window with about 16 instructions per
// line of x, leaving too few lines in flight for the hardware prefetchers to hide last-level-cache
// latency. Measured with bench/aggregation_bench on a 2-core AVX-512 VM: the int32 fold went from
// 0.59 to 0.72-0.90 of memcpy at 1 M parameters from cache (median 0.80 over six runs); 0.5 and
// 2 KB ahead did about as well, 4 KB and more worse. A
// prefetch past the end of a buffer is a hint and never faults; its address is formed as an
// integer, since a pointer that far past an array's end would be undefined.
constexpr size_t kPrefetchAhead = 256;
constexpr size_t kLineBytes = 64;

template <int kWrite, typename T>
[[gnu::always_inline]] inline void PrefetchAhead(const T* p, size_t i) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) +
                                                   (i + kPrefetchAhead) * sizeof(T)),
                     kWrite, 3);
}

// One block of acc[i] += sign * q(x[i]) for the accumulator type Acc (uint64_t: the int64 sums;
// uint32_t: the int32 partial sums, wrapping), with a running maximum of AbsBits.
// Always inlined, so that each target clone below compiles them for its own instruction set.
template <size_t N, typename Acc, bool kSubtract = false>
[[gnu::always_inline]] inline int32_t AddBlock(const float* __restrict x, Acc* __restrict acc,
                                               double scale, int32_t m) {
  if constexpr (N == kBlock) {
    for (size_t i = 0; i < N; i += kLineBytes / sizeof(float)) {
      PrefetchAhead<0>(x, i);
    }
    for (size_t i = 0; i < N; i += kLineBytes / sizeof(Acc)) {
      PrefetchAhead<1>(acc, i);
    }
  }
  for (size_t i = 0; i < N; ++i) {
    m = std::max(m, AbsBits(x[i]));
    const Acc q = static_cast<Acc>(FixedPointTerm(x[i], scale));
    acc[i] = kSubtract ? acc[i] - q : acc[i] + q;
  }
  return m;
}

template <typename Acc, bool kSubtract = false>
[[gnu::always_inline]] inline uint32_t AddTerms(const float* x, size_t n, double scale, Acc* acc) {
  int32_t m = 0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    m = AddBlock<kBlock, Acc, kSubtract>(x + i, acc + i, scale, m);
  for (; i + kLanes <= n; i += kLanes)
    m = AddBlock<kLanes, Acc, kSubtract>(x + i, acc + i, scale, m);
  for (; i < n; ++i) m = AddBlock<1, Acc, kSubtract>(x + i, acc + i, scale, m);
  return static_cast<uint32_t>(m);
}

uint32_t* AsUnsigned(int32_t* narrow) { return reinterpret_cast<uint32_t*>(narrow); }

}  // namespace

uint32_t AbsBitsLimit(double max_abs) {
  float f = static_cast<float>(max_abs);
  if (static_cast<double>(f) > max_abs) f = std::nextafter(f, 0.0f);
  return hd::FloatBits(f);
}

int64_t FixedPointReference(float x, double scale) {
  return static_cast<int64_t>(std::nearbyint(static_cast<double>(x) * scale));
}

// The hot loops: one pass over x (from DRAM) and the sums. target_clones builds an x86-64-v4, an
// AVX2 and a baseline version and picks one at load time (ifunc); all compute the same IEEE
// operations, so they give bitwise-identical results (contraction into FMA is disabled for this
// library).
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) uint32_t AddFixedPoint(
    const float* x, size_t n, double scale, uint64_t* acc) {
  return AddTerms(x, n, scale, acc);
}

void SubtractFixedPoint(const float* x, size_t n, double scale, uint64_t* acc) {
  AddTerms<uint64_t, true>(x, n, scale, acc);
}

// The low 32 bits of a term are its int32 value when the caller's bound holds; adding them as
// uint32 wraps as the int32 sum would, without signed overflow in the partial steps.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) uint32_t AddFixedPointNarrow(
    const float* x, size_t n, double scale, int32_t* narrow) {
  return AddTerms(x, n, scale, AsUnsigned(narrow));
}

void SubtractFixedPointNarrow(const float* x, size_t n, double scale, int32_t* narrow) {
  AddTerms<uint32_t, true>(x, n, scale, AsUnsigned(narrow));
}

int64_t TermBound(uint32_t max_abs_bits, double scale) {
  const double f = static_cast<double>(std::bit_cast<float>(max_abs_bits));
  return static_cast<int64_t>(std::ceil(std::fabs(hd::Mul(f, scale))));
}

void MoveNarrowToWide(int32_t* narrow, size_t n, uint64_t* wide) {
  for (size_t i = 0; i < n; ++i) {
    wide[i] += static_cast<uint64_t>(static_cast<int64_t>(narrow[i]));
    narrow[i] = 0;
  }
}

int64_t FixedPointToFloat(const uint64_t* acc, const int32_t* narrow, size_t n, double inv_scale,
                          double divisor, float* out) {
  const auto sum = [&](size_t i) {
    const uint64_t s = narrow == nullptr
                           ? acc[i]
                           : acc[i] + static_cast<uint64_t>(static_cast<int64_t>(narrow[i]));
    return static_cast<double>(static_cast<int64_t>(s));
  };
  bool clipped = false;
  for (size_t i = 0; i < n; ++i) {
    const double d = sum(i) * inv_scale / divisor;
    const double c = std::clamp(d, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX));
    clipped |= c != d;
    out[i] = static_cast<float>(c);
  }
  if (!clipped) return -1;
  for (size_t i = 0; i < n; ++i) {
    const double d = sum(i) * inv_scale / divisor;
    if (!(std::fabs(d) <= static_cast<double>(FLT_MAX))) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace huddle::kernels
