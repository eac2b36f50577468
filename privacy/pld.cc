// Privacy loss distributions of the subsampled Gaussian: construction and composition.
#include "privacy/internal/pld.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <string>
#include <vector>

#include "privacy/internal/math.h"

namespace huddle::privacy::internal {
namespace {

using Complex = std::complex<double>;

// Plain complex product (std::complex's operator* takes a slow NaN-recovery path at -O2).
inline Complex Mul(Complex a, Complex b) {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}

Complex Power(Complex base, int64_t n) {
  Complex result(1.0, 0.0);
  while (n > 0) {
    if (n & 1) result = Mul(result, base);
    n >>= 1;
    if (n > 0) base = Mul(base, base);
  }
  return result;
}

int64_t NextPowerOfTwo(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// `length` is a double: it may be beyond int64, infinite or NaN (from an overflowed loss).
Status TooLarge(double length) {
  std::string needs = "an unbounded grid";
  if (std::isfinite(length)) {
    needs = length < 1e15 ? fmt::format("{:.0f} grid points", length)
                          : fmt::format("{:.3g} grid points", length);
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "the privacy loss distribution needs ", needs, " (more than ", kMaxPldLength,
      "): use a larger noise multiplier, fewer steps, a larger value_discretization_interval "
      "or the RDP accountant"));
}

Status LossOutOfRange() {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the privacy loss distribution's losses pass ", kMaxPldLossIndex,
      " grid steps: use fewer steps, a larger value_discretization_interval or the RDP "
      "accountant"));
}

// A loss index (lower_loss, or lower_loss + length) within +-kMaxPldLossIndex.
bool IndexInRange(double index) {
  return std::fabs(index) <= static_cast<double>(kMaxPldLossIndex);
}

bool Stopped(const std::atomic<bool>* stop) {
  return stop != nullptr && stop->load(std::memory_order_relaxed);
}

Status Cancelled() { return absl::CancelledError("privacy accounting stopped"); }

// True every 2^16 iterations of a loop over `i`, where it should look at the stop flag.
constexpr bool CheckNow(uint64_t i) { return (i & 0xFFFF) == 0; }

// math.isclose(a, b) with its default rel_tol = 1e-9, as dp_accounting uses it.
bool IsClose(double a, double b) {
  return a == b || std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b));
}

// The privacy loss and its inverse for REMOVE adjacency (dp_accounting's AdditiveNoisePrivacyLoss
// and GaussianPrivacyLoss with sensitivity 1); ADD is the mirror image: loss_add(x) =
// -loss_remove(-x).
struct GaussianLoss {
  double q, sigma;

  double Remove(double x) const {
    const double without = (-0.5 - x) / (sigma * sigma);
    if (q == 1) return without;
    if (without == 0) return std::log(q + (1 - q));
    return LogAddExp(std::log(q) + without, std::log1p(-q));  // log(q e^without + 1 - q)
  }
  double Add(double x) const { return -Remove(-x); }

  // log(e^b / q + 1 - 1 / q): the loss without subsampling whose subsampled loss is b.
  double Unsample(double b) const {
    if (b == 0) return 0;
    const double d = b - std::log(q);
    // log(1 / q - 1), also where 1 / q overflows (a subnormal q)
    const double log_odds = std::isinf(1 / q) ? std::log1p(-q) - std::log(q) : std::log(1 / q - 1);
    return d + std::log1p(-std::exp(log_odds - d));
  }
  // Largest x whose loss is >= epsilon.
  double InverseRemove(double epsilon) const {
    if (q == 1) return -0.5 - epsilon * sigma * sigma;
    if (IsClose(epsilon, std::log1p(-q))) return kInf;
    return -0.5 - Unsample(epsilon) * sigma * sigma;
  }
  double InverseAdd(double epsilon) const {
    if (IsClose(epsilon, -std::log1p(-q))) return -kInf;
    return 0.5 + Unsample(-epsilon) * sigma * sigma;
  }
};

}  // namespace

double SubsampledGaussianHockeyStick(double q, double sigma, bool add, double epsilon) {
  const GaussianLoss loss{q, sigma};
  double delta;
  if (!add || q == 1) {
    if (q < 1 && epsilon <= std::log1p(-q)) return std::min(1.0, -std::expm1(epsilon));
    const double x = loss.InverseRemove(epsilon);
    const double upper_cdf =
        q == 1 ? Ndtr((x + 1) / sigma) : (1 - q) * Ndtr(x / sigma) + q * Ndtr((x + 1) / sigma);
    delta = upper_cdf - std::exp(epsilon + LogNdtr(x / sigma));
  } else {
    if (epsilon >= -std::log1p(-q)) return 0;
    const double x = loss.InverseAdd(epsilon);
    const double lower_log_cdf =
        LogAddExp(std::log1p(-q) + LogNdtr(x / sigma), std::log(q) + LogNdtr((x - 1) / sigma));
    delta = Ndtr(x / sigma) - std::exp(epsilon + lower_log_cdf);
  }
  return std::clamp(delta, 0.0, 1.0);
}

namespace {

// Pessimistic connect-the-dots PMF on the grid epsilon_i = i * d, i in [lo, hi] (dp_accounting's
// create_pmf_pessimistic_connect_dots_fixed_gap).
StatusOr<PldPmf> ConnectTheDots(double q, double sigma, bool add, double d,
                                const std::atomic<bool>* stop) {
  const GaussianLoss loss{q, sigma};
  // Truncate the noise where its CDF is exp(-50) / 2 on each side; the remove direction's upper
  // distribution is also shifted left by the sensitivity, the add direction's lower one right.
  double lower_x = sigma * NdtriFromLog(std::log(0.5) - 50);
  double upper_x = -lower_x;
  if (add) {
    upper_x += 1;
  } else {
    lower_x -= 1;
  }
  const double eps_upper = add ? loss.Add(lower_x) : loss.Remove(lower_x);
  const double eps_lower = add ? loss.Add(upper_x) : loss.Remove(upper_x);
  const double lo_d = std::floor(eps_lower / d);
  const double hi_d = std::ceil(eps_upper / d);
  if (!(hi_d - lo_d + 1 <= static_cast<double>(kMaxPldLength))) return TooLarge(hi_d - lo_d + 1);
  if (!IndexInRange(lo_d) || !IndexInRange(hi_d)) return LossOutOfRange();
  const auto lo = static_cast<int64_t>(lo_d);
  const auto n = static_cast<size_t>(static_cast<int64_t>(hi_d) - lo + 1);
  std::vector<double> deltas(n);
  for (size_t i = 0; i < n; ++i) {
    if (CheckNow(i) && Stopped(stop)) return Cancelled();
    deltas[i] = SubsampledGaussianHockeyStick(
        q, sigma, add, static_cast<double>(lo + static_cast<int64_t>(i)) * d);
    if (std::isnan(deltas[i])) {
      return absl::InternalError(
          absl::StrCat("the hockey-stick divergence of the Gaussian with q = ", q,
                       ", sigma = ", sigma, " is NaN"));
    }
    if (i > 0) deltas[i] = std::min(deltas[i], deltas[i - 1]);  // enforce monotonicity
  }
  PldPmf pmf;
  pmf.discretization = d;
  pmf.lower_loss = lo;
  pmf.infinity_mass = deltas.back();
  pmf.probs.assign(n, 0.0);
  if (n == 1) {
    pmf.probs[0] = 1 - deltas[0];
    return pmf;
  }
  // With D_i = delta_{i+1} - delta_i: p_0 = 1 - delta_0 + D_0 / (e^d - 1),
  // p_i = (D_i - e^d D_{i-1}) / (e^d - 1), p_{n-1} = D_{n-2} / (e^-d - 1); clamped at 0.
  const double em1 = std::expm1(d);
  const double ed = std::exp(d);
  pmf.probs[0] = 1 - deltas[0] + (deltas[1] - deltas[0]) / em1;
  for (size_t i = 1; i + 1 < n; ++i) {
    pmf.probs[i] = ((deltas[i + 1] - deltas[i]) - (deltas[i] - deltas[i - 1]) * ed) / em1;
  }
  pmf.probs[n - 1] = (deltas[n - 1] - deltas[n - 2]) / std::expm1(-d);
  for (double& p : pmf.probs) p = std::max(0.0, p);
  return pmf;
}

// Keeps the longest prefix and suffix each of mass <= tail / 2 out: the prefix's mass moves to the
// first kept point (a smaller loss would only lower delta), the suffix's to +infinity.
void TruncateTails(PldPmf& pmf, double tail) {
  if (tail <= 0) return;
  const std::vector<double>& p = pmf.probs;
  const size_t n = p.size();
  size_t left = 0;
  double s = 0;
  while (left < n && (s += p[left]) <= tail / 2) ++left;
  size_t suffix = 0;
  s = 0;
  while (suffix < n && (s += p[n - 1 - suffix]) <= tail / 2) ++suffix;
  size_t right = std::max(n - suffix, left + 1);
  if (right > n) right = n;
  if (left >= n) left = n - 1;
  double left_mass = 0;
  for (size_t i = 0; i < left; ++i) left_mass += p[i];
  double right_mass = 0;
  for (size_t i = right; i < n; ++i) right_mass += p[i];
  std::vector<double> kept(p.begin() + static_cast<std::ptrdiff_t>(left),
                           p.begin() + static_cast<std::ptrdiff_t>(right));
  kept[0] += left_mass;
  pmf.probs = std::move(kept);
  pmf.lower_loss += static_cast<int64_t>(left);
  pmf.infinity_mass += right_mass;
}

}  // namespace

StatusOr<Pld> SubsampledGaussianPld(double q, double sigma, double discretization,
                                    const std::atomic<bool>* stop) {
  Pld pld;
  HUDDLE_ASSIGN_OR_RETURN(pld.remove, ConnectTheDots(q, sigma, false, discretization, stop));
  if (q < 1) {
    HUDDLE_ASSIGN_OR_RETURN(PldPmf add, ConnectTheDots(q, sigma, true, discretization, stop));
    pld.add = std::move(add);
  }
  return pld;
}

void Fft(std::vector<Complex>& data, bool inverse) { Fft(data, inverse, nullptr).IgnoreError(); }

Status Fft(std::vector<Complex>& data, bool inverse, const std::atomic<bool>* stop) {
  const size_t n = data.size();
  if (n <= 1) return absl::OkStatus();
  for (size_t i = 1, j = 0; i < n; ++i) {  // bit-reversal permutation
    size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(data[i], data[j]);
  }
  // Twiddles exp(-+2 pi i k / n) computed directly (no recurrence), so each is exact to ~1 ulp.
  std::vector<Complex> twiddle(n / 2);
  const double sign = inverse ? 1.0 : -1.0;
  for (size_t k = 0; k < n / 2; ++k) {
    if (CheckNow(k) && Stopped(stop)) return Cancelled();
    const double angle = sign * 2.0 * M_PI * static_cast<double>(k) / static_cast<double>(n);
    twiddle[k] = {std::cos(angle), std::sin(angle)};
  }
  for (size_t len = 2; len <= n; len <<= 1) {
    if (Stopped(stop)) return Cancelled();  // a stage: n / 2 butterflies, ~50 ms at 2^24
    const size_t half = len / 2;
    const size_t stride = n / len;
    for (size_t start = 0; start < n; start += len) {
      for (size_t j = 0; j < half; ++j) {
        const Complex u = data[start + j];
        const Complex v = Mul(data[start + j + half], twiddle[j * stride]);
        data[start + j] = u + v;
        data[start + j + half] = u - v;
      }
    }
  }
  if (inverse) {
    const double scale = 1.0 / static_cast<double>(n);
    for (Complex& c : data) c *= scale;
  }
  return absl::OkStatus();
}

StatusOr<PldPmf> SelfCompose(const PldPmf& pmf, int64_t times, double tail_mass_truncation,
                             const std::atomic<bool>* stop) {
  if (times <= 0) return PldPmf{pmf.discretization, 0, {1.0}, 0.0};
  const auto n = static_cast<int64_t>(pmf.probs.size());
  // Output window [lb, ub] (in index units of the T-fold sum) from Chernoff bounds at 40 orders
  // t = +-k / n, k = 1..20: P[S >= b] <= exp(T log MGF(t) - t b) <= tail / 2 (common.py).
  double ub = static_cast<double>(n - 1) * static_cast<double>(times);
  double lb = 0;
  if (tail_mass_truncation > 0) {
    double max_p = 0;
    for (double p : pmf.probs) max_p = std::max(max_p, p);
    for (int k = -20; k <= 20; ++k) {
      if (k == 0) continue;
      const double order = static_cast<double>(k) / static_cast<double>(n);
      double max_exp = -kInf;
      for (int64_t i = 0; i < n; ++i) {
        if (CheckNow(static_cast<uint64_t>(i)) && Stopped(stop)) return Cancelled();
        if (pmf.probs[static_cast<size_t>(i)] > 0) {
          max_exp = std::max(max_exp, static_cast<double>(i) * order);
        }
      }
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (CheckNow(static_cast<uint64_t>(i)) && Stopped(stop)) return Cancelled();
        const double p = pmf.probs[static_cast<size_t>(i)];
        if (p > 0) sum += p * std::exp(static_cast<double>(i) * order - max_exp);
      }
      const double log_mgf = max_exp + std::log(sum);
      const double bound =
          (static_cast<double>(times) * log_mgf + std::log(2 / tail_mass_truncation)) / order;
      if (!std::isfinite(bound)) continue;
      if (order > 0) ub = std::min(ub, std::ceil(bound));
      if (order < 0) lb = std::max(lb, std::floor(bound));
    }
  }
  const double out_len_d = ub - lb + 1;
  if (!(out_len_d <= static_cast<double>(kMaxPldLength))) return TooLarge(out_len_d);
  if (!(out_len_d >= 1)) {  // only for a PMF whose finite mass is far below 1
    return absl::InternalError("the self-composition's Chernoff window is empty");
  }
  // The output's lowest loss index, lower_loss * times + lb, and its highest must stay in range
  // (a huge `times` of a narrow PMF: the window is small but far out).
  const double lower_d = static_cast<double>(pmf.lower_loss) * static_cast<double>(times) + lb;
  if (!IndexInRange(lb) || !IndexInRange(lower_d) || !IndexInRange(lower_d + out_len_d)) {
    return LossOutOfRange();
  }
  const auto out_len = static_cast<int64_t>(out_len_d);
  const int64_t length = NextPowerOfTwo(std::max(out_len, n));
  if (length > kMaxPldLength) return TooLarge(static_cast<double>(length));
  // Circular convolution of length `length`: mass outside [lb, ub] (<= tail) aliases into it.
  std::vector<Complex> freq(static_cast<size_t>(length));
  for (int64_t i = 0; i < n; ++i) freq[static_cast<size_t>(i)] = pmf.probs[static_cast<size_t>(i)];
  HUDDLE_RETURN_IF_ERROR(Fft(freq, false, stop));
  for (size_t i = 0; i < freq.size(); ++i) {
    if (CheckNow(i) && Stopped(stop)) return Cancelled();
    freq[i] = Power(freq[i], times);
  }
  HUDDLE_RETURN_IF_ERROR(Fft(freq, true, stop));
  PldPmf out;
  out.discretization = pmf.discretization;
  const auto lb_i = static_cast<int64_t>(lb);
  out.lower_loss = pmf.lower_loss * times + lb_i;  // in range: checked above
  out.probs.resize(static_cast<size_t>(out_len));
  for (int64_t i = 0; i < out_len; ++i) {
    out.probs[static_cast<size_t>(i)] = freq[static_cast<size_t>((lb_i + i) % length)].real();
  }
  out.infinity_mass = tail_mass_truncation -
                      std::expm1(static_cast<double>(times) * std::log1p(-pmf.infinity_mass));
  return out;
}

StatusOr<PldPmf> Compose(const PldPmf& a, const PldPmf& b, double tail_mass_truncation,
                         const std::atomic<bool>* stop) {
  PldPmf out;
  out.discretization = a.discretization;
  const size_t na = a.probs.size();
  const size_t nb = b.probs.size();
  const size_t n = na + nb - 1;
  const double lower_d = static_cast<double>(a.lower_loss) + static_cast<double>(b.lower_loss);
  if (!IndexInRange(lower_d) || !IndexInRange(lower_d + static_cast<double>(n))) {
    return LossOutOfRange();
  }
  out.lower_loss = a.lower_loss + b.lower_loss;
  out.infinity_mass = a.infinity_mass + b.infinity_mass - a.infinity_mass * b.infinity_mass;
  if (n > static_cast<size_t>(kMaxPldLength)) return TooLarge(static_cast<double>(n));
  if (std::min(na, nb) <= 32) {  // direct convolution (e.g. with the identity)
    out.probs.assign(n, 0.0);
    for (size_t i = 0; i < na; ++i) {
      if (Stopped(stop)) return Cancelled();  // each row: up to 2^24 products
      for (size_t j = 0; j < nb; ++j) out.probs[i + j] += a.probs[i] * b.probs[j];
    }
  } else {
    const int64_t length = NextPowerOfTwo(static_cast<int64_t>(n));
    if (length > kMaxPldLength) return TooLarge(static_cast<double>(length));
    std::vector<Complex> fa(static_cast<size_t>(length));
    std::vector<Complex> fb(static_cast<size_t>(length));
    for (size_t i = 0; i < na; ++i) fa[i] = a.probs[i];
    for (size_t i = 0; i < nb; ++i) fb[i] = b.probs[i];
    HUDDLE_RETURN_IF_ERROR(Fft(fa, false, stop));
    HUDDLE_RETURN_IF_ERROR(Fft(fb, false, stop));
    for (size_t i = 0; i < fa.size(); ++i) fa[i] = Mul(fa[i], fb[i]);
    HUDDLE_RETURN_IF_ERROR(Fft(fa, true, stop));
    out.probs.resize(n);
    for (size_t i = 0; i < n; ++i) out.probs[i] = fa[i].real();
  }
  TruncateTails(out, tail_mass_truncation);
  return out;
}

double DeltaForEpsilon(const PldPmf& pmf, double epsilon) {
  double delta = pmf.infinity_mass;
  for (size_t i = 0; i < pmf.probs.size(); ++i) {
    const double loss =
        static_cast<double>(pmf.lower_loss + static_cast<int64_t>(i)) * pmf.discretization;
    if (loss > epsilon) delta += -std::expm1(epsilon - loss) * pmf.probs[i];
  }
  return delta;
}

double EpsilonForDelta(const PldPmf& pmf, double delta) {
  // delta(eps) = inf_mass + sum_{loss > eps} p (1 - e^(eps - loss)): walk down from the largest
  // loss, accumulating mass_upper = sum p and mass_lower = sum p e^-loss, until the eps that
  // solves mass_upper - e^eps mass_lower = delta is at least the next loss (pld_pmf.py).
  if (pmf.infinity_mass > delta) return kInf;
  double mass_upper = pmf.infinity_mass;
  double mass_lower = 0;
  for (size_t k = pmf.probs.size(); k-- > 0;) {
    const double loss =
        static_cast<double>(pmf.lower_loss + static_cast<int64_t>(k)) * pmf.discretization;
    if (mass_upper > delta && mass_lower > 0 &&
        std::log((mass_upper - delta) / mass_lower) >= loss) {
      break;
    }
    mass_upper += pmf.probs[k];
    mass_lower += std::exp(-loss) * pmf.probs[k];
    if (mass_upper >= delta && mass_lower == 0) return std::max(0.0, loss);
  }
  if (mass_upper <= mass_lower + delta) return 0;
  return std::log((mass_upper - delta) / mass_lower);
}

}  // namespace huddle::privacy::internal
