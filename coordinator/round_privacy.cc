// The coordinator's client-level DP (round_privacy.h; privacy/budget.h, docs/privacy.md): budget
// checks before a round, the round's clip norm and noise grid, the norm check of every update, and
// the release of the round's update: exact discrete Gaussian noise added to the exact integer sum,
// the durable ledger entry, then the mean over the expected cohort size.
#include "coordinator/round_privacy.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <set>

#include "coordinator/secure_round.h"
#include "privacy/clip.h"
#include "privacy/report.h"

namespace huddle::coordinator {
namespace {

using privacy::PrivacyMode;

constexpr size_t kNoiseChunk = size_t{1} << 16;

}  // namespace

StatusOr<RoundPrivacy> RoundPrivacy::Open(const CoordinatorOptions* options,
                                          double checkpoint_clip_norm, uint64_t resumed_round) {
  RoundPrivacy rp(options);
  const privacy::PrivacyOptions& p = options->privacy;
  // Without DP the checkpoint's value is kept as it was (it is written back unchanged).
  rp.clip_norm_ = checkpoint_clip_norm;
  if (p.mode == PrivacyMode::kNone) return rp;
  if (p.mode == PrivacyMode::kCentral && !options->async.enabled &&
      options->cohort.sampling != CohortOptions::Sampling::kPoisson) {
    return absl::InvalidArgumentError(
        "privacy.mode central needs cohort.sampling: poisson (amplification by sampling holds "
        "only for Poisson-sampled cohorts)");
  }
  if (options->out_dir.empty()) {
    return absl::InvalidArgumentError(
        "privacy needs an output directory (output.dir or --out) for its durable ledger");
  }
  HUDDLE_ASSIGN_OR_RETURN(auto plan,
                          privacy::PrivacyPlan::Create(p, options->cohort.rate, options->rounds));
  rp.plan_.emplace(std::move(plan));
  HUDDLE_ASSIGN_OR_RETURN(auto ledger,
                          privacy::JobLedger::Open(options->out_dir, {.resume = options->resume}));
  // Every DP round appends its entry before it completes, so a checkpoint after round R needs
  // entries for rounds 1..R.
  HUDDLE_RETURN_IF_ERROR(ledger.CheckRoundsCovered(resumed_round));
  rp.ledger_.emplace(std::move(ledger));
  if (p.noise_seed) {
    rp.noise_.emplace(privacy::NoiseSource::SeededForTesting(*p.noise_seed));
    spdlog::warn(
        "privacy.noise_seed is set: the DP noise and the cohorts are reproducible and the job is "
        "NOT PRIVATE (anyone with the seed can remove the noise); use it only for tests");
  } else {
    rp.noise_.emplace(privacy::NoiseSource::Secure());
    // Cohorts and client seeds: a separate OS-keyed stream, so that no participant can predict
    // who is sampled (amplification by sampling assumes it) and a re-run round draws afresh.
    rp.sampler_.emplace(privacy::NoiseSource::Secure());
  }
  rp.clip_norm_ = checkpoint_clip_norm > 0 ? checkpoint_clip_norm : rp.plan_->ForRound(1).clip_norm;
  HUDDLE_ASSIGN_OR_RETURN(privacy::Spend spent, rp.plan_->Spent(rp.ledger_->Events()));
  if (!rp.ledger_->entries().empty()) rp.spent_ = spent;
  // What all the planned rounds spend, restated in privacy.json (null there if the accountant
  // cannot say: the job's own releases are accounted round by round all the same).
  if (auto planned = rp.plan_->Spent(rp.plan_->PlannedEvents(rp.plan_->rounds())); planned.ok()) {
    rp.planned_epsilon_ = planned->epsilon;
  }
  spdlog::info("privacy: {} DP, delta {:g}, {} ledger entries, epsilon spent {:.6g}{}",
               privacy::PrivacyModeName(p.mode), p.delta, rp.ledger_->entries().size(),
               spent.epsilon,
               p.total_epsilon ? fmt::format(" of {:g}", *p.total_epsilon) : std::string());
  return rp;
}

StatusOr<std::optional<std::string>> RoundPrivacy::StopBefore(uint64_t number) const {
  if (!enabled()) return std::nullopt;
  HUDDLE_ASSIGN_OR_RETURN(auto would, plan_->WouldSpend(ledger_->Events(), number));
  if (!would.second) return std::nullopt;
  HUDDLE_ASSIGN_OR_RETURN(privacy::Spend spent, plan_->Spent(ledger_->Events()));
  return fmt::format(
      "privacy budget: round {} would raise epsilon to {:.6g}, past the total {:g} (delta {:g}); "
      "stopping with epsilon {:.6g} spent",
      number, would.first.epsilon, *options_->privacy.total_epsilon, options_->privacy.delta,
      spent.epsilon);
}

Status RoundPrivacy::Configure(uint64_t number, PrivateRound* out,
                               aggregation::StreamingAggregator* aggregator) {
  const privacy::PrivacyOptions& p = options_->privacy;
  const privacy::RoundPrivacy plan = plan_->ForRound(number);
  *out = PrivateRound{};
  out->number = number;
  PrivateRound& round = *out;
  round.noise_multiplier = plan.noise_multiplier;
  round.value_noise_multiplier = plan.noise_multiplier;
  round.clip_norm = p.adaptive.enabled ? clip_norm_ : plan.clip_norm;
  // Central: the configured denominator, which depends on no one's enrolment (PrivacyPlan
  // requires it); a buffered asynchronous step's is its buffer. Local: the mean over the results
  // (Release).
  round.expected_cohort = options_->async.enabled ? static_cast<double>(options_->async.buffer)
                                                  : p.expected_cohort_size.value_or(1.0);
  aggregation::AggregatorOptions agg = options_->aggregation;
  agg.max_weight = 1;
  if (p.mode == PrivacyMode::kDistributed) {
    // The clients' noise shares join their updates inside the secure sum (SecureRound::Start);
    // nothing is folded here.
    return aggregator->Reset(agg);
  }
  if (p.mode == PrivacyMode::kLocal) {
    // The client clips to C, rounds onto the noise grid g and adds discrete Gaussian noise of
    // parameter s (sub-Gaussian with it) to each of the d values. So ||update|| <= C + g sqrt(d)/2
    // + ||noise||, and ||noise||^2 <= s^2 (d + 2 sqrt(d t) + 2t) but with probability e^-t (Hsu,
    // Kakade and Zhang 2012, Theorem 1); t = 40. A longer update is no honest client's release.
    const auto d = static_cast<int64_t>(aggregator->size());
    HUDDLE_ASSIGN_OR_RETURN(const privacy::NoiseGrid grid,
                            privacy::NoiseGridFor(round.noise_multiplier, round.clip_norm, d));
    constexpr double t = 40;
    const double dd = static_cast<double>(d);
    const double noise = grid.stddev() * std::sqrt(dd + 2 * std::sqrt(dd * t) + 2 * t);
    round.local_norm_bound =
        (round.clip_norm + grid.grid() * std::sqrt(dd) / 2 + noise) * (1 + 1e-6);
    // Each update carries noise of std z*C: bound values far beyond any honest draw.
    agg.max_abs_value = round.clip_norm * (1 + 64 * round.noise_multiplier);
    agg.fraction_bits = -1;
    return aggregator->Reset(agg);
  }
  if (p.adaptive.enabled) {
    if (count_stddev_ == 0) {
      count_stddev_ =
          p.adaptive.count_stddev > 0 ? p.adaptive.count_stddev : round.expected_cohort / 20.0;
    }
    HUDDLE_ASSIGN_OR_RETURN(round.value_noise_multiplier,
                            privacy::ValueNoiseMultiplier(round.noise_multiplier, count_stddev_));
  }
  // The sum's fixed-point grid is the noise grid, so the noise joins the exact sum exactly.
  HUDDLE_ASSIGN_OR_RETURN(const privacy::NoiseGrid grid,
                          privacy::NoiseGridFor(round.value_noise_multiplier, round.clip_norm,
                                                static_cast<int64_t>(aggregator->size())));
  agg.max_abs_value = round.clip_norm;
  agg.fraction_bits = -grid.exponent;
  if (agg.fraction_bits < 0) {
    return absl::InvalidArgumentError(fmt::format(
        "noise std {:g} is too large for the fixed-point sum (clip_norm {:g} x noise multiplier "
        "{:g})",
        grid.stddev(), round.clip_norm, round.value_noise_multiplier));
  }
  return aggregator->Reset(agg);
}

wire::UpdatePrivacy RoundPrivacy::Instruction(const PrivateRound& round) const {
  wire::UpdatePrivacy out;
  const privacy::PrivacyMode mode = plan_->options().mode;
  const bool local = mode == privacy::PrivacyMode::kLocal;
  out.mode = local                                        ? wire::UpdatePrivacy::Mode::kLocal
             : mode == privacy::PrivacyMode::kDistributed ? wire::UpdatePrivacy::Mode::kDistributed
                                                          : wire::UpdatePrivacy::Mode::kCentral;
  out.clip_norm = round.clip_norm;
  if (local) out.noise_multiplier = round.noise_multiplier;
  return out;
}

Status RoundPrivacy::CheckUpdate(const PrivateRound& round,
                                 std::span<const std::span<const float>> update) const {
  const double norm = privacy::L2Norm(update);
  // A non-finite norm means a non-finite value: Fold refuses it naming the element.
  if (!std::isfinite(norm)) return absl::OkStatus();
  if (options_->privacy.mode == PrivacyMode::kCentral) {
    if (norm > round.clip_norm) {
      return absl::InvalidArgumentError(fmt::format(
          "update L2 norm {:.9g} exceeds the round's clip norm {:.9g} (privacy.clip_norm)", norm,
          round.clip_norm));
    }
    return absl::OkStatus();
  }
  if (norm > round.local_norm_bound) {
    return absl::InvalidArgumentError(fmt::format(
        "update L2 norm {:.9g} exceeds {:.9g}, the most a clipped update (privacy.clip_norm "
        "{:.9g}) plus the round's noise (multiplier {:.9g}) can reach",
        norm, round.local_norm_bound, round.clip_norm, round.noise_multiplier));
  }
  return absl::OkStatus();
}

RoundMetrics::Privacy RoundPrivacy::Info(const PrivateRound& round) const {
  const privacy::PrivacyOptions& p = options_->privacy;
  RoundMetrics::Privacy info;
  info.mode = privacy::PrivacyModeName(p.mode);
  info.noise_multiplier = round.noise_multiplier;
  info.clip_norm = round.clip_norm;
  info.budget_epsilon = p.total_epsilon;
  return info;
}

Status RoundPrivacy::RecordSpent(RoundMetrics::Privacy info, RoundMetrics* metrics) {
  HUDDLE_ASSIGN_OR_RETURN(privacy::Spend spent, plan_->Spent(ledger_->Events()));
  info.epsilon = spent.epsilon;
  info.is_private = ledger_->IsPrivate(Session());  // this round's entry included
  info.delta = spent.delta;
  info.accountant = privacy::AccountantName(spent.accountant);
  spent_ = spent;
  metrics->privacy = std::move(info);
  return absl::OkStatus();
}

Status RoundPrivacy::Release(PrivateRound& round, int64_t results,
                             aggregation::StreamingAggregator* aggregator,
                             const SecureRound* secure, RoundMetrics* metrics, TensorList* mean) {
  const privacy::PrivacyOptions& p = options_->privacy;
  const bool central = p.mode == PrivacyMode::kCentral;
  const TensorList* secure_sum = secure != nullptr && secure->sum() ? &*secure->sum() : nullptr;
  RoundMetrics::Privacy info = Info(round);
  double next_clip = clip_norm_;
  if (central) {
    const auto t0 = std::chrono::steady_clock::now();
    HUDDLE_ASSIGN_OR_RETURN(const privacy::NoiseGrid grid,
                            privacy::NoiseGridFor(round.value_noise_multiplier, round.clip_norm,
                                                  static_cast<int64_t>(aggregator->size())));
    HUDDLE_ASSIGN_OR_RETURN(const auto gaussian, privacy::DiscreteGaussian::Create(grid.variance));
    std::vector<int64_t> units(std::min(kNoiseChunk, aggregator->size()));
    for (size_t begin = 0; begin < aggregator->size(); begin += units.size()) {
      const size_t n = std::min(units.size(), aggregator->size() - begin);
      for (size_t i = 0; i < n; ++i) units[i] = gaussian.Sample(*noise_);
      HUDDLE_RETURN_IF_ERROR(aggregator->AddUnits(begin, std::span(units.data(), n)));
    }
    info.noise_stddev = grid.stddev();
    if (p.adaptive.enabled) {
      // Andrew et al. 2021: sum of (bit - 1/2), in units of 1/2 so its sensitivity is 1, plus
      // discrete Gaussian noise of std 2 * sigma_b in those units.
      const int64_t halves = 2 * round.within_clip - results;
      const double s = std::ceil(4.0 * count_stddev_ * count_stddev_);
      HUDDLE_ASSIGN_OR_RETURN(const auto count_noise,
                              privacy::DiscreteGaussian::Create(static_cast<uint64_t>(s)));
      const double noised = static_cast<double>(halves + count_noise.Sample(*noise_));
      const double fraction = noised / (2.0 * round.expected_cohort) + 0.5;
      next_clip = round.clip_norm *
                  std::exp(-p.adaptive.learning_rate * (fraction - p.adaptive.target_quantile));
      info.within_clip = round.within_clip;
      info.next_clip_norm = next_clip;
    }
    info.noise_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    info.noise_stddev = round.noise_multiplier * round.clip_norm;
    // Local: every update is private on its own; distributed: the coordinator knows who took
    // part. Either way the mean over the results is post-processing.
    round.expected_cohort = static_cast<double>(std::max<int64_t>(1, results));
  }
  // Durable before anything computed from the noised sum leaves this function.
  privacy::LedgerEntry entry;
  if (p.mode != PrivacyMode::kDistributed) {
    entry = privacy::LedgerEntry::ClientGaussian(
        info.mode, round.number, plan_->accounting_rate(), round.noise_multiplier, round.clip_norm,
        plan_->adjacency(), central ? noise_->Describe() : privacy::kNoiseClientSide);
    entry.job = options_->job_name;
  } else {
    if (secure != nullptr && secure->distributed()) {
      entry = *secure->distributed();  // the shares the members were told to add
    } else {
      // No secure session this round (a cohort too small): nothing was released, accounted as
      // planned all the same (an over-count is safe).
      privacy::DpEvent planned;
      planned.noise_multiplier = round.noise_multiplier;
      planned.dimension = static_cast<int64_t>(aggregator->size());
      entry = privacy::LedgerEntry::DistributedSum(round.number, planned, round.clip_norm,
                                                   privacy::kNoiseClientSide);
      entry.job = options_->job_name;
    }
    info.noise_multiplier = entry.noise_multiplier;
    if (secure != nullptr) {
      // The std of the noise the honest shares guarantee in the sum, per value, in the model's
      // units (as central DP's: before the mean divides it): sqrt(m s) grid steps.
      info.noise_stddev = secure->SumNoiseStddev();
    }
  }
  // Distributed DP appends before unmasking (SecureRound, stage 5); a round refused earlier
  // released no sum, and is accounted here all the same.
  const bool accounted = secure != nullptr && secure->accounted();
  if (!accounted) HUDDLE_RETURN_IF_ERROR(ledger_->Append(entry));
  HUDDLE_RETURN_IF_ERROR(RecordSpent(std::move(info), metrics));
  clip_norm_ = next_clip;
  // Central: divide by the expected cohort size, never the realized count (that would make the
  // sensitivity depend on the cohort). Local: the updates are already private; the same estimator.
  if (secure_sum != nullptr) {
    *mean = *secure_sum;
    for (Tensor& t : *mean) {
      for (float& v : t.data) v = static_cast<float>(v / round.expected_cohort);
    }
    return absl::OkStatus();
  }
  return aggregator->Finalize(round.expected_cohort, mean);
}

StatusOr<std::pair<privacy::Spend, bool>> RoundPrivacy::WouldSpend(
    const privacy::LedgerEntry& entry) const {
  return plan_->WouldSpendEvent(ledger_->Events(), entry.event());
}

Status RoundPrivacy::Account(const privacy::LedgerEntry& entry) { return ledger_->Append(entry); }

Status RoundPrivacy::NoRelease(const PrivateRound& round, const SecureRound* secure,
                               RoundMetrics* metrics) {
  HUDDLE_RETURN_IF_ERROR(RecordSpent(Info(round), metrics));
  spdlog::warn("round {}: secure aggregation released nothing; the model is unchanged{}",
               round.number,
               secure != nullptr && secure->accounted()
                   ? " (the round is in the ledger: its unmasking had begun)"
                   : " and nothing is charged");
  return absl::OkStatus();
}

privacy::SessionNoise RoundPrivacy::Session() const {
  return {
      .is_private = private_noise(),
      .why_not =
          "privacy.noise_seed is set: the noise (and the cohorts) can be recomputed from the seed",
      .adds_releases = true};
}

std::vector<std::string> RoundPrivacy::NotPrivateBecause() const {
  if (!enabled()) return {};
  return ledger_->NotPrivateBecause("round", Session());
}

Status RoundPrivacy::WriteDpSgdReport(const std::string& stop_reason) const {
  const wire::DpSgdConfig& d = *options_->train.dp_sgd;
  privacy::PrivacyReport r;
  r.job = options_->job_name;
  r.scope = "federated";
  r.unit = privacy::kUnitExample;
  r.adjacency = privacy::kAddRemove;
  r.delta = d.delta;
  r.mechanism = fmt::format(
      "DP-SGD inside each client (models/dp_sgd.h): Poisson-subsampled Gaussian over the client's "
      "own examples, per-example clipping to L2 norm {:g}, exact discrete Gaussian noise of "
      "multiplier {:g} on the exact sum of clipped gradients, expected batch {}, {} epoch(s) a "
      "round; the client's update is released only as post-processing of its DP-SGD steps",
      d.clip_norm, d.noise_multiplier, d.expected_batch_size, options_->train.epochs);
  r.sampling =
      "Poisson within each client's data (rate expected_batch_size / n), drawn by the client from "
      "its OS CSPRNG; the coordinator never sees the sample";
  r.accountant = "each client's own (its privacy.dp_sgd.accountant, RDP by default)";
  r.noise_source = "each client's own (OS CSPRNG)";
  r.epsilon_kept_by =
      "each client's own ledger (huddle client's privacy.ledger; with huddle run "
      "OUT/clients/ID/privacy_ledger.jsonl): a client's spend depends on its number of examples, "
      "which it does not report, and each client refuses rounds past its own "
      "privacy.dp_sgd.max_epsilon";
  r.stopped_early = stop_reason;
  r.assumptions = {
      "the unit of privacy is one example of one client's data; the coordinator and everyone who "
      "sees the models are covered",
      "each client runs Huddle's DP-SGD with the instruction's settings, which its own policy "
      "checks (privacy.dp_sgd.min_noise_multiplier); a client without a policy trusts the "
      "coordinator's settings",
      "the float rounding inside the chunks a neighbouring data set changes is not accounted "
      "(docs/privacy.md)",
  };
  r.not_covered = {
      "client-level privacy: which clients took part, and anything about a client's data as a "
      "whole (use privacy.mode for that)",
      "the coordinator's logs and metrics about clients (counts, timings, traffic)",
  };
  return privacy::WritePrivacyReport(options_->out_dir, r);
}

void RoundPrivacy::DescribeBounded(privacy::PrivacyReport* r) const {
  const privacy::PrivacyOptions& p = options_->privacy;
  const AsyncOptions& a = options_->async;
  const bool central = p.mode == PrivacyMode::kCentral;
  r->mechanism = fmt::format(
      "buffered asynchronous DP-FedAvg (FedBuff) with {} noise: each server step releases the sum "
      "of at most async.buffer = {} updates, each clipped to L2 norm C ({}), weighted 1 and "
      "scaled by its staleness factor (<= 1), {}divided by the "
      "fixed {}; every client contributes to at most privacy.max_participations = {} steps, at "
      "least privacy.min_separation = {} steps apart (enforced by the coordinator, "
      "contributions.jsonl), and the epsilon is the composition of the {} most expensive steps "
      "released: the most any one client's releases can spend",
      central ? "central" : "local", a.buffer,
      central ? "checked by the coordinator"
              : "by the client, which adds its own noise of std z * C to it; the coordinator "
                "refuses an update longer than a clipped, noised one can be",
      central ? "with exact discrete Gaussian noise of std >= z * (C + grid rounding) added to the "
                "sum, "
              : "",
      central ? fmt::format("denominator async.buffer = {}", a.buffer)
              : "number of updates in the step",
      *p.max_participations, p.min_separation, *p.max_participations);
  r->sampling =
      "none assumed: asynchronous arrival is not Poisson sampling (fast clients come more often, "
      "and when a client answers may depend on its data), so no amplification is claimed; each "
      "release is accounted unsampled (q = 1) for every client that can have contributed to it, "
      "and a client's contributions are bounded instead";
  std::vector<std::string> assumptions = {
      "replace-one adjacency: a client's data replaced by any other changes its (clipped, "
      "staleness-scaled) contribution to a step by up to 2C, so each step is accounted as a "
      "Gaussian mechanism with multiplier z / 2",
      "which steps a client's updates land in, and its staleness, do not depend on its data "
      "beyond what the released models already reveal: the schedule (who is sent which model "
      "when, and when each answers) is not protected; a client whose speed depends on its data "
      "leaks that through timing, as any federated job's timing does",
      fmt::format(
          "the bound of {} contributions per client holds for each client identity: a person "
          "whose data is spread over several enrolled clients is protected only to the extent of "
          "the composition over those clients",
          *p.max_participations),
  };
  if (central) {
    assumptions.insert(
        assumptions.begin(),
        "the coordinator is trusted (honest): it sees each client's clipped update in the clear, "
        "enforces the participation bound and adds the noise; the guarantee protects the released "
        "models and outputs against everyone else");
  } else {
    assumptions.insert(
        assumptions.begin(),
        "against a coordinator that follows the protocol, the participation bound is enforced "
        "by it; against one that does not, each client's own privacy policy and ledger (huddle "
        "client's privacy section, whose max_epsilon composes every release the client made) "
        "are what bind it");
  }
  r->assumptions = std::move(assumptions);
}

Status RoundPrivacy::WriteReport(const std::string& stop_reason) const {
  if (!enabled()) return options_->train.dp_sgd ? WriteDpSgdReport(stop_reason) : absl::OkStatus();
  const privacy::PrivacyOptions& p = options_->privacy;
  const bool central = p.mode == PrivacyMode::kCentral;
  privacy::PrivacyReport r;
  r.job = options_->job_name;
  r.scope = "federated";
  r.unit = privacy::kUnitClient;
  r.adjacency = plan_->adjacency();
  r.delta = p.delta;
  r.budget_epsilon = p.total_epsilon;
  privacy::ReportPlan planned;
  planned.rounds_planned = plan_->rounds();
  std::set<uint64_t> run;
  for (const privacy::LedgerEntry& e : ledger_->entries()) run.insert(e.round);
  planned.rounds_run = static_cast<int64_t>(run.size());
  planned.epsilon = planned_epsilon_;
  planned.stop_at_budget = p.stop_at_budget;
  planned.noise_schedule = plan_->Schedule();
  if (plan_->bounded()) {
    planned.participation =
        privacy::ReportPlan::Participation{*p.max_participations, p.min_separation};
  }
  r.plan = std::move(planned);
  HUDDLE_ASSIGN_OR_RETURN(const privacy::Spend spent, plan_->Spent(ledger_->Events()));
  r.nominal_epsilon = spent.epsilon;
  r.accountant = privacy::AccountantName(spent.accountant);
  r.noise_source = central ? noise_->Describe() : "each client's own (client-side)";
  // (Distributed: the members' shares come from their own sources, never the coordinator's.)
  r.not_private_because = NotPrivateBecause();
  r.is_private = r.not_private_because.empty();
  r.stopped_early = stop_reason;
  if (central) {
    r.mechanism = fmt::format(
        "DP-FedAvg with central noise: each update clipped to L2 norm C (checked by the "
        "coordinator), summed with weight 1 in exact fixed point, exact discrete Gaussian noise of "
        "std >= z * (C + grid rounding) added to the sum, divided by the fixed expected cohort "
        "size "
        "{:g}{}",
        p.expected_cohort_size.value_or(0),
        p.adaptive.enabled ? "; adaptive clipping (Andrew et al. 2021) spends part of each round's "
                             "noise on the clipped-count query, accounted in the same z"
                           : "");
    r.sampling = fmt::format(
        "Poisson: each live enrolled client independently with probability q = {:g}, drawn on "
        "the coordinator from {}; no participant sees the draws, and a client learns only its "
        "own participation. Amplification by sampling assumes the adversary does not learn "
        "whether the target client took part",
        options_->cohort.rate,
        sampler_ ? "the OS CSPRNG" : "the job seed (NOT secret: privacy.noise_seed)");
    r.assumptions = {
        "the coordinator is trusted: it sees each client's clipped update in the clear (central "
        "DP does not combine with secure aggregation: privacy.mode distributed does); the "
        "guarantee protects the released models and outputs",
        "the unit of privacy is one client's whole data; a person whose data is spread over "
        "several clients is protected only to the extent of the composition over those clients",
        "the adversary does not learn the cohort of a round (sampling above)",
        "epsilon is an upper bound from the accountant named above on the ledger's releases; "
        "every round that released a model is in the ledger, fsync'd before the release",
        "the fixed denominator does not depend on who enrolled",
    };
  } else if (p.mode == PrivacyMode::kDistributed) {
    const SecureAggregationOptions& a = options_->secure_aggregation;
    r.mechanism = fmt::format(
        "distributed DP under secure aggregation (SecAgg with certified members, a consistency "
        "round and a graph drawn from the members' joint randomness, aggregation/secagg/"
        "protocol.h): each client clips its update to L2 norm C, quantizes it onto the round's "
        "integer grid (stochastic rounding, so the L2 sensitivity on the grid is Delta = C 2^e + "
        "sqrt(d)), adds exact discrete Gaussian noise of variance s itself and masks it; any sum "
        "the coordinator can unmask, cheating or not, holds at least m = min_survivors - c - cut "
        "honest inputs (c = floor({:g} n) colluders, cut: the most that dropping members can "
        "split away, bounded over the graph's randomness to 2^-{}), and s is sized so that m "
        "honest shares sum to noise of std >= z Delta. Accounted per round by the RDP bound of "
        "Kairouz, Liu and Steinke 2021 for a sum of discrete Gaussians (each ledger entry's "
        "noise_multiplier is sqrt(m s) / Delta, with its tau and dimension)",
        a.graph.corrupt_fraction, a.graph.security_bits);
    r.sampling =
        "none assumed: the coordinator knows who took part, so every round is accounted as if "
        "each client took part (q = 1)";
    r.assumptions = {
        fmt::format(
            "holds against the coordinator even when it deviates from the protocol, with up to "
            "corrupt_fraction {:g} of each session colluding with it (each client checks the "
            "session against its own fraction and refuses a weaker one); it fails with "
            "probability at most 2^-{} per session over the graph's randomness "
            "(docs/security.md)",
            a.graph.corrupt_fraction, a.graph.security_bits),
        "the project key that certifies the members is held by someone who does not collude with "
        "the coordinator (it could otherwise certify members of its own)",
        "replace-one adjacency: a client's data replaced by any other changes its quantized "
        "update by up to 2 Delta, so each round is accounted with multiplier z / 2",
        "every honest client added the noise share it checked (a colluding client's share is not "
        "counted)",
        "the unit of privacy is one client's whole data; who took part, and when each client "
        "answered, are not protected (clients hold their replies to a fixed time by default)",
    };
  } else {
    r.mechanism =
        "local DP: each client clips its update to L2 norm C and adds exact discrete Gaussian "
        "noise of std z * C itself before sending it; the coordinator averages the results";
    r.sampling =
        "none assumed: the coordinator knows who took part, so every round is accounted as if "
        "each client took part (q = 1)";
    r.assumptions = {
        "replace-one adjacency: a client's data replaced by any other changes its update by up to "
        "2C, so each round is accounted as a Gaussian mechanism with multiplier z / 2",
        "the numbers here assume every client added the noise the coordinator asked for; a "
        "client's own privacy policy and ledger (huddle client's privacy section) are what bind "
        "it: a client refuses instructions beyond its policy and accounts every release itself",
        "the unit of privacy is one client's whole data",
    };
  }
  if (plan_->bounded()) DescribeBounded(&r);
  if (options_->train.dp_sgd) {
    r.assumptions.push_back(
        "the clients also train with DP-SGD: a separate, example-level guarantee that each client "
        "accounts in its own ledger; this report's epsilon is the client-level one");
  }
  r.not_covered = {
      "operator_metrics.jsonl, the coordinator's logs and its terminal output: counts of clients, "
      "results and examples, timings and traffic, computed without noise (operator-only)",
      "checkpoint.bin: operator-only (the model and server optimizer state)",
      "side channels: timing, message sizes, which clients are online",
  };
  return ledger_->WriteReport(std::move(r));
}

}  // namespace huddle::coordinator
