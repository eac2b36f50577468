// From a client's clipped float update to the integers secure aggregation sums, and back.
//
// A value x becomes the integer q = SR(x * 2^e): stochastic rounding (floor(y) + 1 with probability
// y - floor(y), so E[q] = x * 2^e exactly, from uniform random bits the caller supplies: the
// client's CSPRNG), stored modulo 2^bits as two's complement. The coordinator's sum of such words
// decodes (Decode) to the signed integer it stands for, divided by 2^e: the sum of the rounded
// values, exactly, as long as the true sum's magnitude stays below 2^(bits-1). PlanQuantization
// chooses bits and e so that it does, for every input the protocol admits:
//
//   every coordinate of a clipped update has |x| <= C (its L2 norm bounds each coordinate), so a
//   member's word is at most C 2^e + 1 in magnitude, and n members' at most n (C 2^e + 1); with
//   local DP noise of standard deviation s already in the values, C + T s instead of C;
//   with distributed DP each member adds N_Z(0, v) noise (v = noise_variance), whose sum over n
//   members exceeds T sqrt(n v) in any of the d coordinates with probability below 2^-64 (T from
//   the Gaussian tail: d * 2 exp(-T^2 / 2) <= 2^-64, the discrete Gaussian's tail being no
//   heavier);
//   so n (C 2^e + 1) + T sqrt(n v) < 2^(bits-1): e is the largest exponent that keeps it, with
//   32-bit words unless they leave fewer than kMinPrecisionBits bits for C, and then 64.
//
// Distributed DP (noise_multiplier z > 0): the noise must stand against the update's L2
// sensitivity on the integer grid, which rounding can grow: Delta = C 2^e + sqrt(d) (each
// coordinate moves by less than 1). Each of at least m = min_survivors members adds variance
// v = ceil(z^2 Delta^2 / m), so that any m of them sum to at least (z Delta)^2: the accountant's z
// holds with m survivors, and more survivors only add noise.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "common/status.h"

namespace huddle::aggregation::secagg {

inline constexpr int kMinPrecisionBits = 12;  // C 2^e >= 2^12 (4096 steps within the clip norm)

struct QuantizeRequest {
  double clip_norm = 0;         // C > 0: every member's update has L2 norm <= C
  uint32_t members = 0;         // n: the most members whose words can be summed
  int64_t dim = 0;              // d: coordinates of an update
  double noise_multiplier = 0;  // z: distributed DP (0: no noise)
  // Gaussian noise already in the values (local DP: each client noised its clipped update), per
  // coordinate: a member's value is then bounded by C + T * value_noise_stddev (T as above).
  double value_noise_stddev = 0;
  uint32_t min_survivors = 1;  // m: the fewest members whose noise the sum is guaranteed
  int bits = 0;                // 0: choose (32, else 64); or force 32 or 64
};

struct QuantizePlan {
  int bits = 32;
  int scale_exponent = 0;       // e
  uint64_t noise_variance = 0;  // v per member, in grid units squared (0: no noise)
  double sensitivity = 0;       // Delta = C 2^e + sqrt(d), in grid units
  double Scale() const;         // 2^e
};

// Delta = C 2^e + sqrt(d): the L2 norm on the grid of an update of norm <= C after stochastic
// rounding at scale 2^e (each of the d coordinates moves by less than 1).
double GridSensitivity(double clip_norm, int scale_exponent, int64_t dim);

// InvalidArgument for a request out of range, or one no width can hold (the message says why: too
// many members for the clip norm's precision, or noise beyond the exact sampler's range).
StatusOr<QuantizePlan> PlanQuantization(const QuantizeRequest& request);

// out[i] = SR(values[i] * 2^e) mod 2^bits; `random` gives uniform 64-bit words (one per value).
// InvalidArgument for a non-finite value or one whose scaled magnitude exceeds 2^62 (naming the
// index); `out` is then unspecified.
Status Quantize(std::span<const float> values, int scale_exponent, int bits,
                const std::function<uint64_t()>& random, std::span<uint64_t> out);

// words[i] += k_i (mod 2^bits), for signed integers k_i (e.g. discrete Gaussian noise).
void AddSigned(std::span<const int64_t> k, int bits, std::span<uint64_t> words);

// out[i] = signed(words[i]) / 2^e, where signed() reads a word as two's complement in `bits`.
void Decode(std::span<const uint64_t> words, int bits, int scale_exponent, std::span<float> out);

}  // namespace huddle::aggregation::secagg
