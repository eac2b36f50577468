// The coordinator's client-level DP (privacy/budget.h, docs/privacy.md): budget checks before a
// round, the round's clip norm and noise grid, the norm check of every central-mode update, and the
// release of the round's update: exact discrete Gaussian noise added to the exact integer sum, the
// durable ledger entry, then the mean over the expected cohort size.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "coordinator/coordinator.h"
#include "privacy/clip.h"

namespace huddle::coordinator {
namespace {

using privacy::PrivacyMode;

constexpr size_t kNoiseChunk = size_t{1} << 16;

std::string LedgerPath(const std::string& dir) {
  return (std::filesystem::path(dir) / privacy::kLedgerFile).string();
}

}  // namespace

Status Coordinator::InitialisePrivacy(double checkpoint_clip_norm) {
  const privacy::PrivacyOptions& p = options_.privacy;
  if (p.mode == PrivacyMode::kNone) return absl::OkStatus();
  if (p.mode == PrivacyMode::kCentral &&
      options_.cohort.sampling != CohortOptions::Sampling::kPoisson) {
    return absl::InvalidArgumentError(
        "privacy.mode central needs cohort.sampling: poisson (amplification by sampling holds "
        "only for Poisson-sampled cohorts)");
  }
  if (options_.out_dir.empty()) {
    return absl::InvalidArgumentError(
        "privacy needs an output directory (output.dir or --out) for its durable ledger");
  }
  HUDDLE_ASSIGN_OR_RETURN(auto plan,
                          privacy::PrivacyPlan::Create(p, options_.cohort.rate, options_.rounds));
  privacy_.emplace(std::move(plan));
  const std::string path = LedgerPath(options_.out_dir);
  HUDDLE_ASSIGN_OR_RETURN(auto ledger, privacy::PrivacyLedger::Open(path));
  if (!options_.resume && !ledger.entries().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " records ", ledger.entries().size(),
        " DP releases of an earlier run: continue that job with --resume, or use a new output "
        "directory (deleting the ledger would forget privacy already spent)"));
  }
  ledger_.emplace(std::move(ledger));
  if (p.noise_seed) {
    noise_.emplace(privacy::NoiseSource::SeededForTesting(*p.noise_seed));
    spdlog::warn(
        "privacy.noise_seed is set: the DP noise is reproducible and NOT PRIVATE (anyone with the "
        "seed can remove it); use it only for tests and experiments");
  } else {
    noise_.emplace(privacy::NoiseSource::Secure());
  }
  clip_norm_ = checkpoint_clip_norm > 0 ? checkpoint_clip_norm : privacy_->ForRound(1).clip_norm;
  HUDDLE_ASSIGN_OR_RETURN(privacy::Spend spent, privacy_->Spent(ledger_->Events()));
  if (!ledger_->entries().empty()) {
    summary_.epsilon = spent.epsilon;
    summary_.delta = spent.delta;
  }
  spdlog::info("privacy: {} DP, delta {:g}, {} ledger entries, epsilon spent {:.6g}{}",
               privacy::PrivacyModeName(p.mode), p.delta, ledger_->entries().size(), spent.epsilon,
               p.total_epsilon ? fmt::format(" of {:g}", *p.total_epsilon) : std::string());
  return absl::OkStatus();
}

StatusOr<bool> Coordinator::PrivacyAllowsRound(uint64_t number, std::string* why) {
  if (!dp()) return true;
  HUDDLE_ASSIGN_OR_RETURN(auto would, privacy_->WouldSpend(ledger_->Events(), number));
  if (!would.second) return true;
  HUDDLE_ASSIGN_OR_RETURN(privacy::Spend spent, privacy_->Spent(ledger_->Events()));
  *why = fmt::format(
      "privacy budget: round {} would raise epsilon to {:.6g}, past the total {:g} (delta {:g}); "
      "stopping with epsilon {:.6g} spent",
      number, would.first.epsilon, *options_.privacy.total_epsilon, options_.privacy.delta,
      spent.epsilon);
  return false;
}

Status Coordinator::ConfigureRoundPrivacy(Round& round) {
  const privacy::PrivacyOptions& p = options_.privacy;
  const privacy::RoundPrivacy plan = privacy_->ForRound(round.number);
  round.noise_multiplier = plan.noise_multiplier;
  round.value_noise_multiplier = plan.noise_multiplier;
  round.clip_norm = p.adaptive.enabled ? clip_norm_ : plan.clip_norm;
  const double population = static_cast<double>(LiveClients());
  const double q =
      options_.cohort.sampling == CohortOptions::Sampling::kPoisson
          ? options_.cohort.rate
          : std::min(1.0, static_cast<double>(options_.cohort.size) / std::max(1.0, population));
  round.expected_cohort = std::max(q * population, 1.0);
  aggregation::AggregatorOptions agg = options_.aggregation;
  agg.max_weight = 1;
  if (p.mode == PrivacyMode::kLocal) {
    // Each update carries noise of std z*C: bound values far beyond any honest draw.
    agg.max_abs_value = round.clip_norm * (1 + 64 * round.noise_multiplier);
    agg.fraction_bits = -1;
    return aggregator_->Reset(agg);
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
                                                static_cast<int64_t>(aggregator_->size())));
  agg.max_abs_value = round.clip_norm;
  agg.fraction_bits = -grid.exponent;
  if (agg.fraction_bits < 0) {
    return absl::InvalidArgumentError(fmt::format(
        "noise std {:g} is too large for the fixed-point sum (clip_norm {:g} x noise multiplier "
        "{:g})",
        grid.stddev(), round.clip_norm, round.value_noise_multiplier));
  }
  return aggregator_->Reset(agg);
}

Status Coordinator::CheckUpdateNorm(const Round& round,
                                    std::span<const std::span<const float>> update) const {
  if (options_.privacy.mode != PrivacyMode::kCentral) return absl::OkStatus();
  const double norm = privacy::L2Norm(update);
  // A non-finite norm means a non-finite value: Fold refuses it naming the element.
  if (std::isfinite(norm) && norm > round.clip_norm) {
    return absl::InvalidArgumentError(fmt::format(
        "update L2 norm {:.9g} exceeds the round's clip norm {:.9g} (privacy.clip_norm)", norm,
        round.clip_norm));
  }
  return absl::OkStatus();
}

Status Coordinator::PrivateMean(Round& round, TensorList* mean) {
  const privacy::PrivacyOptions& p = options_.privacy;
  const bool central = p.mode == PrivacyMode::kCentral;
  RoundMetrics::Privacy info;
  info.mode = privacy::PrivacyModeName(p.mode);
  info.noise_multiplier = round.noise_multiplier;
  info.clip_norm = round.clip_norm;
  info.budget_epsilon = p.total_epsilon;
  double next_clip = clip_norm_;
  if (central) {
    const auto t0 = std::chrono::steady_clock::now();
    HUDDLE_ASSIGN_OR_RETURN(const privacy::NoiseGrid grid,
                            privacy::NoiseGridFor(round.value_noise_multiplier, round.clip_norm,
                                                  static_cast<int64_t>(aggregator_->size())));
    HUDDLE_ASSIGN_OR_RETURN(const auto gaussian, privacy::DiscreteGaussian::Create(grid.variance));
    std::vector<int64_t> units(std::min(kNoiseChunk, aggregator_->size()));
    for (size_t begin = 0; begin < aggregator_->size(); begin += units.size()) {
      const size_t n = std::min(units.size(), aggregator_->size() - begin);
      for (size_t i = 0; i < n; ++i) units[i] = gaussian.Sample(*noise_);
      HUDDLE_RETURN_IF_ERROR(aggregator_->AddUnits(begin, std::span(units.data(), n)));
    }
    info.noise_stddev = grid.stddev();
    if (p.adaptive.enabled) {
      // Andrew et al. 2021: sum of (bit - 1/2), in units of 1/2 so its sensitivity is 1, plus
      // discrete Gaussian noise of std 2 * sigma_b in those units.
      const int64_t halves = 2 * round.within_clip - round.metrics.results;
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
  }
  // Durable before anything computed from the noised sum leaves this function.
  privacy::LedgerEntry entry;
  entry.round = round.number;
  entry.sampling_rate = privacy_->accounting_rate();
  entry.noise_multiplier = round.noise_multiplier;
  entry.clip_norm = round.clip_norm;
  entry.mode = info.mode;
  entry.noise = central ? noise_->Describe() : "client-side";
  HUDDLE_RETURN_IF_ERROR(ledger_->Append(entry));
  HUDDLE_ASSIGN_OR_RETURN(privacy::Spend spent, privacy_->Spent(ledger_->Events()));
  info.epsilon = spent.epsilon;
  info.delta = spent.delta;
  info.accountant = privacy::AccountantName(spent.accountant);
  summary_.epsilon = spent.epsilon;
  summary_.delta = spent.delta;
  clip_norm_ = next_clip;
  round.metrics.privacy = info;
  // Central: divide by the expected cohort size, never the realized count (that would make the
  // sensitivity depend on the cohort). Local: the updates are already private; the same estimator.
  return aggregator_->Finalize(round.expected_cohort, mean);
}

}  // namespace huddle::coordinator
