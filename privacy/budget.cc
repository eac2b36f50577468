#include "privacy/budget.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "privacy/ledger.h"

namespace huddle::privacy {
namespace {

bool Positive(double v) { return std::isfinite(v) && v > 0; }

int64_t TotalSteps(std::span<const DpEvent> plan) {
  int64_t steps = 0;
  for (const DpEvent& e : plan) steps += e.steps;
  return steps;
}

// The first `steps` steps of `plan`.
std::vector<DpEvent> Prefix(std::span<const DpEvent> plan, int64_t steps) {
  std::vector<DpEvent> out;
  for (const DpEvent& e : plan) {
    if (steps <= 0) break;
    out.push_back(e);
    out.back().steps = std::min(e.steps, steps);
    steps -= out.back().steps;
  }
  return out;
}

// z rounded up at its third significant digit, so that "noise_multiplier >= z" as printed holds.
double RoundUpSignificant(double z) {
  if (!(z > 0) || !std::isfinite(z)) return z;
  const double scale = std::pow(10.0, 2 - std::floor(std::log10(z)));
  return std::ceil(z * scale * (1 - 1e-12)) / scale;
}

// "noise_multiplier 2", or "noise_multiplier 1.2 (rounds 1-20), 2.31 (rounds 21-40)".
std::string DescribeNoise(const std::vector<PlannedRange>& schedule) {
  std::vector<PlannedRange> runs;  // merged by z alone (the clip norm spends nothing)
  for (const PlannedRange& r : schedule) {
    if (!runs.empty() && runs.back().noise_multiplier == r.noise_multiplier) {
      runs.back().last_round = r.last_round;
    } else {
      runs.push_back(r);
    }
  }
  if (runs.size() == 1) return fmt::format("noise_multiplier {:.4g}", runs[0].noise_multiplier);
  std::string out = "noise_multiplier ";
  for (size_t i = 0; i < runs.size(); ++i) {
    out += fmt::format("{}{:.4g} (rounds {}-{})", i == 0 ? "" : ", ", runs[i].noise_multiplier,
                       runs[i].first_round, runs[i].last_round);
  }
  return out;
}

}  // namespace

StatusOr<BudgetFit> FitBudget(std::span<const DpEvent> plan, double budget_epsilon, double delta,
                              AccountantKind kind) {
  BudgetFit fit;
  HUDDLE_ASSIGN_OR_RETURN(fit.spend, ComputeEpsilon(plan, delta, kind));
  fit.fits = fit.spend.epsilon <= budget_epsilon;  // false for NaN
  if (fit.fits) return fit;
  const double q = plan.empty() ? 1.0 : plan.front().sampling_rate;
  auto z = CalibrateNoiseMultiplier(budget_epsilon, delta, q, TotalSteps(plan), kind);
  if (z.ok()) fit.noise_multiplier_that_fits = *z;
  return fit;
}

StatusOr<int64_t> StepsWithinBudget(std::span<const DpEvent> plan, double budget_epsilon,
                                    double delta, AccountantKind kind) {
  auto within = [&](int64_t steps) -> StatusOr<bool> {
    HUDDLE_ASSIGN_OR_RETURN(const Spend spend, ComputeEpsilon(Prefix(plan, steps), delta, kind));
    return spend.epsilon <= budget_epsilon;
  };
  int64_t hi = TotalSteps(plan);
  HUDDLE_ASSIGN_OR_RETURN(const bool all, within(hi));
  if (all) return hi;
  // Invariant: `lo` steps fit (0 always does), `hi` steps do not; the spend grows with the steps.
  int64_t lo = 0;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    HUDDLE_ASSIGN_OR_RETURN(const bool fits, within(mid));
    (fits ? lo : hi) = mid;
  }
  return lo;
}

std::string PlanFit::Shortfall() const {
  if (fits || !budget_epsilon) return "";
  std::string out = fmt::format(
      "privacy.epsilon: {} rounds at {} spend epsilon {:.4g} at delta {:g}, past the total {:g}: ",
      rounds, DescribeNoise(schedule), spend.epsilon, spend.delta, *budget_epsilon);
  out += rounds_that_fit > 0
             ? fmt::format("{} rounds fit (rounds: {}), or ", rounds_that_fit, rounds_that_fit)
             : std::string("not even round 1 fits; ");
  if (noise_multiplier_that_fits) {
    out += fmt::format("noise_multiplier >= {:g} fits all {}",
                       RoundUpSignificant(*noise_multiplier_that_fits), rounds);
  } else {
    out += fmt::format("no noise_multiplier up to {:g} fits all {}", kMaxCalibratedNoise, rounds);
  }
  return out;
}

double MeanNoiseToClip(PrivacyMode mode, double noise_multiplier, double contributions) {
  if (mode == PrivacyMode::kNone || !(contributions > 0)) return 0;
  return mode == PrivacyMode::kLocal ? noise_multiplier / std::sqrt(contributions)
                                     : noise_multiplier / contributions;
}

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

const char* PrivacyPlan::adjacency() const {
  return bounded() ? kReplaceOne : AdjacencyOf(options_.mode);
}

std::vector<DpEvent> PrivacyPlan::WorstParticipant(std::vector<DpEvent> events) const {
  if (!bounded()) return events;
  // Most expensive first: the smallest z (0, a lost entry's, is unbounded). Ties keep their order.
  std::stable_sort(events.begin(), events.end(), [](const DpEvent& a, const DpEvent& b) {
    return a.noise_multiplier < b.noise_multiplier;
  });
  return Prefix(events, *options_.max_participations);
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
  if (options.max_participations) {
    if (*options.max_participations < 1 || options.min_separation < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("privacy.max_participations (", *options.max_participations,
                       ") and privacy.min_separation (", options.min_separation, ") must be >= 1"));
    }
    if (options.mode != PrivacyMode::kCentral && options.mode != PrivacyMode::kLocal) {
      return absl::InvalidArgumentError(absl::StrCat(
          "privacy.max_participations (participation-bounded accounting) is for privacy.mode "
          "central or local, not ",
          PrivacyModeName(options.mode)));
    }
    if (options.adaptive.enabled) {
      return absl::InvalidArgumentError(
          "privacy.adaptive_clipping does not combine with privacy.max_participations: its "
          "clipped-count query is sized for a sampled cohort, and each release would charge it "
          "to clients that did not contribute; give a fixed privacy.clip_norm");
    }
  } else if (options.mode == PrivacyMode::kCentral && !options.expected_cohort_size) {
    return absl::InvalidArgumentError(
        "privacy.expected_cohort_size is required in central mode: the fixed denominator of the "
        "noised mean (cohort.rate x the population you expect); dividing by the live population "
        "would publish its size without noise");
  }
  plan.accounting_rate_ =
      options.mode == PrivacyMode::kCentral && !options.max_participations ? cohort_rate : 1.0;
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
  const double sensitivity_factor = std::string_view(plan.adjacency()) == kReplaceOne ? 2.0 : 1.0;
  plan.spend_accountant_ = kind;
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
    // Bounded: a client's releases are at most max_participations of the rounds.
    const int64_t accounted =
        options.max_participations ? std::min(rounds, *options.max_participations) : rounds;
    auto z = CalibrateNoiseMultiplier(*options.total_epsilon, options.delta, q, accounted, kind);
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

std::vector<PlannedRange> PrivacyPlan::Schedule() const {
  std::vector<PlannedRange> runs;
  for (size_t i = 0; i < rounds_.size(); ++i) {
    const RoundPrivacy& r = rounds_[i];
    const auto round = static_cast<int64_t>(i + 1);
    if (!runs.empty() && runs.back().noise_multiplier == r.noise_multiplier &&
        runs.back().clip_norm == r.clip_norm) {
      runs.back().last_round = round;
    } else {
      runs.push_back({round, round, r.noise_multiplier, r.clip_norm});
    }
  }
  return runs;
}

std::vector<DpEvent> PrivacyPlan::PlannedEvents(int64_t last) const {
  std::vector<DpEvent> events;
  for (const PlannedRange& run : Schedule()) {
    if (run.first_round > last) break;
    DpEvent e = RoundEvent(run.noise_multiplier);
    e.steps = std::min(run.last_round, last) - run.first_round + 1;
    if (!events.empty() && events.back().noise_multiplier == e.noise_multiplier) {
      events.back().steps += e.steps;  // runs that differ in clip norm alone
    } else {
      events.push_back(e);
    }
  }
  return events;
}

StatusOr<PlanFit> PrivacyPlan::Fit() const {
  PlanFit fit;
  fit.rounds = rounds();
  fit.rounds_that_fit = fit.rounds;
  fit.budget_epsilon = options_.total_epsilon;
  fit.schedule = Schedule();
  if (!enabled()) return fit;
  const std::vector<DpEvent> events = WorstParticipant(PlannedEvents(fit.rounds));
  if (!options_.total_epsilon) {
    HUDDLE_ASSIGN_OR_RETURN(fit.spend, ComputeEpsilon(events, options_.delta, spend_accountant_));
    return fit;
  }
  HUDDLE_ASSIGN_OR_RETURN(const BudgetFit budget, FitBudget(events, *options_.total_epsilon,
                                                            options_.delta, spend_accountant_));
  fit.spend = budget.spend;
  fit.fits = budget.fits;
  if (fit.fits) return fit;
  if (bounded()) {
    // The spend of the first k rounds grows with k: bisect over them.
    int64_t lo = 0;
    int64_t hi = fit.rounds;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      HUDDLE_ASSIGN_OR_RETURN(
          const Spend spend,
          ComputeEpsilon(WorstParticipant(PlannedEvents(mid)), options_.delta, spend_accountant_));
      (spend.epsilon <= *options_.total_epsilon ? lo : hi) = mid;
    }
    fit.rounds_that_fit = lo;
  } else {
    HUDDLE_ASSIGN_OR_RETURN(
        fit.rounds_that_fit,
        StepsWithinBudget(events, *options_.total_epsilon, options_.delta, spend_accountant_));
  }
  if (budget.noise_multiplier_that_fits) {
    // The accountant's z; under replace-one the noise is twice it (as in Create).
    const double factor = std::string_view(adjacency()) == kReplaceOne ? 2.0 : 1.0;
    fit.noise_multiplier_that_fits = *budget.noise_multiplier_that_fits * factor;
  }
  return fit;
}

StatusOr<Spend> PrivacyPlan::Spent(const std::vector<DpEvent>& events) const {
  return ComputeSpend(WorstParticipant(events), options_.delta, options_.accountant);
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
