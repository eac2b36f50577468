// Privacy noise: a cryptographic random source and an exact discrete Gaussian sampler.
//
// Noise that protects privacy must not leak through floating point. Sampling a float Gaussian
// and adding it to a float value leaks the value through the pattern of representable results
// (Mironov 2012). So Huddle never adds float noise: a value x is first rounded to a power-of-two
// grid g (round half to even, deterministic), and an integer k drawn *exactly* from the discrete
// Gaussian N_Z(0, s) (Canonne, Kamath and Steinke 2020, Algorithm 1, with integer arithmetic only)
// is added on that grid: the output is (round(x / g) + k) * g, computed exactly in integers and
// converted to float at the end (post-processing). Rounding moves x by at most g/2 per coordinate,
// so the L2 sensitivity grows from Delta to at most Delta + g * sqrt(d) / 2 for d coordinates;
// NoiseGridFor() picks g so that the noise standard deviation in grid units is between 2^24 and
// 2^25, and the variance s is chosen so that the noise is at least z times that enlarged
// sensitivity: the accountant's z holds exactly. See docs/privacy.md.
//
// Randomness: NoiseSource is a ChaCha20 keystream keyed either from the operating system
// (libsodium's randombytes: private) or, for reproducible tests only, from a seed (NOT private:
// anyone who knows the seed can subtract the noise). is_private() tells which.
//
// Thread-safety: a NoiseSource is not thread-safe (one per thread); the free functions are.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"

namespace huddle::privacy {

class NoiseSource {
 public:
  // Keyed from the OS CSPRNG. The key never leaves the object.
  static NoiseSource Secure();
  // Keyed from `seed` (e.g. for tests and reproducible experiments). NOT PRIVATE.
  static NoiseSource SeededForTesting(uint64_t seed);
  // Keyed from 32 bytes that several trusted parties share, so that they draw the same stream
  // (data-parallel DP-SGD: every rank draws the same secret Poisson sample). Private iff the key
  // is secret and was drawn from a private source (`is_private` says so).
  static NoiseSource FromSharedKey(const std::array<unsigned char, 32>& key, bool is_private);

  // A moved-from source has a wiped key and is_private() false: only destroy or assign to it.
  NoiseSource(NoiseSource&&) noexcept;
  NoiseSource& operator=(NoiseSource&&) noexcept;
  ~NoiseSource();  // wipes the key and buffered keystream

  bool is_private() const { return private_; }
  // "os-csprng" or "seeded (NOT PRIVATE)".
  std::string Describe() const;

  // 64 uniformly random bits.
  uint64_t NextU64();
  // Uniform in [0, n), n >= 1, unbiased (rejection sampling). 128-bit for the exact sampler.
  // n = 0 returns 0.
  uint64_t UniformBelow(uint64_t n);
  unsigned __int128 UniformBelow128(unsigned __int128 n);

 private:
  NoiseSource(const unsigned char* key, bool is_private);
  void Refill();

  unsigned char key_[32];
  uint64_t nonce_ = 0;
  unsigned char buffer_[4096];
  size_t used_ = sizeof(buffer_);
  bool private_ = true;
};

// An exact sampler of the discrete Gaussian N_Z(0, s): P(k) proportional to exp(-k^2 / (2 s))
// over the integers, for an integer variance parameter s in [1, 2^52]. Every sample is exact:
// only integer and rational arithmetic, no floating point. (Precisely: N_Z(0, s) conditioned on
// |k| <= 2^37, which keeps all arithmetic in 128 bits and differs from N_Z(0, s) by less than
// 2^-3,000,000 in total variation; see noise.cc.)
class DiscreteGaussian {
 public:
  // InvalidArgument for s outside [1, 2^52].
  static StatusOr<DiscreteGaussian> Create(uint64_t variance);
  int64_t Sample(NoiseSource& source) const;
  uint64_t variance() const { return variance_; }

 private:
  explicit DiscreteGaussian(uint64_t variance);
  uint64_t variance_;
  uint64_t t_;  // floor(sqrt(s)) + 1: the scale of the discrete Laplace proposal
};

// The grid and integer variance for Gaussian noise of standard deviation at least
// noise_multiplier * (sensitivity + roundings * grid * sqrt(dim) / 2) on `dim` coordinates:
// `roundings` values, each rounded to the grid (moving it by at most grid * sqrt(dim) / 2 in L2),
// may differ between neighbouring inputs. One for a value rounded once (the default); DP-SGD's
// exact sum of K separately rounded chunk sums passes 2K (models/dp_sgd.h).
struct NoiseGrid {
  int exponent = 0;       // grid = 2^exponent
  uint64_t variance = 0;  // s, in grid units squared
  double grid() const;    // 2^exponent
  double stddev() const;  // sqrt(s) * grid: the actual standard deviation in value units
};
// InvalidArgument unless noise_multiplier > 0, sensitivity > 0, dim >= 1, roundings in [1, 2^40]
// (all finite), and also when noise_multiplier * roundings * sqrt(dim) / 2 > 2^23 (the grid
// rounding would rival the noise) or the grid would fall outside [2^-1000, 2^1000].
StatusOr<NoiseGrid> NoiseGridFor(double noise_multiplier, double sensitivity, int64_t dim,
                                 int64_t roundings = 1);

// values[i] <- (round_half_even(values[i] / g) + k_i) * g, k_i ~ N_Z(0, s), rounded to float.
// `grid` from NoiseGridFor with the same dim as values.size() (or larger when noising a model
// in several spans). InvalidArgument for a non-finite value or one whose grid units exceed 2^62
// (naming the index), or for an invalid grid; values are then unchanged. The rounding to float
// is post-processing (a result beyond the float range becomes +-inf).
Status AddDiscreteGaussianNoise(std::span<float> values, const NoiseGrid& grid,
                                NoiseSource& source);

}  // namespace huddle::privacy
