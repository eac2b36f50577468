// Privacy configuration of a federated job and the per-round plan derived from it.
//
// A job runs client-level DP-FedAvg (McMahan et al. 2018) in one of two modes:
//  - central: clients clip their update to L2 norm C; the (trusted) coordinator adds Gaussian
//    noise of std z*C to the sum, weights every client equally and divides by the *expected*
//    cohort size q*N. Cohorts must be Poisson-sampled with rate q: the accountant relies on it.
//  - local: each client clips and adds the full noise std z*C itself; the guarantee holds even
//    against the coordinator, with no amplification by sampling (the coordinator knows who took
//    part), so every round is accounted as q = 1, as if the client took part in every round.
//    Local DP's adjacency is replace-one (a client's data swapped for any other): two updates of
//    norm <= C differ by up to 2C, so a round is the Gaussian mechanism with multiplier z / 2.
//    Calibration from a budget accounts for that (z comes out twice the add/remove value).
//  - distributed: secure aggregation hides every update from the coordinator, so the noise comes
//    from the clients: each clips to C, quantizes onto the session's integer grid and adds its
//    share of discrete Gaussian noise, sized so that the fewest honest members whose inputs the
//    coordinator may unmask (secure_aggregation.min_survivors less the colluders it tolerates)
//    together carry noise of std at least z times the update's sensitivity on the grid
//    (aggregation/secagg/quantize.h, graph.h's HonestShares). The guarantee is against the
//    coordinator too, even one that deviates from the protocol, with up to corrupt_fraction of a
//    session colluding with it (docs/security.md); it knows the cohort: unsampled (q = 1) and
//    replace-one, as local DP, but the noise is that of one sum, not of every update. Accounted by
//    Kairouz et al. 2021's RDP bound for a sum of discrete Gaussians (accountant.h), so with the
//    RDP accountant only.
//
// The budget is either a total (epsilon, delta), from which z is calibrated so that all `rounds`
// rounds fit, or a per-round schedule (ranges of rounds, each with its noise multiplier or its
// per-round epsilon, and optionally its clip norm), optionally capped by a total. A capped schedule
// whose rounds cannot all run within the total is refused before the job starts (Fit: the rounds
// that fit, and the noise multiplier that fits them all), unless the job opts into stopping at the
// budget (PrivacyOptions::stop_at_budget). Before each round the coordinator asks whether that
// round would take the spend past the total; if so the job ends there (see docs/privacy.md).
//
// Adaptive clipping (Andrew et al. 2021): clients also report whether their update's norm was
// within C; the coordinator sums (bit - 1/2), adds Gaussian noise of std sigma_b, and moves C
// geometrically toward the target quantile. The two queries compose to the configured z: the
// update sum gets z_value = (z^-2 - (2 sigma_b)^-2)^-1/2, so accounting one Gaussian of multiplier
// z per round covers both.
//
// Thread-safety: values; PrivacyPlan is immutable after Create.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "privacy/accountant.h"

namespace huddle::privacy {

enum class PrivacyMode { kNone, kCentral, kLocal, kDistributed };
// "none", "central", "local", "distributed"
const char* PrivacyModeName(PrivacyMode mode);

struct AdaptiveClipOptions {
  bool enabled = false;
  double target_quantile = 0.5;  // fraction of clients whose update should fit within C
  double learning_rate = 0.2;    // eta_C in C <- C * exp(-eta_C * (b - target_quantile))
  // sigma_b, the noise std of the clipped-count query; 0: expected cohort size / 20 (the paper's
  // choice), fixed at the first round.
  double count_stddev = 0;
};

struct ScheduleRange {
  int64_t first_round = 1;                 // inclusive, 1-based
  int64_t last_round = 1;                  // inclusive
  std::optional<double> noise_multiplier;  // exactly one of these two
  std::optional<double> epsilon;           // this round alone spends epsilon at the job's delta
  std::optional<double> clip_norm;         // default: PrivacyOptions::clip_norm
};

struct PrivacyOptions {
  PrivacyMode mode = PrivacyMode::kNone;
  double clip_norm = 1.0;  // C (the initial C under adaptive clipping)
  AdaptiveClipOptions adaptive;
  std::optional<double> total_epsilon;  // the budget; required unless a schedule is given
  double delta = 1e-5;
  // Gaussian events with q = 1 use kAnalytic (exact); distributed mode needs kRdp.
  AccountantKind accountant = AccountantKind::kRdp;
  std::vector<ScheduleRange> schedule;
  // Reproducible noise for tests and experiments: NOT PRIVATE (anyone with the seed can remove
  // the noise), and cohorts then come from the job seed too. Unset: noise and cohorts from the
  // OS CSPRNG.
  std::optional<uint64_t> noise_seed;
  // Central mode: the fixed denominator of the noised mean (the expected cohort size, q times the
  // population the job expects). It must not depend on who enrols: dividing by q * (live clients)
  // would publish the population size without noise. Required in central mode.
  std::optional<double> expected_cohort_size;
  // A schedule capped by total_epsilon whose rounds cannot all run within it is refused at start
  // (PrivacyPlan::Fit); true accepts it: the job runs until the next round would pass the total and
  // stops there (the stop rule before every round holds either way).
  bool stop_at_budget = false;
  // Participation-bounded accounting (buffered asynchronous training, coordinator/async_round.h):
  // arrival is not Poisson sampling, so no amplification is claimed. Each release is the noised
  // sum of at most `buffer` clipped updates (q = 1, replace-one: sensitivity 2C), every client
  // contributes to at most max_participations releases, at least min_separation releases apart,
  // and a client's epsilon is the composition of its own releases: at most that of the
  // max_participations most expensive releases of the job (WorstParticipant), the job's epsilon.
  // Unset: every release is accounted for every client (synchronous rounds).
  std::optional<int64_t> max_participations;
  int64_t min_separation = 1;  // releases between two of one client's contributions (>= 1)
};

// The adjacency a mode's releases are accounted under (ledger.h): add/remove for central,
// replace-one for local and distributed.
const char* AdjacencyOf(PrivacyMode mode);

// What one round does.
struct RoundPrivacy {
  double noise_multiplier = 0;  // z accounted for the round
  double clip_norm = 0;         // configured C (adaptive clipping replaces it at run time)
};

// A run of consecutive rounds of a plan with the same noise multiplier and clip norm: the noise
// schedule a job states (privacy.json, the start checks).
struct PlannedRange {
  int64_t first_round = 1;  // inclusive, 1-based
  int64_t last_round = 1;   // inclusive
  double noise_multiplier = 0;
  double clip_norm = 0;
};

// A plan of releases checked against an epsilon budget before anything runs: what all of it
// spends and, when that passes the budget, the one noise multiplier that would fit every step.
// `huddle datacenter` (its DP-SGD steps) and federated jobs (their rounds, PrivacyPlan::Fit) refuse
// a plan that does not fit with these numbers.
struct BudgetFit {
  Spend spend;       // of the whole plan, at the budget's delta
  bool fits = true;  // spend.epsilon <= the budget
  // When it does not fit: the smallest z (as the accountant takes it) for which all the plan's
  // steps, at its sampling rate, fit the budget (CalibrateNoiseMultiplier); nullopt when it fits
  // or when no z up to kMaxCalibratedNoise does.
  std::optional<double> noise_multiplier_that_fits;
};

// `plan`: the releases in order (consecutive equal steps may share one event), all at one sampling
// rate, accounted with `kind` (ComputeEpsilon's; the caller resolves ComputeSpend's rule). The
// calibration is for Gaussian steps, which is also the bound of a distributed plan's events (tau =
// 0). Errors: the accountant's.
StatusOr<BudgetFit> FitBudget(std::span<const DpEvent> plan, double budget_epsilon, double delta,
                              AccountantKind kind);
// The most leading steps of `plan` whose spend stays within `budget_epsilon` (0: not even one),
// by bisection over the step count: about log2(steps) accountant evaluations.
StatusOr<int64_t> StepsWithinBudget(std::span<const DpEvent> plan, double budget_epsilon,
                                    double delta, AccountantKind kind);

// Whether a federated plan's rounds all fit its total (PrivacyPlan::Fit).
struct PlanFit {
  int64_t rounds = 0;                    // the job's rounds
  Spend spend;                           // what all of them spend, at the job's delta
  std::optional<double> budget_epsilon;  // privacy.epsilon (none: nothing caps the plan)
  bool fits = true;
  int64_t rounds_that_fit = 0;  // the most leading rounds within the total (all when it fits)
  // When it does not fit: one noise multiplier, as configured (twice the accounted one under
  // replace-one), with which every round fits the total; nullopt when none up to 1e12 does.
  std::optional<double> noise_multiplier_that_fits;
  std::vector<PlannedRange> schedule;

  // When it does not fit, e.g. (q = 0.5) "privacy.epsilon: 40 rounds at noise_multiplier 2 spend
  // epsilon 9.067 at delta 1e-05, past the total 3: 4 rounds fit (rounds: 4), or noise_multiplier
  // >= 4.9 fits all 40" (z rounded up at its third digit); "" when it fits.
  std::string Shortfall() const;
};

// The standard deviation of the noise on each value of a round's mean update, as a multiple of the
// clip norm, for noise multiplier z and `contributions` updates in the mean: central mode z /
// contributions (one draw of std z*C on the sum, divided by the fixed denominator), distributed
// z / contributions (the honest shares' noise on the sum, divided by the results), local
// z / sqrt(contributions) (every update carries its own draw of std z*C; the mean of n independent
// draws has std z*C / sqrt(n)). 0 in mode none.
double MeanNoiseToClip(PrivacyMode mode, double noise_multiplier, double contributions);

class PrivacyPlan {
 public:
  // Validates `options` for a job of `rounds` rounds whose cohorts are Poisson-sampled with rate
  // `cohort_rate` (central mode; ignored for a participation-bounded plan, which is unsampled), and
  // calibrates the noise (bounded: so that max_participations releases fit the total). Errors name
  // the offending key (privacy.*) and say what is allowed.
  static StatusOr<PrivacyPlan> Create(const PrivacyOptions& options, double cohort_rate,
                                      int64_t rounds);

  const PrivacyOptions& options() const { return options_; }
  bool enabled() const { return options_.mode != PrivacyMode::kNone; }
  // The q the accountant uses: the cohort rate in central mode, 1 in local and distributed mode.
  double accounting_rate() const { return accounting_rate_; }
  // kAddRemove (central) or kReplaceOne (local, distributed, and every participation-bounded
  // plan).
  const char* adjacency() const;
  // Participation-bounded accounting (PrivacyOptions::max_participations).
  bool bounded() const { return options_.max_participations.has_value(); }
  // The releases one client can have contributed to: all of `events` unless bounded; bounded, the
  // max_participations most expensive steps among them (the smallest noise multipliers; events
  // of a bounded plan are unsampled Gaussians, whose cost falls as z grows). Spent, WouldSpend
  // and Fit account these.
  std::vector<DpEvent> WorstParticipant(std::vector<DpEvent> events) const;
  // The accountant's event of one round with noise multiplier z (z / 2 under replace-one). In
  // distributed mode a distributed discrete Gaussian with tau 0: the plan. The round's own event
  // comes from its grid and members once secure aggregation has sized them (its ledger entry).
  DpEvent RoundEvent(double noise_multiplier) const;
  // Round `round` in [1, rounds].
  RoundPrivacy ForRound(uint64_t round) const;
  int64_t rounds() const { return static_cast<int64_t>(rounds_.size()); }
  // The rounds as runs of equal noise multiplier and clip norm, in order.
  std::vector<PlannedRange> Schedule() const;
  // The accountant's events of rounds 1..last (each run of equal rounds one event of many steps).
  std::vector<DpEvent> PlannedEvents(int64_t last) const;
  // What all the plan's rounds spend against privacy.epsilon, and what fits when they pass it
  // (the rounds, and one noise multiplier for all of them). With no total every plan fits.
  StatusOr<PlanFit> Fit() const;

  // Epsilon at the job's delta after `events`.
  StatusOr<Spend> Spent(const std::vector<DpEvent>& events) const;
  // Epsilon if round `round` were run after `events`; .second is true if that passes the total.
  StatusOr<std::pair<Spend, bool>> WouldSpend(std::vector<DpEvent> events, uint64_t round) const;
  // The same for a given event of the next round.
  StatusOr<std::pair<Spend, bool>> WouldSpendEvent(std::vector<DpEvent> events,
                                                   const DpEvent& next) const;

 private:
  PrivacyOptions options_;
  double accounting_rate_ = 1;
  // The accountant the plan's spend uses (ComputeSpend's rule for its events: kAnalytic when
  // unsampled, kRdp in distributed mode, else the configured one); calibration uses it too.
  AccountantKind spend_accountant_ = AccountantKind::kRdp;
  std::vector<RoundPrivacy> rounds_;  // index round - 1
};

// z_value of the adaptive split (see above), or InvalidArgument when 2 * count_stddev <= z.
StatusOr<double> ValueNoiseMultiplier(double noise_multiplier, double count_stddev);

}  // namespace huddle::privacy
