#include "privacy/budget.h"

#include <cmath>
#include <string_view>

#include "privacy/ledger.h"

namespace huddle::privacy {
namespace {

bool Positive(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

const char* PrivacyModeName(PrivacyMode mode) {
  switch (mode) {
    case PrivacyMode::kCentral:
      return kModeCentral;
    case PrivacyMode::kLocal:
      return kModeLocal;
    case PrivacyMode::kDistributed:
      return kModeDistributed;
    case PrivacyMode::kNone:
      break;
  }
  return "none";
}

const char* AdjacencyOf(PrivacyMode mode) {
  return mode == PrivacyMode::kLocal || mode == PrivacyMode::kDistributed ? kReplaceOne
                                                                          : kAddRemove;
}

DpEvent PrivacyPlan::RoundEvent(double noise_multiplier) const {
  if (options_.mode == PrivacyMode::kDistributed) {
    DpEvent sum;
    sum.noise_multiplier = noise_multiplier;
    sum.dimension = 1;  // tau = 0: the plan's bound before the grid is known
    return LedgerEntry::DistributedSum(0, sum, 0, {}).event();
  }
  return LedgerEntry::ClientGaussian(PrivacyModeName(options_.mode), 0, accounting_rate_,
                                     noise_multiplier, 0, adjacency(), {})
      .event();
}

StatusOr<double> ValueNoiseMultiplier(double z, double count_stddev) {
  const double inv = 1.0 / (z * z) - 1.0 / (4.0 * count_stddev * count_stddev);
  if (!(inv > 0) || !std::isfinite(inv)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adaptive clipping: the clipped-count noise std ", count_stddev,
                     " is too small for noise multiplier ", z,
                     " (2 * count_stddev must exceed it; raise "
                     "privacy.adaptive_clipping.count_stddev or the expected cohort size)"));
  }
  return 1.0 / std::sqrt(inv);
}

StatusOr<PrivacyPlan> PrivacyPlan::Create(const PrivacyOptions& options, double cohort_rate,
                                          int64_t rounds) {
  PrivacyPlan plan;
  plan.options_ = options;
  if (options.mode == PrivacyMode::kNone) return plan;
  if (!Positive(options.clip_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("privacy.clip_norm must be finite and > 0, got ", options.clip_norm));
  }
  if (!(options.delta > 0 && options.delta < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("privacy.delta must lie in (0, 1), got ", options.delta));
  }
  if (options.total_epsilon && !Positive(*options.total_epsilon)) {
    return absl::InvalidArgumentError(
        absl::StrCat("privacy.epsilon must be finite and > 0, got ", *options.total_epsilon));
  }
  if (!options.total_epsilon && options.schedule.empty()) {
    return absl::InvalidArgumentError(
        "privacy: give a total budget (privacy.epsilon and privacy.delta) or a per-round "
        "schedule (privacy.schedule)");
  }
  if (options.mode != PrivacyMode::kCentral && options.adaptive.enabled) {
    return absl::InvalidArgumentError(absl::StrCat(
        "privacy.adaptive_clipping needs privacy.mode central: in ", PrivacyModeName(options.mode),
        " mode the clients add the noise and the coordinator has no noised count to adapt the "
        "clip norm from"));
  }
  if (options.mode == PrivacyMode::kDistributed && options.accountant != AccountantKind::kRdp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "privacy.accountant ", AccountantName(options.accountant),
        " cannot account privacy.mode distributed: a sum of the clients' discrete Gaussian "
        "shares is bounded in Renyi DP (Kairouz et al. 2021); use accountant: rdp"));
  }
  if (options.expected_cohort_size &&
      !(Positive(*options.expected_cohort_size) && *options.expected_cohort_size >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("privacy.expected_cohort_size must be finite and >= 1, got ",
                     *options.expected_cohort_size));
  }
  if (options.mode == PrivacyMode::kCentral && !options.expected_cohort_size) {
    return absl::InvalidArgumentError(
        "privacy.expected_cohort_size is required in central mode: the fixed denominator of the "
        "noised mean (cohort.rate x the population you expect); dividing by the live population "
        "would publish its size without noise");
  }
  plan.accounting_rate_ = options.mode == PrivacyMode::kCentral ? cohort_rate : 1.0;
  const double q = plan.accounting_rate_;
  if (!(q > 0 && q <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("cohort.rate must lie in (0, 1], got ", q));
  }
  // With q = 1 the exact analytic Gaussian is both tighter and exact. Distributed: RDP, where
  // the Gaussian's curve at q = 1 is the distributed bound's with tau = 0.
  const bool distributed = options.mode == PrivacyMode::kDistributed;
  const AccountantKind kind = distributed
                                  ? AccountantKind::kRdp
                                  : (q == 1 ? AccountantKind::kAnalytic : options.accountant);
  // Calibration finds the accounted multiplier; under replace-one the noise must be twice it.
  const double sensitivity_factor =
      std::string_view(AdjacencyOf(options.mode)) == kReplaceOne ? 2.0 : 1.0;
  plan.rounds_.assign(static_cast<size_t>(rounds), RoundPrivacy{});
  std::vector<bool> covered(static_cast<size_t>(rounds), false);
  for (size_t i = 0; i < options.schedule.size(); ++i) {
    const ScheduleRange& r = options.schedule[i];
    const std::string where = absl::StrCat("privacy.schedule[", i, "]");
    if (r.first_round < 1 || r.last_round < r.first_round || r.last_round > rounds) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": rounds ", r.first_round, "-",
                                                     r.last_round, " are not within 1-", rounds));
    }
    if (r.noise_multiplier.has_value() == r.epsilon.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": give exactly one of noise_multiplier and epsilon"));
    }
    double z = 0;
    if (r.noise_multiplier) {
      if (!Positive(*r.noise_multiplier)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ".noise_multiplier must be finite and > 0, got ", *r.noise_multiplier));
      }
      z = *r.noise_multiplier;
    } else {
      if (!Positive(*r.epsilon)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".epsilon must be finite and > 0, got ", *r.epsilon));
      }
      auto calibrated = CalibrateNoiseMultiplier(*r.epsilon, options.delta, q, 1, kind);
      if (!calibrated.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".epsilon: ", calibrated.status().message()));
      }
      z = *calibrated * sensitivity_factor;
    }
    const double c = r.clip_norm.value_or(options.clip_norm);
    if (!Positive(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".clip_norm must be finite and > 0, got ", c));
    }
    for (int64_t k = r.first_round; k <= r.last_round; ++k) {
      if (covered[static_cast<size_t>(k - 1)]) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": round ", k, " is already covered by an earlier range"));
      }
      covered[static_cast<size_t>(k - 1)] = true;
      plan.rounds_[static_cast<size_t>(k - 1)] = {z, c};
    }
  }
  if (options.schedule.empty()) {
    auto z = CalibrateNoiseMultiplier(*options.total_epsilon, options.delta, q, rounds, kind);
    if (!z.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("privacy.epsilon: cannot fit ", rounds, " rounds at sampling rate ", q,
                       " into epsilon ", *options.total_epsilon, ": ", z.status().message()));
    }
    for (RoundPrivacy& r : plan.rounds_) r = {*z * sensitivity_factor, options.clip_norm};
  } else {
    for (int64_t k = 1; k <= rounds; ++k) {
      if (!covered[static_cast<size_t>(k - 1)]) {
        return absl::InvalidArgumentError(absl::StrCat("privacy.schedule does not cover round ", k,
                                                       " (the ranges must cover 1-", rounds, ")"));
      }
    }
  }
  return plan;
}

RoundPrivacy PrivacyPlan::ForRound(uint64_t round) const {
  if (round < 1 || round > rounds_.size()) return {};
  return rounds_[round - 1];
}

StatusOr<Spend> PrivacyPlan::Spent(const std::vector<DpEvent>& events) const {
  return ComputeSpend(events, options_.delta, options_.accountant);
}

StatusOr<std::pair<Spend, bool>> PrivacyPlan::WouldSpend(std::vector<DpEvent> events,
                                                         uint64_t round) const {
  return WouldSpendEvent(std::move(events), RoundEvent(ForRound(round).noise_multiplier));
}

StatusOr<std::pair<Spend, bool>> PrivacyPlan::WouldSpendEvent(std::vector<DpEvent> events,
                                                              const DpEvent& next) const {
  events.push_back(next);
  HUDDLE_ASSIGN_OR_RETURN(Spend spend, Spent(events));
  const bool exceeds = options_.total_epsilon && spend.epsilon > *options_.total_epsilon;
  return std::make_pair(spend, exceeds);
}

}  // namespace huddle::privacy
