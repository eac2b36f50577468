// The coordinator's client-level DP (privacy/budget.h, docs/privacy.md), as one part: the job's
// privacy session and the only appender to its ledger.
//
// Owns: the job's privacy plan (privacy::PrivacyPlan), its ledger (privacy::JobLedger, durable,
// OUT/privacy_ledger.jsonl), the noise source (the OS CSPRNG, or a seeded one for tests: then the
// job is not private), the secret sampler of cohorts and client seeds, adaptive clipping's state
// (the next round's clip norm, sigma_b), and the latest spend.
// Borrows, per call: the round's aggregator (its options reset for the round, the noise added to
// its exact sum, its mean) and, under distributed DP, the round's SecureRound (its ledger entry).
//
// One round goes through it as:
//   StopBefore(n)  -> the budget check before round n is sampled (why it would exceed, if so);
//   Configure(n)   -> the round's clip norm, noise multipliers, denominator and norm bound
//                     (PrivateRound), and the aggregator's grid;
//   Instruction()  -> what each FitInstruction says (mode, C, local noise);
//   CheckUpdate()  -> every update's norm against the round's bound (central, local);
//   Release()      -> noise the sum (central), append the round's ledger entry (fsync'd) BEFORE the
//                     mean is formed, then the mean over the expected cohort; or NoRelease() for
//                     a secure round that released nothing (charged only if its unmasking began:
//                     SecureRound appends through WouldSpend/Account, the host's calls here);
//   WriteReport()  -> OUT/privacy.json from the ledger and the job's settings.
// A job without DP (mode none) has a disabled RoundPrivacy: only WriteReport() does anything (the
// example-level statement of clients training with DP-SGD, if they do).
//
// Thread-safety: none; the round loop's thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/streaming_aggregator.h"
#include "common/status.h"
#include "common/tensor.h"
#include "coordinator/options.h"
#include "coordinator/round_metrics.h"
#include "privacy/budget.h"
#include "privacy/job_ledger.h"
#include "privacy/ledger.h"
#include "privacy/noise.h"
#include "privacy/report.h"
#include "proto/messages.h"

namespace huddle::coordinator {

class SecureRound;

// One round's privacy settings (Configure), and what its updates said about them.
struct PrivateRound {
  uint64_t number = 0;
  double clip_norm = 0;               // C every update must respect (central) / clip to (local)
  double noise_multiplier = 0;        // z accounted for the round
  double value_noise_multiplier = 0;  // z of the update sum (z, or less under adaptive clipping)
  double expected_cohort = 0;         // central: the fixed denominator (expected cohort size)
  double local_norm_bound = 0;        // local: the longest update an honest client can send
  int64_t within_clip = 0;            // results that were within C before clipping
};

class RoundPrivacy {
 public:
  // The job's session: under DP, its plan, its ledger opened in options.out_dir (a fresh start
  // over entries is refused unless resuming; `resumed_round`: the checkpoint's completed round,
  // whose rounds the ledger must cover) and its noise. `checkpoint_clip_norm`: adaptive clipping's
  // C from the checkpoint (0: the plan's). `options` must outlive it.
  static StatusOr<RoundPrivacy> Open(const CoordinatorOptions* options, double checkpoint_clip_norm,
                                     uint64_t resumed_round);

  bool enabled() const { return plan_.has_value(); }
  privacy::PrivacyMode mode() const { return options_->privacy.mode; }
  // False when the noise is seeded (privacy.noise_seed): epsilon is then nominal.
  bool private_noise() const { return !noise_ || noise_->is_private(); }
  // Why the job is not private, as privacy.json and summary.json say: the ledger's rule
  // (privacy::JobLedger::NotPrivateBecause) over every recorded round, an earlier run's included,
  // and this run's noise. Empty when it is private, and without a ledger (no DP, or DP-SGD, whose
  // spend each client keeps).
  std::vector<std::string> NotPrivateBecause() const;
  // Cohorts and client seeds come from the OS CSPRNG (secret sampling) rather than the job seed:
  // under DP with private noise. nullptr otherwise.
  bool secret_sampling() const { return sampler_.has_value(); }
  privacy::NoiseSource* sampler() { return sampler_ ? &*sampler_ : nullptr; }
  // Adaptive clipping: C of the next round (checkpointed).
  double clip_norm() const { return clip_norm_; }
  // The releases the job's ledger holds (an earlier run's included).
  int64_t releases() const { return ledger_ ? static_cast<int64_t>(ledger_->entries().size()) : 0; }
  // The job's spend as of the latest release (or of Open, when the ledger held entries).
  const std::optional<privacy::Spend>& spent() const { return spent_; }

  // Before round `number` is sampled: why it would take the job past its budget, or nullopt.
  StatusOr<std::optional<std::string>> StopBefore(uint64_t number) const;
  // The round's settings, and `aggregator` reset for them (weight 1; central: the noise grid).
  Status Configure(uint64_t number, PrivateRound* round,
                   aggregation::StreamingAggregator* aggregator);
  // The privacy fields of the round's FitInstructions.
  wire::UpdatePrivacy Instruction(const PrivateRound& round) const;
  // Central: the update's L2 norm must be <= C. Local: <= C plus what the round's noise can add,
  // so that no client can send more than a noised clipped update.
  Status CheckUpdate(const PrivateRound& round,
                     std::span<const std::span<const float>> update) const;

  // Noise, ledger (durable), mean over the expected cohort: the round's releasable update into
  // *mean, and its privacy metrics into metrics->privacy. `results`: the updates the sum holds;
  // `secure`: the round's secure aggregation (its sum instead of the aggregator's), or nullptr.
  Status Release(PrivateRound& round, int64_t results, aggregation::StreamingAggregator* aggregator,
                 const SecureRound* secure, RoundMetrics* metrics, TensorList* mean);
  // A round whose secure aggregation released nothing: the spend so far into metrics->privacy.
  Status NoRelease(const PrivateRound& round, const SecureRound* secure, RoundMetrics* metrics);
  // Distributed DP (SecureRoundHost's calls): the spend `entry` would take the job to, and
  // whether that is past its budget; `entry` appended to the ledger (before unmasking).
  StatusOr<std::pair<privacy::Spend, bool>> WouldSpend(const privacy::LedgerEntry& entry) const;
  Status Account(const privacy::LedgerEntry& entry);

  // OUT/privacy.json from the ledger and the job's settings (privacy/report.h); without DP, for
  // clients that train with DP-SGD, the example-level statement; nothing otherwise.
  // `stop_reason`: why the job stopped early ("" when it did not).
  Status WriteReport(const std::string& stop_reason) const;

 private:
  // This run's noise, for the ledger's rule (privacy::JobLedger::NotPrivateBecause).
  privacy::SessionNoise Session() const;
  explicit RoundPrivacy(const CoordinatorOptions* options) : options_(options) {}
  RoundMetrics::Privacy Info(const PrivateRound& round) const;
  // The ledger's total into `info`, then into metrics->privacy and spent_.
  Status RecordSpent(RoundMetrics::Privacy info, RoundMetrics* metrics);
  Status WriteDpSgdReport(const std::string& stop_reason) const;
  // privacy.json's mechanism, sampling and assumptions under participation-bounded accounting
  // (asynchronous training).
  void DescribeBounded(privacy::PrivacyReport* r) const;

  const CoordinatorOptions* options_;
  std::optional<privacy::PrivacyPlan> plan_;
  std::optional<privacy::JobLedger> ledger_;
  std::optional<privacy::NoiseSource> noise_;
  std::optional<privacy::NoiseSource> sampler_;
  double clip_norm_ = 0;     // adaptive clipping: C of the next round
  double count_stddev_ = 0;  // adaptive clipping: sigma_b (fixed at the first DP round)
  std::optional<privacy::Spend> spent_;
  std::optional<double> planned_epsilon_;  // what all the plan's rounds spend (privacy.json)
};

}  // namespace huddle::coordinator
