// Shamir secret sharing of 32-byte secrets, for secure aggregation (aggregation/secagg/).
//
// A secret (a key or a seed: 32 bytes) is cut into kSecretLimbs limbs, each an element of the prime
// field GF(p), p = 2^61 - 1 (a Mersenne prime, so that reduction is two shifts and an add): four
// limbs of 7 bytes and one of 4, little-endian. Each limb is the constant term of its own random
// polynomial of degree threshold - 1 over GF(p); the share for the point x in [1, p) is the value
// of every limb's polynomial at x. Any `threshold` shares with distinct points give the secret back
// by Lagrange interpolation at 0; fewer reveal nothing about it (every limb's value is then
// uniformly distributed given them), provided the coefficients are uniform and secret: they come
// from the OS CSPRNG (libsodium's randombytes) and are wiped (sodium_memzero) after use.
//
// Combine checks what it is given: with more shares than the threshold it interpolates from the
// first `threshold` and requires every other share to lie on the same polynomials, so that a
// corrupted or forged share is found (DataLoss naming its point) instead of silently changing the
// secret; and the limbs of the result must be in their byte ranges.
//
// Thread-safety: pure functions (randomness from the thread-safe OS CSPRNG).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace huddle::aggregation::secagg {

inline constexpr uint64_t kFieldPrime = (uint64_t{1} << 61) - 1;
inline constexpr size_t kSecretBytes = 32;
inline constexpr size_t kSecretLimbs = 5;  // 4 x 7 bytes + 4 bytes

using Secret = std::array<uint8_t, kSecretBytes>;

// One share: the point x and the value of each limb's polynomial there, each in [0, p).
struct Share {
  uint64_t x = 0;
  std::array<uint64_t, kSecretLimbs> y{};
  bool operator==(const Share&) const = default;
};

// Arithmetic in GF(p); operands in [0, p).
uint64_t FieldAdd(uint64_t a, uint64_t b);
uint64_t FieldSub(uint64_t a, uint64_t b);
uint64_t FieldMul(uint64_t a, uint64_t b);
// a^-1 for a != 0 (a^(p-2)); 0 for a == 0.
uint64_t FieldInverse(uint64_t a);

// The shares of `secret` at the points `xs`, in their order. InvalidArgument unless 1 <= threshold
// <= xs.size() and the points are distinct and in [1, p).
StatusOr<std::vector<Share>> Split(const Secret& secret, int threshold,
                                   std::span<const uint64_t> xs);

// The secret from at least `threshold` shares with distinct points. InvalidArgument for fewer
// shares, repeated or out-of-range points, or values outside the field; DataLoss when the shares
// are inconsistent (a share beyond the first `threshold` is not on their polynomials, or the limbs
// fall outside their byte ranges: shares of something else, or corrupted).
StatusOr<Secret> Combine(std::span<const Share> shares, int threshold);

}  // namespace huddle::aggregation::secagg
