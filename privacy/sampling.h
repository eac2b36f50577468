// Secret sampling: draws that amplification by sampling relies on, from a cryptographic source.
//
// Amplification by sampling (the accountants' q < 1) holds only while the adversary cannot predict
// who was sampled. A seeded PRNG whose seed a participant can learn or guess (the job seed, a
// value derived from it and sent to clients) voids it. These draws come from a NoiseSource keyed
// from the OS CSPRNG (privacy/noise.h), are exact (no floating-point bias), and keep no state that
// anyone outside the process could replay.
//
// Thread-safety: stateless functions; the NoiseSource is single-threaded.
#pragma once

#include <cstdint>
#include <vector>

#include "privacy/noise.h"

namespace huddle::privacy {

// True with probability exactly p (a double in [0, 1]; false for NaN or p <= 0, true for p >= 1):
// a uniform U in [0, 1) is compared with p's binary expansion 64 bits at a time, so the trial
// costs one 64-bit draw except with probability 2^-64 per further word.
bool BernoulliTrial(double p, NoiseSource& source);

// Uniform random permutation of *items (Fisher-Yates with unbiased draws).
template <typename T>
void SecretShuffle(std::vector<T>* items, NoiseSource& source) {
  for (size_t i = items->size(); i > 1; --i) {
    const auto j = static_cast<size_t>(source.UniformBelow(i));
    std::swap((*items)[i - 1], (*items)[j]);
  }
}

}  // namespace huddle::privacy
