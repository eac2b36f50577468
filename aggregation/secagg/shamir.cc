#include "aggregation/secagg/shamir.h"

#include <sodium.h>

#include <algorithm>
#include <set>

#include "common/secure_random.h"

namespace huddle::aggregation::secagg {

namespace {

// Limb l of a secret covers bytes [kLimbStart[l], kLimbStart[l + 1]).
constexpr std::array<size_t, kSecretLimbs + 1> kLimbStart = {0, 7, 14, 21, 28, 32};

uint64_t Reduce(unsigned __int128 x) {
  // x < 2^122: fold the high bits onto the low ones twice (2^61 = 1 mod p).
  uint64_t r = static_cast<uint64_t>(x & kFieldPrime) + static_cast<uint64_t>(x >> 61);
  r = (r & kFieldPrime) + (r >> 61);
  return r >= kFieldPrime ? r - kFieldPrime : r;
}

// A uniformly random element of GF(p): 61 random bits, redrawn in the one case (p itself) outside.
uint64_t RandomElement() {
  for (;;) {
    uint64_t v = 0;
    randombytes_buf(&v, sizeof v);
    v &= kFieldPrime;
    if (v != kFieldPrime) return v;
  }
}

std::array<uint64_t, kSecretLimbs> ToLimbs(const Secret& secret) {
  std::array<uint64_t, kSecretLimbs> limbs{};
  for (size_t l = 0; l < kSecretLimbs; ++l) {
    for (size_t b = kLimbStart[l + 1]; b-- > kLimbStart[l];) limbs[l] = limbs[l] << 8 | secret[b];
  }
  return limbs;
}

Status CheckPoints(std::span<const uint64_t> xs) {
  std::set<uint64_t> seen;
  for (uint64_t x : xs) {
    if (x == 0 || x >= kFieldPrime) {
      return absl::InvalidArgumentError(absl::StrCat("share point ", x, " is outside [1, p)"));
    }
    if (!seen.insert(x).second) {
      return absl::InvalidArgumentError(absl::StrCat("share point ", x, " appears twice"));
    }
  }
  return absl::OkStatus();
}

// The Lagrange weights w_i (i < t) of the first t points for evaluation at `at`:
// f(at) = sum_i w_i f(x_i).
std::vector<uint64_t> LagrangeWeights(std::span<const Share> shares, size_t t, uint64_t at) {
  std::vector<uint64_t> w(t);
  for (size_t i = 0; i < t; ++i) {
    uint64_t num = 1, den = 1;
    for (size_t j = 0; j < t; ++j) {
      if (j == i) continue;
      num = FieldMul(num, FieldSub(at, shares[j].x));
      den = FieldMul(den, FieldSub(shares[i].x, shares[j].x));
    }
    w[i] = FieldMul(num, FieldInverse(den));
  }
  return w;
}

uint64_t Evaluate(std::span<const Share> shares, std::span<const uint64_t> w, size_t limb) {
  uint64_t v = 0;
  for (size_t i = 0; i < w.size(); ++i) v = FieldAdd(v, FieldMul(w[i], shares[i].y[limb]));
  return v;
}

}  // namespace

uint64_t FieldAdd(uint64_t a, uint64_t b) {
  const uint64_t s = a + b;  // < 2^62: no overflow
  return s >= kFieldPrime ? s - kFieldPrime : s;
}

uint64_t FieldSub(uint64_t a, uint64_t b) { return a >= b ? a - b : a + kFieldPrime - b; }

uint64_t FieldMul(uint64_t a, uint64_t b) { return Reduce(static_cast<unsigned __int128>(a) * b); }

uint64_t FieldInverse(uint64_t a) {
  uint64_t result = 1, base = a, e = kFieldPrime - 2;
  while (e != 0) {
    if (e & 1) result = FieldMul(result, base);
    base = FieldMul(base, base);
    e >>= 1;
  }
  return a == 0 ? 0 : result;
}

StatusOr<std::vector<Share>> Split(const Secret& secret, int threshold,
                                   std::span<const uint64_t> xs) {
  if (threshold < 1 || static_cast<size_t>(threshold) > xs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("threshold ", threshold, " for ", xs.size(),
                                                   " shares: it must be in [1, shares]"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckPoints(xs));
  EnsureSodium();
  // coefficients[l][0] is limb l; the others are random. Wiped before returning.
  std::vector<std::array<uint64_t, kSecretLimbs>> coefficients(static_cast<size_t>(threshold));
  coefficients[0] = ToLimbs(secret);
  for (size_t c = 1; c < coefficients.size(); ++c) {
    for (uint64_t& v : coefficients[c]) v = RandomElement();
  }
  std::vector<Share> shares(xs.size());
  for (size_t s = 0; s < xs.size(); ++s) {
    shares[s].x = xs[s];
    for (size_t l = 0; l < kSecretLimbs; ++l) {
      uint64_t v = 0;  // Horner's rule from the highest coefficient
      for (size_t c = coefficients.size(); c-- > 0;) {
        v = FieldAdd(FieldMul(v, xs[s]), coefficients[c][l]);
      }
      shares[s].y[l] = v;
    }
  }
  sodium_memzero(coefficients.data(), coefficients.size() * sizeof coefficients[0]);
  return shares;
}

StatusOr<Secret> Combine(std::span<const Share> shares, int threshold) {
  if (threshold < 1 || shares.size() < static_cast<size_t>(threshold)) {
    return absl::InvalidArgumentError(absl::StrCat(shares.size(), " shares for threshold ",
                                                   threshold, ": at least the threshold needed"));
  }
  std::vector<uint64_t> xs;
  xs.reserve(shares.size());
  for (const Share& s : shares) {
    xs.push_back(s.x);
    for (uint64_t y : s.y) {
      if (y >= kFieldPrime) {
        return absl::InvalidArgumentError(
            absl::StrCat("the share at point ", s.x, " has a value outside the field"));
      }
    }
  }
  HUDDLE_RETURN_IF_ERROR(CheckPoints(xs));
  const size_t t = static_cast<size_t>(threshold);
  const std::vector<uint64_t> at_zero = LagrangeWeights(shares, t, 0);
  for (size_t extra = t; extra < shares.size(); ++extra) {
    const std::vector<uint64_t> w = LagrangeWeights(shares, t, shares[extra].x);
    for (size_t l = 0; l < kSecretLimbs; ++l) {
      if (Evaluate(shares, w, l) != shares[extra].y[l]) {
        return absl::DataLossError(absl::StrCat("the share at point ", shares[extra].x,
                                                " is inconsistent with the shares at the first ", t,
                                                " points"));
      }
    }
  }
  Secret secret{};
  for (size_t l = 0; l < kSecretLimbs; ++l) {
    uint64_t limb = Evaluate(shares, at_zero, l);
    const size_t bytes = kLimbStart[l + 1] - kLimbStart[l];
    if (limb >> (8 * bytes) != 0) {
      return absl::DataLossError(absl::StrCat("the shares do not encode a secret (limb ", l,
                                              " exceeds ", bytes, " bytes)"));
    }
    for (size_t b = kLimbStart[l]; b < kLimbStart[l + 1]; ++b) {
      secret[b] = static_cast<uint8_t>(limb & 0xff);
      limb >>= 8;
    }
  }
  return secret;
}

}  // namespace huddle::aggregation::secagg
