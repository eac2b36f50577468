#include "aggregation/secagg/quantize.h"

#include <cmath>

namespace huddle::aggregation::secagg {

namespace {

constexpr double kMaxNoiseVariance = 4503599627370496.0;  // 2^52: privacy/noise.h's sampler

uint64_t Mask(int bits) { return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1; }

// T with d * 2 exp(-T^2 / 2) <= 2^-64.
double TailFactor(int64_t dim) {
  return std::sqrt(2 * (64 * std::log(2.0) + std::log(2.0 * static_cast<double>(dim))));
}

}  // namespace

double QuantizePlan::Scale() const { return std::ldexp(1.0, scale_exponent); }

double GridSensitivity(double clip_norm, int scale_exponent, int64_t dim) {
  return std::ldexp(clip_norm, scale_exponent) + std::sqrt(static_cast<double>(dim));
}

StatusOr<QuantizePlan> PlanQuantization(const QuantizeRequest& r) {
  if (!(r.clip_norm > 0) || !std::isfinite(r.clip_norm) || r.members < 1 || r.dim < 1 ||
      !(r.noise_multiplier >= 0) || !std::isfinite(r.noise_multiplier) ||
      !(r.value_noise_stddev >= 0) || !std::isfinite(r.value_noise_stddev) || r.min_survivors < 1 ||
      r.min_survivors > r.members || (r.bits != 0 && r.bits != 32 && r.bits != 64)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantization for secure aggregation needs a clip norm > 0 (", r.clip_norm,
        "), members >= 1 (", r.members, "), dim >= 1 (", r.dim, "), a noise multiplier >= 0 (",
        r.noise_multiplier, "), min_survivors in [1, members] (", r.min_survivors,
        ") and bits 0, 32 or 64 (", r.bits, ")"));
  }
  const double n = r.members;
  const double tail = TailFactor(r.dim);
  const double value_bound = r.clip_norm + tail * r.value_noise_stddev;  // |a member's value|
  std::string why = "";
  for (int bits : {32, 64}) {
    if (r.bits != 0 && bits != r.bits) continue;
    // The margin covers the floating-point evaluation of the bound.
    const double limit = std::ldexp(1.0, bits - 1) * (1 - 1e-9);
    int e = static_cast<int>(std::floor(std::log2(limit / n / value_bound)));
    for (; e > -1100; --e) {
      const double base = std::ldexp(r.clip_norm, e);
      if (base < std::ldexp(1.0, kMinPrecisionBits)) {
        why = absl::StrCat(bits, "-bit words leave fewer than 2^", kMinPrecisionBits,
                           " steps within the clip norm for ", r.members, " members");
        break;
      }
      QuantizePlan plan;
      plan.bits = bits;
      plan.scale_exponent = e;
      plan.sensitivity = GridSensitivity(r.clip_norm, e, r.dim);
      double variance = 0;
      if (r.noise_multiplier > 0) {
        variance = std::ceil(r.noise_multiplier * r.noise_multiplier * plan.sensitivity *
                             plan.sensitivity / r.min_survivors);
        // Range first: above 2^52 a double no longer holds every integer (variance + 1 could
        // equal variance), and the sampler refuses it. A coarser grid keeps it in range.
        if (!(variance <= kMaxNoiseVariance)) continue;
        // The multiplier as the accountant computes it must come out >= z in floating point too:
        // the ceiling is within a few ulps of that, so a few exact steps of 1 reach it.
        auto enough = [&](double v) {
          return std::sqrt(static_cast<double>(r.min_survivors) * v) / plan.sensitivity >=
                 r.noise_multiplier;
        };
        for (int step = 0; step < 64 && !enough(variance); ++step) variance += 1;
        if (!enough(variance) || variance > kMaxNoiseVariance) continue;
        plan.noise_variance = static_cast<uint64_t>(variance);
      }
      const double bound = n * (std::ldexp(value_bound, e) + 1) + tail * std::sqrt(n * variance);
      if (bound < limit) return plan;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no word width holds the secure sum of ", r.members, " updates of clip norm ", r.clip_norm,
      " and ", r.dim, " coordinates", r.noise_multiplier > 0 ? " with their noise" : "",
      why.empty() ? "" : ": ", why));
}

Status Quantize(std::span<const float> values, int scale_exponent, int bits,
                const std::function<uint64_t()>& random, std::span<uint64_t> out) {
  const uint64_t mask = Mask(bits);
  const double limit = std::ldexp(1.0, 62);
  for (size_t i = 0; i < values.size(); ++i) {
    const double y = std::ldexp(static_cast<double>(values[i]), scale_exponent);
    if (!std::isfinite(y) || std::fabs(y) > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "value ", i, " (", values[i], ") cannot be quantized at 2^", scale_exponent));
    }
    const double lower = std::floor(y);
    const double fraction = y - lower;  // exact (Sterbenz), but for y in (-1, 0): within an ulp
    const double u = static_cast<double>(random() >> 11) * 0x1p-53;
    const int64_t q = static_cast<int64_t>(lower) + (u < fraction ? 1 : 0);
    out[i] = static_cast<uint64_t>(q) & mask;
  }
  return absl::OkStatus();
}

void AddSigned(std::span<const int64_t> k, int bits, std::span<uint64_t> words) {
  const uint64_t mask = Mask(bits);
  for (size_t i = 0; i < k.size(); ++i) words[i] = (words[i] + static_cast<uint64_t>(k[i])) & mask;
}

void Decode(std::span<const uint64_t> words, int bits, int scale_exponent, std::span<float> out) {
  const uint64_t mask = Mask(bits);
  const uint64_t sign = bits == 64 ? uint64_t{1} << 63 : uint64_t{1} << (bits - 1);
  for (size_t i = 0; i < words.size(); ++i) {
    uint64_t w = words[i] & mask;
    if (bits < 64 && (w & sign) != 0) w |= ~mask;  // sign-extend
    out[i] = static_cast<float>(
        std::ldexp(static_cast<double>(static_cast<int64_t>(w)), -scale_exponent));
  }
}

}  // namespace huddle::aggregation::secagg
