// Accountant front end: validation, composition of events per accountant, and calibration.
#include "privacy/accountant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "privacy/internal/math.h"
#include "privacy/internal/pld.h"

namespace huddle::privacy {
namespace {

using internal::kInf;

Status CheckDelta(double delta) {
  if (!(delta > 0 && delta < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("delta must be in (0, 1), got ", delta));
  }
  return absl::OkStatus();
}

Status CheckEvent(const DpEvent& e) {
  if (!(e.sampling_rate >= 0 && e.sampling_rate <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling rate must be in [0, 1], got ", e.sampling_rate));
  }
  if (!(e.noise_multiplier >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("noise multiplier must be >= 0, got ", e.noise_multiplier));
  }
  if (e.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("steps must be >= 0, got ", e.steps));
  }
  if (e.mechanism == Mechanism::kDistributedDiscreteGaussian) {
    if (!(e.tau >= 0) || std::isinf(e.tau) || e.dimension < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("a distributed discrete Gaussian event needs tau >= 0 and finite (got ",
                       e.tau, ") and dimension >= 1 (got ", e.dimension, ")"));
    }
    if (e.sampling_rate != 1 && e.sampling_rate != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a distributed discrete Gaussian event is accounted without sampling (q = 1), got q = ",
          e.sampling_rate));
    }
  }
  return absl::OkStatus();
}

bool HasDistributed(std::span<const DpEvent> events) {
  return std::any_of(events.begin(), events.end(), [](const DpEvent& e) {
    return e.mechanism == Mechanism::kDistributedDiscreteGaussian;
  });
}

Status OnlyGaussian(std::span<const DpEvent> events, AccountantKind kind) {
  if (HasDistributed(events)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", AccountantName(kind),
        " accountant cannot account a distributed discrete Gaussian event (its bound, Kairouz et "
        "al. 2021, is an RDP one): use the rdp accountant"));
  }
  return absl::OkStatus();
}

Status CheckStop(const std::atomic<bool>* stop) {
  if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
    return absl::CancelledError("privacy accounting stopped");
  }
  return absl::OkStatus();
}

// Events that spend nothing: no steps, nobody sampled, or infinite noise.
bool IsNoOp(const DpEvent& e) {
  return e.steps == 0 || e.sampling_rate == 0 || std::isinf(e.noise_multiplier);
}

StatusOr<RdpEpsilon> RdpSpend(std::span<const DpEvent> events, double delta,
                              const std::atomic<bool>* stop) {
  const std::vector<double>& orders = DefaultRdpOrders();
  std::vector<double> total(orders.size(), 0.0);
  for (const DpEvent& e : events) {
    if (IsNoOp(e)) continue;
    for (size_t j = 0; j < orders.size(); ++j) {
      HUDDLE_RETURN_IF_ERROR(CheckStop(stop));  // each order takes at most ~20 ms
      double rdp = 0;
      if (e.mechanism == Mechanism::kDistributedDiscreteGaussian) {
        rdp = DistributedDiscreteGaussianRdp(e.noise_multiplier, e.tau, e.dimension, orders[j]);
      } else {
        HUDDLE_ASSIGN_OR_RETURN(
            rdp, SubsampledGaussianRdp(e.sampling_rate, e.noise_multiplier, orders[j]));
      }
      total[j] += static_cast<double>(e.steps) * rdp;
    }
  }
  return RdpToEpsilon(orders, total, delta);
}

StatusOr<double> PldSpend(std::span<const DpEvent> events, double delta, const PldOptions& opts,
                          const std::atomic<bool>* stop) {
  const double d = opts.value_discretization_interval;
  if (!(d > 0) || std::isinf(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("value_discretization_interval must be positive, got ", d));
  }
  // As dp_accounting's PLDAccountant: the identity composed with each event's self-composition.
  internal::Pld total{internal::PldPmf{d, 0, {1.0}, 0.0}, std::nullopt};
  for (const DpEvent& e : events) {
    if (IsNoOp(e)) continue;
    if (e.noise_multiplier == 0) return kInf;  // a non-private release
    HUDDLE_RETURN_IF_ERROR(CheckStop(stop));
    const double tail = internal::kTailMassTruncation;
    HUDDLE_ASSIGN_OR_RETURN(internal::Pld one, internal::SubsampledGaussianPld(
                                                   e.sampling_rate, e.noise_multiplier, d, stop));
    HUDDLE_ASSIGN_OR_RETURN(internal::PldPmf remove,
                            internal::SelfCompose(one.remove, e.steps, tail, stop));
    std::optional<internal::PldPmf> add;
    if (one.add) {
      HUDDLE_ASSIGN_OR_RETURN(add, internal::SelfCompose(*one.add, e.steps, tail, stop));
    }
    if (total.add || add) {  // asymmetric from now on: compose the two directions separately
      HUDDLE_ASSIGN_OR_RETURN(internal::PldPmf new_add,
                              internal::Compose(total.add ? *total.add : total.remove,
                                                add ? *add : remove, tail, stop));
      total.add = std::move(new_add);
    }
    HUDDLE_ASSIGN_OR_RETURN(total.remove, internal::Compose(total.remove, remove, tail, stop));
  }
  double eps = internal::EpsilonForDelta(total.remove, delta);
  if (total.add) eps = std::max(eps, internal::EpsilonForDelta(*total.add, delta));
  return eps;
}

StatusOr<double> AnalyticSpend(std::span<const DpEvent> events, double delta) {
  double precision = 0;  // sum_i steps_i / z_i^2: the composition is one Gaussian
  for (const DpEvent& e : events) {
    if (e.steps == 0 || e.sampling_rate == 0) continue;
    if (e.sampling_rate != 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("the analytic accountant needs sampling rate 1 (no subsampling), got ",
                       e.sampling_rate, "; use the rdp or pld accountant"));
    }
    if (std::isinf(e.noise_multiplier)) continue;
    precision += static_cast<double>(e.steps) / (e.noise_multiplier * e.noise_multiplier);
  }
  return AnalyticGaussianEpsilon(precision == 0 ? kInf : 1 / std::sqrt(precision), delta);
}

}  // namespace

const char* MechanismName(Mechanism mechanism) {
  return mechanism == Mechanism::kDistributedDiscreteGaussian ? "distributed_discrete_gaussian"
                                                              : "gaussian";
}

double DistributedDiscreteGaussianTau(double variance, int64_t members) {
  if (!(variance >= 0.25) || members < 1) return std::numeric_limits<double>::quiet_NaN();
  if (members == 1) return 0;
  // The largest term is k = 1's, exp(-pi^2 variance): once it underflows, so does every term, and
  // each is bounded by the smallest subnormal instead (tau below 1e-316 per member).
  const double c = 2 * M_PI * M_PI * variance;
  const double tiny = std::numeric_limits<double>::denorm_min();
  if (std::exp(-c / 2) == 0) return 10 * static_cast<double>(members - 1) * tiny;
  // The terms fall with k (k / (k + 1) grows): summed from the smallest up, each rounded up by an
  // ulp and so is every partial sum, so that the result is never below the true tau.
  double tau = 0;
  for (int64_t k = members - 1; k >= 1; --k) {
    const double kk = static_cast<double>(k);
    tau = std::nextafter(tau + std::nextafter(std::exp(-c * kk / (kk + 1)), kInf), kInf);
  }
  return std::nextafter(10 * tau, kInf);
}

DpEvent DistributedDiscreteGaussianEvent(uint64_t variance, int64_t members, double sensitivity,
                                         int64_t dimension) {
  DpEvent e;
  e.mechanism = Mechanism::kDistributedDiscreteGaussian;
  e.noise_multiplier =
      std::sqrt(static_cast<double>(members) * static_cast<double>(variance)) / sensitivity;
  e.tau = DistributedDiscreteGaussianTau(static_cast<double>(variance), members);
  e.dimension = dimension;
  return e;
}

double DistributedDiscreteGaussianRdp(double z, double tau, int64_t dimension, double alpha) {
  if (z == 0) return kInf;
  const double scale = std::isinf(z) ? 0 : 1 / z;  // the l2 sensitivity over the noise's std
  const double d = static_cast<double>(dimension);
  const double first = alpha * scale * scale / 2 + tau * d;
  const double root = scale + tau * std::sqrt(d);
  return std::min(first, alpha / 2 * root * root);
}

const char* AccountantName(AccountantKind kind) {
  switch (kind) {
    case AccountantKind::kRdp:
      return "rdp";
    case AccountantKind::kPld:
      return "pld";
    case AccountantKind::kAnalytic:
      return "analytic";
  }
  return "unknown";
}

StatusOr<AccountantKind> ParseAccountant(const std::string& name) {
  for (AccountantKind kind :
       {AccountantKind::kRdp, AccountantKind::kPld, AccountantKind::kAnalytic}) {
    if (name == AccountantName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown accountant '", name, "' (choices: rdp, pld, analytic)"));
}

StatusOr<Spend> ComputeSpend(std::span<const DpEvent> events, double delta, AccountantKind kind) {
  bool unsampled = true;
  for (const DpEvent& e : events) unsampled = unsampled && e.sampling_rate == 1;
  if (HasDistributed(events)) {
    kind = AccountantKind::kRdp;
  } else if (unsampled) {
    kind = AccountantKind::kAnalytic;
  }
  if (!events.empty()) return ComputeEpsilon(events, delta, kind);
  HUDDLE_RETURN_IF_ERROR(CheckDelta(delta));
  Spend none;
  none.delta = delta;
  none.accountant = kind;
  return none;
}

StatusOr<Spend> ComputeEpsilon(std::span<const DpEvent> events, double delta, AccountantKind kind,
                               const PldOptions& pld, const std::atomic<bool>* stop) {
  HUDDLE_RETURN_IF_ERROR(CheckDelta(delta));
  for (const DpEvent& e : events) HUDDLE_RETURN_IF_ERROR(CheckEvent(e));
  Spend spend;
  spend.delta = delta;
  spend.accountant = kind;
  switch (kind) {
    case AccountantKind::kRdp: {
      HUDDLE_ASSIGN_OR_RETURN(RdpEpsilon r, RdpSpend(events, delta, stop));
      spend.epsilon = r.epsilon;
      spend.order = r.order;
      break;
    }
    case AccountantKind::kPld: {
      HUDDLE_RETURN_IF_ERROR(OnlyGaussian(events, kind));
      HUDDLE_ASSIGN_OR_RETURN(spend.epsilon, PldSpend(events, delta, pld, stop));
      break;
    }
    case AccountantKind::kAnalytic: {
      HUDDLE_RETURN_IF_ERROR(OnlyGaussian(events, kind));
      HUDDLE_ASSIGN_OR_RETURN(spend.epsilon, AnalyticSpend(events, delta));
      break;
    }
  }
  return spend;
}

StatusOr<double> CalibrateNoiseMultiplier(double target_epsilon, double delta, double sampling_rate,
                                          int64_t steps, AccountantKind kind, const PldOptions& pld,
                                          const std::atomic<bool>* stop) {
  if (!(target_epsilon > 0) || std::isinf(target_epsilon)) {
    return absl::InvalidArgumentError(
        absl::StrCat("target epsilon must be positive and finite, got ", target_epsilon));
  }
  HUDDLE_RETURN_IF_ERROR(CheckDelta(delta));
  HUDDLE_RETURN_IF_ERROR(CheckEvent(DpEvent{sampling_rate, 1.0, steps}));
  if (sampling_rate == 0 || steps == 0) return 0.0;  // nothing is released about anyone
  if (kind == AccountantKind::kAnalytic && sampling_rate != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("the analytic accountant needs sampling rate 1 (no subsampling), got ",
                     sampling_rate, "; use the rdp or pld accountant"));
  }
  auto epsilon_at = [&](double z) -> StatusOr<double> {
    HUDDLE_RETURN_IF_ERROR(CheckStop(stop));
    const DpEvent event{sampling_rate, z, steps};
    HUDDLE_ASSIGN_OR_RETURN(Spend s, ComputeEpsilon(std::span(&event, 1), delta, kind, pld, stop));
    return s.epsilon;
  };

  // Bracket lo < z* <= hi with eps(lo) > target >= eps(hi). PLD evaluations are the expensive
  // ones: start from the RDP answer, an upper bound up to the PLD's discretization error.
  double hi = 1;
  if (kind == AccountantKind::kPld) {
    HUDDLE_ASSIGN_OR_RETURN(hi, CalibrateNoiseMultiplier(target_epsilon, delta, sampling_rate,
                                                         steps, AccountantKind::kRdp, {}, stop));
  }
  HUDDLE_ASSIGN_OR_RETURN(double eps_hi, epsilon_at(hi));
  double lo = 0;
  double eps_lo = kInf;
  const double grow = kind == AccountantKind::kPld ? 1.1 : 2.0;
  while (eps_hi > target_epsilon) {
    lo = hi;
    eps_lo = eps_hi;
    hi *= grow;
    if (hi > kMaxCalibratedNoise) {
      return absl::InvalidArgumentError(
          absl::StrCat("no noise multiplier up to ", kMaxCalibratedNoise, " reaches epsilon ",
                       target_epsilon, " (", lo, " spends ", eps_lo, ")"));
    }
    HUDDLE_ASSIGN_OR_RETURN(eps_hi, epsilon_at(hi));
  }
  if (lo == 0) {
    // Where epsilon is 0 (e.g. delta near 1) the answer can be far below: halve there, so that a
    // PLD search reaches its answer, or its grid limit, in few (costly) evaluations.
    const double shrink = kind == AccountantKind::kPld ? 0.85 : 0.5;
    lo = hi * (eps_hi == 0 ? 0.5 : shrink);
    HUDDLE_ASSIGN_OR_RETURN(eps_lo, epsilon_at(lo));
    while (eps_lo <= target_epsilon) {
      hi = lo;
      eps_hi = eps_lo;
      lo *= eps_lo == 0 ? 0.5 : shrink;
      if (lo < kMinCalibratedNoise) {
        return absl::InvalidArgumentError(absl::StrCat(
            "target epsilon ", target_epsilon, " is too large to calibrate: even noise multiplier ",
            hi, " spends only ", eps_hi, " (the search stops at ", kMinCalibratedNoise, ")"));
      }
      HUDDLE_ASSIGN_OR_RETURN(eps_lo, epsilon_at(lo));
    }
  }

  // Illinois (modified regula falsi) on f(x) = log eps - log target, x = log z, with each probe
  // kept 0.4 tolerance inside the bracket so that both ends close in; geometric bisection where f
  // is infinite (eps = 0 or inf).
  const double log_target = std::log(target_epsilon);
  double x_lo = std::log(lo), x_hi = std::log(hi);
  double f_lo = std::log(eps_lo) - log_target, f_hi = std::log(eps_hi) - log_target;
  int last_side = 0;
  for (int iter = 0; iter < 200 && hi - lo > 1e-6 * hi; ++iter) {
    const double tol = 0.4e-6;
    double x = 0.5 * (x_lo + x_hi);
    if (std::isfinite(f_lo) && std::isfinite(f_hi) && iter < 60) {
      x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo);
    }
    x = std::clamp(x, x_lo + tol, x_hi - tol);
    if (!(x > x_lo && x < x_hi)) x = 0.5 * (x_lo + x_hi);
    HUDDLE_ASSIGN_OR_RETURN(double eps, epsilon_at(std::exp(x)));
    const double f = std::log(eps) - log_target;
    if (f > 0) {
      if (last_side == -1) f_hi *= 0.5;
      x_lo = x;
      f_lo = f;
      lo = std::exp(x);
      last_side = -1;
    } else {
      if (last_side == 1) f_lo *= 0.5;
      x_hi = x;
      f_hi = f;
      hi = std::exp(x);
      last_side = 1;
    }
  }
  return hi;
}

}  // namespace huddle::privacy
