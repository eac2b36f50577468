#include "privacy/sampling.h"

#include <cmath>

namespace huddle::privacy {

bool BernoulliTrial(double p, NoiseSource& source) {
  if (!(p > 0)) return false;
  if (p >= 1) return true;
  // p = m * 2^-s exactly, with m an integer below 2^53 and s >= 1.
  int exponent = 0;
  const double fraction = std::frexp(p, &exponent);  // p = fraction * 2^exponent, [0.5, 1)
  const auto m = static_cast<uint64_t>(std::ldexp(fraction, 53));
  const int s = 53 - exponent;  // p < 1, so exponent <= 0 and s >= 53
  // Word w (w = 0, 1, ...) of p's binary expansion holds bits 64w+1 .. 64w+64 after the point:
  // floor(p * 2^(64(w+1))) mod 2^64 = (m * 2^(64(w+1) - s)) mod 2^64.
  for (int w = 0; 64 * w < s; ++w) {
    const int shift = 64 * (w + 1) - s;  // may be negative
    uint64_t word = 0;
    if (shift >= 64) {
      word = 0;  // m * 2^shift is a multiple of 2^64
    } else if (shift >= 0) {
      word = m << shift;  // mod 2^64
    } else if (shift > -64) {
      word = m >> -shift;
    }
    const uint64_t u = source.NextU64();
    if (u != word) return u < word;
  }
  // U agreed with every bit of p so far and p has no further bits: U >= p.
  return false;
}

}  // namespace huddle::privacy
