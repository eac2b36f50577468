// Deterministic, seedable random numbers for everything that must be reproducible: cohort sampling,
// data partitioning, weight initialisation, minibatch order.
//
// NOT for privacy noise: noise that protects privacy comes from a cryptographic generator
// (privacy/).
//
// `Rng` is xoshiro256** (Blackman and Vigna) seeded through SplitMix64. Its whole state is four
// 64-bit words, so checkpoints can save and restore it exactly. The distributions below are written
// out here (not std::*_distribution, whose algorithms differ between standard libraries) so the
// same seed gives the same numbers on every platform.
//
// Thread-safety: none; one Rng per thread or component.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace huddle {

// Mixes several 64-bit values into one seed (SplitMix64 finaliser chain). Used to derive
// independent streams, e.g. DeriveSeed(job_seed, round, client_index).
uint64_t DeriveSeed(uint64_t a, uint64_t b = 0, uint64_t c = 0);

// FNV-1a 64-bit hash of a string: stable across platforms (unlike std::hash), for deriving seeds
// from names such as client ids.
uint64_t StableHash(const std::string& s);

class Rng {
 public:
  using State = std::array<uint64_t, 4>;

  explicit Rng(uint64_t seed = 0);

  uint64_t Next();
  // Uniform integer in [0, n), n >= 1 (Lemire's unbiased multiply-shift).
  uint64_t UniformInt(uint64_t n);
  // Uniform double in [0, 1) with 53 random bits.
  double Uniform();
  // Standard normal (Marsaglia polar method).
  double Normal();
  // Gamma(shape, 1) (Marsaglia and Tsang; boosted for shape < 1). Returns NaN unless shape is
  // finite and > 0.
  double Gamma(double shape);
  // Fisher-Yates shuffle of `v`.
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(UniformInt(i));
      std::swap(v[i - 1], v[j]);
    }
  }

  State state() const { return state_; }
  // Restores a saved state. Returns false (and keeps the current state) for the all-zero state,
  // which xoshiro can never reach and from which it would never leave.
  bool set_state(const State& s);

 private:
  State state_;
};

}  // namespace huddle
