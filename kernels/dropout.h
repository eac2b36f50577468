// Inverted dropout, deterministic and stateless: whether element i is kept is a pure function of
// (seed, offset + i) and p, the same on every backend, so the backward pass recomputes the mask
// instead of storing it and a CPU and a GPU run drop the same elements. See kernels/dense.h for
// the contract shared by all kernels.
//
// The mask: h = Hash(seed, offset + i), a 64-bit SplitMix64-style mix (dropout_math below), and
// element i is dropped iff h < floor(p · 2^64), so the drop probability is p up to 2^-64 (for
// p >= 2^-40; a smaller p rounds down). Kept elements are scaled by 1 / (1 - p), computed in
// double and rounded to float once: x · (1 / (1 - p)), the same bits on every backend.
//
// `offset` lets the caller give each call (layer, step) its own counter range under one seed:
// calls over disjoint [offset, offset + n) ranges draw independent masks.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace huddle::kernels {

// In place: x[i] = keep(i) ? x[i] / (1 - p) : 0 for i in [0, n); p in [0, 1) (p = 0 is the
// identity, bit for bit).
void DropoutForward(float* x, int64_t n, float p, uint64_t seed, uint64_t offset);

// In place: dy[i] = keep(i) ? dy[i] / (1 - p) : 0 with the same keep(i) as DropoutForward with
// the same p, seed and offset.
void DropoutBackward(float* dy, int64_t n, float p, uint64_t seed, uint64_t offset);

// The mask and scale, written once for the CPU reference and the CUDA kernels. Internal to
// kernels/.
namespace dropout_math {

// SplitMix64's output function (Steele, Lea and Flood 2014): a bijection of 64-bit words that
// mixes every input bit into every output bit.
HUDDLE_HD inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The stream named by `seed` starts SplitMix64's state at Key(seed) = Mix(seed).
HUDDLE_HD inline uint64_t Key(uint64_t seed) { return Mix(seed); }

// Element `counter`'s word of the stream with that key: SplitMix64's counter-th output.
HUDDLE_HD inline uint64_t Word(uint64_t key, uint64_t counter) {
  return Mix(key + (counter + 1) * 0x9e3779b97f4a7c15ull);
}

HUDDLE_HD inline uint64_t Hash(uint64_t seed, uint64_t counter) { return Word(Key(seed), counter); }

// floor(p · 2^64) for p in [0, 1): p · 2^64 is exact in double (p is a float), below 2^64.
HUDDLE_HD inline uint64_t DropThreshold(float p) {
  return p > 0.0f ? static_cast<uint64_t>(hd::Mul(p, 18446744073709551616.0)) : 0;
}

// 1 / (1 - p) in double.
HUDDLE_HD inline double KeepScale(float p) { return hd::Div(1.0, hd::Sub(1.0, p)); }

// Element `counter` of the stream `key` (Key(seed)), masked and scaled; computed branch-free, as
// the mask is a coin flip that no branch predictor can learn.
HUDDLE_HD inline float Apply(float v, uint64_t key, uint64_t counter, uint64_t threshold,
                             double scale) {
  const float kept = static_cast<float>(hd::Mul(v, scale));
  return Word(key, counter) < threshold ? 0.0f : kept;
}

}  // namespace dropout_math
}  // namespace huddle::kernels
