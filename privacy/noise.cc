#include "privacy/noise.h"

#include <sodium.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/secure_random.h"
#include "privacy/ledger.h"

namespace huddle::privacy {
namespace {

using u128 = unsigned __int128;

// Domain separation: a seeded key can never coincide with a key derived for another purpose.
constexpr char kSeedDomain[] = "huddle.privacy.NoiseSource.SeededForTesting.v1";

constexpr uint64_t kMaxVariance = uint64_t{1} << 52;

// Largest |k| the sampler returns. Proposals beyond it are rejected, which makes the output
// exactly N_Z(0, s) conditioned on |k| <= kMaxAbs (see DiscreteGaussian::Sample for why that
// differs from N_Z(0, s) by less than 2^-3,000,000 in total variation, and why the bound keeps
// every product in 128 bits).
constexpr uint64_t kMaxAbs = uint64_t{1} << 37;

// floor(sqrt(n)) exactly, for n < 2^64.
uint64_t FloorSqrt(uint64_t n) {
  // The double estimate is within a few units of the answer for n < 2^64; fix it up in integers.
  uint64_t r = static_cast<uint64_t>(std::sqrt(static_cast<double>(n)));
  while (r > 0 && static_cast<u128>(r) * r > n) --r;
  while (static_cast<u128>(r + 1) * (r + 1) <= n) ++r;
  return r;
}

// The exact sampler's randomness, in pieces of a few bits taken from NoiseSource words (most
// of its draws are Bernoulli trials that need a byte, not 64 bits). The bits left in a word when
// a piece does not fit are skipped; they are independent of everything used.
class RandomBits {
 public:
  explicit RandomBits(NoiseSource& source) : source_(source) {}

  // n uniformly random bits, 1 <= n <= 32.
  uint32_t Take(int n) {
    if (left_ < n) {
      word_ = source_.NextU64();
      left_ = 64;
    }
    const uint32_t v = static_cast<uint32_t>(word_ & ((uint64_t{1} << n) - 1));
    word_ >>= n;
    left_ -= n;
    return v;
  }

  // Uniform on [0, n) for 1 <= n <= 2^32 - 1: Lemire's method on 32-bit draws.
  uint32_t UniformBelow(uint32_t n) {
    uint64_t m = uint64_t{Take(32)} * n;
    if (static_cast<uint32_t>(m) < n) {
      const uint32_t threshold = (0u - n) % n;  // 2^32 mod n
      while (static_cast<uint32_t>(m) < threshold) m = uint64_t{Take(32)} * n;
    }
    return static_cast<uint32_t>(m >> 32);
  }

  // Bernoulli(num / den) for 0 <= num <= den, 1 <= den < 2^119.
  //
  // This is the event UniformBelow128(den) < num, evaluated lazily: for a uniform real V in
  // [0, 1), floor(den V) is uniform on [0, den) and floor(den V) < num iff den V < num. V is
  // revealed a byte at a time: with V = (d + V') / 2^8, den V < num iff den V' < r where
  // r = num 2^8 - den d. r <= 0 settles false and r >= den settles true (den V' is in [0, den));
  // only the one byte d = floor(num 2^8 / den) can leave 0 < r < den (probability 2^-8), and then
  // the same comparison continues with num = r. Bounds: num 2^8 and den d are below 2^127.
  bool Bernoulli(u128 num, u128 den) {
    if (num == 0) return false;
    while (num < den) {
      const u128 scaled = num << 8;
      const u128 low = den * Take(8);
      if (low >= scaled) return false;
      const u128 r = scaled - low;
      if (r >= den) return true;
      num = r;
    }
    return true;
  }

 private:
  NoiseSource& source_;
  uint64_t word_ = 0;
  int left_ = 0;
};

// Bernoulli(exp(-1)): CKS Algorithm 1 with gamma = 1; the k = 1 trial always succeeds.
bool BernoulliExpMinusOne(RandomBits& bits) {
  uint64_t k = 2;
  while (bits.Bernoulli(1, k)) ++k;
  return k % 2 == 1;
}

// Bernoulli(exp(-num / den)) for 0 <= num <= den < 2^119 (CKS Algorithm 1, gamma in [0, 1]): the
// index K of the first failure of Bernoulli(gamma / k), k = 1, 2, ..., is odd with probability
// exp(-gamma).
bool BernoulliExpMinusFraction(RandomBits& bits, u128 num, u128 den) {
  if (num == 0) return true;
  // den < 2^b, so den * k < 2^119 for every k < max_k = 2^(119 - b) (no 128-bit division).
  const int b = 128 - ((den >> 64) != 0 ? __builtin_clzll(static_cast<uint64_t>(den >> 64))
                                        : 64 + __builtin_clzll(static_cast<uint64_t>(den) | 1));
  const uint64_t max_k = 119 - b >= 64 ? ~uint64_t{0} : uint64_t{1} << (119 - b);
  uint64_t k = 1;
  while (true) {
    bool success;
    if (k < max_k) {
      success = bits.Bernoulli(num, den * k);
    } else {
      // Bernoulli(a b) = Bernoulli(a) and Bernoulli(b), independent: exact without den * k.
      // (Only reached for k >= 2^13 here: probability below 1/8191!.)
      success = bits.Bernoulli(num, den) && bits.Bernoulli(1, k);
    }
    if (!success) break;
    ++k;
  }
  return k % 2 == 1;
}

// Bernoulli(exp(-num / den)) for any num >= 0 and 1 <= den < 2^119 (CKS Algorithm 1,
// gamma > 1): exp(-gamma) = exp(-1)^floor(gamma) exp(-(gamma - floor(gamma))), independent
// trials.
bool BernoulliExpMinus(RandomBits& bits, u128 num, u128 den) {
  while (num > den) {
    if (!BernoulliExpMinusOne(bits)) return false;
    num -= den;
  }
  return BernoulliExpMinusFraction(bits, num, den);
}

// A draw of the discrete Laplace distribution P(y) proportional to exp(-|y| / t) (CKS
// Algorithm 2, with the geometric magnitude sampled as u + t v: u in [0, t) with weight
// exp(-u / t) by rejection, v ~ Geometric(1 - exp(-1))), or false when |y| would exceed kMaxAbs:
// the caller then rejects and draws again. Needs 1 <= t <= 2^26 + 1.
bool DiscreteLaplace(RandomBits& bits, uint32_t t, int64_t* out) {
  while (true) {
    uint32_t u;
    do {
      u = bits.UniformBelow(t);
    } while (!BernoulliExpMinusFraction(bits, u, t));
    // v counts exp(-1) successes; once v t + u would pass kMaxAbs the draw is rejected whatever
    // v ends up being, so stop counting there (exact, and no overflow).
    const uint64_t max_v = (kMaxAbs - u) / t;
    uint64_t v = 0;
    while (BernoulliExpMinusOne(bits)) {
      if (++v > max_v) return false;
    }
    const uint64_t magnitude = v * t + u;  // <= kMaxAbs
    const bool negative = bits.Take(1) != 0;
    if (negative && magnitude == 0) continue;  // -0 would count 0 twice
    *out = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
    return true;
  }
}

// Round half to even of a finite double, independent of the FP rounding mode. u - floor(u) is
// exact for |u| >= 1/2 (Sterbenz); for u in (-1/2, 0) it may round up to 1/2 or 1, and both
// outcomes still give the right answer 0 (floor = -1 is odd).
double RoundHalfEven(double u) {
  const double f = std::floor(u);
  const double d = u - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

}  // namespace

// ---- NoiseSource -------------------------------------------------------------------------------

NoiseSource::NoiseSource(const unsigned char* key, bool is_private) : private_(is_private) {
  std::memcpy(key_, key, sizeof(key_));
}

NoiseSource NoiseSource::Secure() {
  EnsureSodium();
  unsigned char key[sizeof(key_)];
  randombytes_buf(key, sizeof(key));
  NoiseSource source(key, /*is_private=*/true);
  sodium_memzero(key, sizeof(key));
  return source;
}

NoiseSource NoiseSource::SeededForTesting(uint64_t seed) {
  EnsureSodium();
  unsigned char message[sizeof(kSeedDomain) + 8];
  std::memcpy(message, kSeedDomain, sizeof(kSeedDomain));  // includes the terminating NUL
  for (int i = 0; i < 8; ++i) {
    message[sizeof(kSeedDomain) + i] = static_cast<unsigned char>(seed >> (8 * i));
  }
  unsigned char key[sizeof(key_)];
  crypto_generichash(key, sizeof(key), message, sizeof(message), nullptr, 0);
  NoiseSource source(key, /*is_private=*/false);
  sodium_memzero(key, sizeof(key));
  return source;
}

NoiseSource NoiseSource::FromSharedKey(const std::array<unsigned char, 32>& key, bool is_private) {
  return NoiseSource(key.data(), is_private);
}

// A moved-from source has a zero key and an empty buffer, and reports itself as not private (its
// stream would be predictable); it may only be destroyed or assigned.
NoiseSource::NoiseSource(NoiseSource&& other) noexcept
    : nonce_(other.nonce_), used_(other.used_), private_(other.private_) {
  std::memcpy(key_, other.key_, sizeof(key_));
  std::memcpy(buffer_, other.buffer_, sizeof(buffer_));
  sodium_memzero(other.key_, sizeof(other.key_));
  sodium_memzero(other.buffer_, sizeof(other.buffer_));
  other.used_ = sizeof(other.buffer_);
  other.private_ = false;
}

NoiseSource& NoiseSource::operator=(NoiseSource&& other) noexcept {
  if (this == &other) return *this;
  std::memcpy(key_, other.key_, sizeof(key_));
  std::memcpy(buffer_, other.buffer_, sizeof(buffer_));
  nonce_ = other.nonce_;
  used_ = other.used_;
  private_ = other.private_;
  sodium_memzero(other.key_, sizeof(other.key_));
  sodium_memzero(other.buffer_, sizeof(other.buffer_));
  other.used_ = sizeof(other.buffer_);
  other.private_ = false;
  return *this;
}

NoiseSource::~NoiseSource() {
  sodium_memzero(key_, sizeof(key_));
  sodium_memzero(buffer_, sizeof(buffer_));
}

std::string NoiseSource::Describe() const {
  return private_ ? kNoiseOsCsprng : "seeded (NOT PRIVATE)";
}

// Each refill is one ChaCha20 (IETF) call under a nonce used once: nonce_ counts refills. The
// 32-bit block counter covers 64 blocks per call, far from wrapping.
void NoiseSource::Refill() {
  static_assert(sizeof(buffer_) % 8 == 0 && sizeof(buffer_) <= 64ull << 32);
  unsigned char nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {};
  for (int i = 0; i < 8; ++i) nonce[i] = static_cast<unsigned char>(nonce_ >> (8 * i));
  ++nonce_;
  crypto_stream_chacha20_ietf(buffer_, sizeof(buffer_), nonce, key_);
  used_ = 0;
}

uint64_t NoiseSource::NextU64() {
  if (used_ == sizeof(buffer_)) Refill();
  uint64_t v;
  std::memcpy(&v, buffer_ + used_, sizeof(v));
  used_ += sizeof(v);
  return v;
}

// Lemire's nearly-divisionless method: x * n / 2^64 for uniform x, rejecting the low words below
// 2^64 mod n, is exactly uniform on [0, n).
uint64_t NoiseSource::UniformBelow(uint64_t n) {
  if (n <= 1) return 0;
  u128 m = static_cast<u128>(NextU64()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (low < threshold) {
      m = static_cast<u128>(NextU64()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

// Mask and reject: a uniform value on the bit length of n - 1 is below n with probability > 1/2.
// The high word is drawn first and a draw already above n's high word is rejected early; the
// accepted values are uniform on [0, n) all the same.
u128 NoiseSource::UniformBelow128(u128 n) {
  constexpr u128 k2To64 = static_cast<u128>(1) << 64;
  if (n < k2To64) return UniformBelow(static_cast<uint64_t>(n));
  if (n == k2To64) return NextU64();
  const uint64_t n_high = static_cast<uint64_t>((n - 1) >> 64);  // >= 1
  const uint64_t n_low = static_cast<uint64_t>(n);
  const uint64_t mask = ~uint64_t{0} >> __builtin_clzll(n_high);
  while (true) {
    const uint64_t high = NextU64() & mask;
    if (high > static_cast<uint64_t>(n >> 64)) continue;
    const uint64_t low = NextU64();
    if (high < static_cast<uint64_t>(n >> 64) || low < n_low) {
      return (static_cast<u128>(high) << 64) | low;
    }
  }
}

// ---- DiscreteGaussian --------------------------------------------------------------------------

DiscreteGaussian::DiscreteGaussian(uint64_t variance)
    : variance_(variance), t_(FloorSqrt(variance) + 1) {}

StatusOr<DiscreteGaussian> DiscreteGaussian::Create(uint64_t variance) {
  if (variance < 1 || variance > kMaxVariance) {
    return absl::InvalidArgumentError(
        fmt::format("discrete Gaussian variance must be in [1, 2^52], got {}", variance));
  }
  return DiscreteGaussian(variance);
}

// CKS 2020 Algorithm 3: Y ~ discrete Laplace of scale t = floor(sqrt(s)) + 1, accepted with
// probability exp(-(|Y| - s/t)^2 / (2s)) = exp(-num / den) with
//   num = (|Y| t - s)^2,  den = 2 s t^2  (multiply through by t^2: integers only).
// Bounds, for 1 <= s <= 2^52 and |Y| <= kMaxAbs = 2^37:
//   t <= 2^26 + 1, so |Y| t <= 2^63 + 2^37 < 2^64, and |Y| t - s lies in (-2^52, 2^64): its
//   square num < 2^128 fits unsigned __int128;
//   den = 2 s t^2 <= 2^53 (2^26 + 1)^2 < 2^106. RandomBits::Bernoulli needs its denominator
//   below 2^119 (so that num 2^8 and den d stay below 2^127); BernoulliExpMinusFraction checks
//   den * k against 2^119 and beyond it uses a product of two Bernoullis instead;
//   BernoulliExpMinus only subtracts den from num.
// Truncation: a proposal with |Y| > 2^37 is rejected (DiscreteLaplace returns false). Rejection
// sampling from a truncated proposal yields the target truncated the same way, so the output is
// exactly N_Z(0, s) conditioned on |k| <= 2^37. The mass removed is at most
//   2 sum_{k > M} exp(-k^2 / 2s) <= 2 exp(-M^2 / 2s) / (1 - exp(-M / 2s)) <= 2^18 exp(-2^21)
// for M = 2^37, s <= 2^52 (the normaliser is >= 1): below 2^-3,000,000. Such a Y would also be
// accepted with probability below exp(-2^20) < 2^-1000 if it were kept.
int64_t DiscreteGaussian::Sample(NoiseSource& source) const {
  const u128 s = variance_;
  const u128 t = t_;
  const u128 den = 2 * s * t * t;
  RandomBits bits(source);
  while (true) {
    int64_t y;
    if (!DiscreteLaplace(bits, static_cast<uint32_t>(t_), &y)) continue;
    const u128 yt = static_cast<u128>(y < 0 ? -y : y) * t;
    const u128 diff = yt >= s ? yt - s : s - yt;
    if (BernoulliExpMinus(bits, diff * diff, den)) return y;
  }
}

// ---- Grid --------------------------------------------------------------------------------------

double NoiseGrid::grid() const { return std::ldexp(1.0, exponent); }
double NoiseGrid::stddev() const { return std::sqrt(static_cast<double>(variance)) * grid(); }

namespace {
constexpr double k2To23 = 8388608.0;   // 2^23
constexpr double k2To24 = 16777216.0;  // 2^24
constexpr int kMaxGridExponent = 1000;
}  // namespace

StatusOr<NoiseGrid> NoiseGridFor(double noise_multiplier, double sensitivity, int64_t dim,
                                 int64_t roundings) {
  const double z = noise_multiplier;
  if (!std::isfinite(z) || !(z > 0)) {
    return absl::InvalidArgumentError(
        fmt::format("noise multiplier must be finite and > 0, got {}", z));
  }
  if (!std::isfinite(sensitivity) || !(sensitivity > 0)) {
    return absl::InvalidArgumentError(
        fmt::format("sensitivity must be finite and > 0, got {}", sensitivity));
  }
  if (dim < 1) {
    return absl::InvalidArgumentError(fmt::format("dimension must be >= 1, got {}", dim));
  }
  if (roundings < 1 || roundings > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        fmt::format("roundings must be in [1, 2^40], got {}", roundings));
  }
  // In grid units the noise must be at least r(e) = z * sensitivity / 2^e + c, with the rounding
  // term c = z * roundings * sqrt(dim) / 2 independent of e. r decreases to c as e grows;
  // c <= 2^23 leaves room for r >= 2^24 at a finite e, with z * sensitivity / 2^e >= 2^23 (a
  // normal double). roundings <= 2^40 converts to double exactly.
  const double c = z * static_cast<double>(roundings) * std::sqrt(static_cast<double>(dim)) / 2;
  if (!(c <= k2To23)) {
    return absl::InvalidArgumentError(fmt::format(
        "noise multiplier {} x {} rounding(s) x sqrt(dimension {}) / 2 = {} exceeds 2^23: the "
        "grid rounding alone would exceed the noise",
        z, roundings, dim, c));
  }
  const double p = z * sensitivity;
  if (!std::isfinite(p) || p < DBL_MIN) {
    return absl::InvalidArgumentError(
        fmt::format("noise multiplier {} x sensitivity {} is out of range", z, sensitivity));
  }
  const auto r = [&](int e) { return std::ldexp(p, -e) + c; };  // monotone decreasing in e
  // ldexp(p, -e) in [2^24, 2^25), so r(e) >= 2^24; then move up to the largest such e (at most
  // one step: r(e + 2) < 2^22 + 2^23).
  int e = std::ilogb(p) - 24;
  while (r(e) < k2To24) --e;
  while (r(e + 1) >= k2To24) ++e;
  if (e < -kMaxGridExponent || e > kMaxGridExponent) {
    return absl::InvalidArgumentError(
        fmt::format("noise grid 2^{} for noise multiplier {} and sensitivity {} is out of range", e,
                    z, sensitivity));
  }
  // s >= (z * (sensitivity + roundings 2^e sqrt(dim) / 2) / 2^e)^2 = r_true^2, exactly. With
  // u = 2^-53: p = z * sensitivity (1 + d1), sqrt(double(dim)) = sqrt(dim) (1 + d2) with
  // |d2| <= 1.5u, c = (z roundings sqrt(dim) / 2)(1 + d2)(1 + d3)(1 + d4) (the product with
  // z and the one with roundings; / 2 exact), ldexp exact (normal result), the sum one more
  // rounding: r_hat >= r_true (1 - 5.1u). r_up = r_hat (1 + 2^-49) rounded >= r_hat (1 + 16u)
  // (1 - u), and r_up^2 rounded >= r_up^2 (1 - u); together r_up^2 (rounded) >= r_true^2
  // (1 + 18u) > r_true^2. The excess over r_true^2 is below 2^-47 relative plus the ceiling:
  // negligible extra noise.
  const double r_hat = r(e);
  const double r_up = r_hat * (1 + 0x1p-49);
  uint64_t s = static_cast<uint64_t>(std::ceil(r_up * r_up));
  // Defensive second opinion in wider arithmetic (never moves s if the bound above holds).
  const long double r_wide = std::ldexp(static_cast<long double>(z) * sensitivity, -e) +
                             static_cast<long double>(z) * static_cast<long double>(roundings) *
                                 std::sqrt(static_cast<long double>(dim)) / 2;
  while (static_cast<long double>(s) < r_wide * r_wide) ++s;
  if (s < 1 || s > kMaxVariance) {  // r < 2^25 keeps s <= 2^50 + small
    return absl::InternalError(fmt::format("noise variance {} out of range", s));
  }
  NoiseGrid grid;
  grid.exponent = e;
  grid.variance = s;
  return grid;
}

Status AddDiscreteGaussianNoise(std::span<float> values, const NoiseGrid& grid,
                                NoiseSource& source) {
  if (grid.exponent < -kMaxGridExponent || grid.exponent > kMaxGridExponent) {
    return absl::InvalidArgumentError(
        fmt::format("noise grid exponent {} out of range", grid.exponent));
  }
  HUDDLE_ASSIGN_OR_RETURN(const DiscreteGaussian gaussian, DiscreteGaussian::Create(grid.variance));
  const double g = std::ldexp(1.0, grid.exponent);
  const double inverse_g = std::ldexp(1.0, -grid.exponent);  // exact: a power of two
  constexpr double kMaxUnits = 4611686018427387904.0;        // 2^62
  // Validate everything before changing anything.
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          fmt::format("cannot add noise: value at index {} is not finite ({})", i, v));
    }
    // v * 2^-e is exact unless it overflows (then inf > 2^62) or underflows (then it rounds to 0
    // on the grid anyway).
    if (std::fabs(static_cast<double>(v) * inverse_g) > kMaxUnits) {
      return absl::InvalidArgumentError(
          fmt::format("cannot add noise: value at index {} ({}) exceeds 2^62 units of the noise "
                      "grid 2^{}",
                      i, v, grid.exponent));
    }
  }
  // |units| <= 2^62 and |k| <= 2^37: the int64 sum cannot overflow.
  for (float& v : values) {
    const int64_t units = static_cast<int64_t>(RoundHalfEven(static_cast<double>(v) * inverse_g));
    const int64_t noised = units + gaussian.Sample(source);
    v = static_cast<float>(static_cast<double>(noised) * g);
  }
  return absl::OkStatus();
}

}  // namespace huddle::privacy
