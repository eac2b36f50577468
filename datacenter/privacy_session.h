// The privacy bookkeeping of a `huddle datacenter` job with `train.dp_sgd`, kept by rank 0
// (docs/datacenter.md, "DP-SGD across ranks"; docs/privacy.md).
//
// The ledger. OUT/privacy_ledger.jsonl (privacy/ledger.h) gets one fsync'd entry per epoch report:
// the DP-SGD steps taken since the previous entry of this session (or since the checkpoint it
// resumed from), as `round` = the 1-based epoch, unit example, adjacency add/remove, mode dp_sgd.
// Rank 0 appends it BEFORE anything computed from those steps leaves rank 0 (the metrics line with
// its test accuracy, the checkpoint, model.bin, summary.json), so the ledger counts every step any
// output ever reflected. Steps that no output reflected (a kill mid-epoch) have no entry: the
// ranks are trusted, and only rank 0 releases. An epoch re-run after a resume (its first run's
// outputs may have been seen) gets a second entry: over-counting is safe, under-counting is not.
// OUT/privacy.json (privacy/report.h) is rewritten from the ledger right after each entry, when
// the job ends, and when it fails (with `stopped_early`).
//
// Every epsilon a DP job reports (metrics.jsonl, summary.json, the progress lines, privacy.json)
// is the accountant's epsilon over the ledger's entries (all sessions of the job), never over the
// step counter. A job with any entry whose noise multiplier is 0 or whose noise is not from the OS
// CSPRNG is NOT private: its epsilon is reported as null / "NOT PRIVATE", and the accountant's
// number only as `nominal_epsilon`.
//
// Start rules (PrivacySession::Open and CheckStart):
//   - without --resume, a ledger with entries is refused (deleting it would forget spent privacy);
//   - with --resume, a checkpoint whose steps exceed the ledger's is refused with DataLoss (the
//     ledger was deleted or truncated); without a checkpoint but with ledger entries (killed before
//     the first checkpoint) the job starts over, the ledger's spend still counted;
//   - train.dp_sgd.epsilon is checked against the ledger's spend plus the steps still to run.
// A run without train.dp_sgd refuses an output directory whose ledger records releases (it would
// overwrite DP outputs with non-private ones under a privacy.json that describes the old ones).
//
// Thread-safety: none (rank 0's training thread).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "datacenter/job_options.h"
#include "privacy/accountant.h"
#include "privacy/job_ledger.h"
#include "privacy/ledger.h"
#include "privacy/report.h"

namespace huddle::datacenter {

using privacy::kOperatorMetricsFile;
using privacy::kOperatorOnly;
// The ledger's `noise` for steps taken with noise multiplier 0.
using privacy::kNoNoise;

// The run's DP-SGD steps: round(epochs * n / expected_batch_size), at least one, of
// DpEvent{q = expected_batch_size / n, z}. InvalidArgument when the expected batch exceeds n;
// FailedPrecondition when the run alone would spend more than train.dp_sgd.epsilon (naming the
// noise multiplier that would fit). Every rank computes the same answer.
StatusOr<privacy::DpEvent> PlanDpSgd(const DatacenterConfig& c, int64_t n);

// A run without train.dp_sgd: FailedPrecondition when OUT's ledger records any release.
Status CheckNoLedgerForNonDpRun(const std::string& out_dir);

// The job's privacy spend as every output reports it.
struct JobSpend {
  bool is_private = true;
  double nominal_epsilon = 0;  // the accountant's epsilon over the ledger (+inf for z = 0)
  double delta = 0;
  int64_t ledger_steps = 0;  // DP-SGD steps the ledger counts (>= the model's steps)
  int64_t ledger_entries = 0;
  std::vector<std::string> not_private_because;  // empty when private

  // "epsilon 1.23 at delta 1e-05", or "epsilon: NOT PRIVATE (...)".
  std::string Text() const;
  // Adds `private`, `epsilon` (null when not private), `nominal_epsilon` (only then), `delta`
  // and `ledger_steps` to *j.
  void AddTo(nlohmann::json* j) const;
};

// How this session adds noise, for the ledger and privacy.json.
struct SessionNoise {
  std::string description;  // kNoNoise for z = 0, else rank 0's NoiseSource::Describe()
  bool is_private = false;  // z > 0 and the source is private
};

class PrivacySession {
 public:
  // Opens (creating) OUT/privacy_ledger.jsonl and replays it. Refused: entries without `resume`,
  // or entries that are not example-level DP-SGD events (another kind of job's ledger).
  // `c` must outlive the object; `n` is the training set's size (public).
  static StatusOr<PrivacySession> Open(const DatacenterConfig& c, int world_size, int64_t n,
                                       bool resume, const privacy::DpEvent& plan,
                                       SessionNoise noise);

  // Before the first step, training starting at `start_steps` (the checkpoint's, or 0 without
  // one): DataLoss when `from_checkpoint` and the ledger counts fewer steps; FailedPrecondition
  // when the ledger's spend plus the plan's remaining steps would pass train.dp_sgd.epsilon.
  Status CheckStart(int64_t start_steps, bool from_checkpoint);

  // Durably records the steps from the last entry (or the start) to `steps_so_far` as epoch
  // `epoch` (1-based). Nothing computed from those steps may leave rank 0 before it returns OK.
  Status Record(int64_t epoch, int64_t steps_so_far);

  // The spend over the ledger's entries (or, with none yet, 0 with this session's privacy).
  StatusOr<JobSpend> Spent() const;
  // The spend the job will have reached when this session's plan is done.
  StatusOr<JobSpend> SpentWhenDone() const;

  // Writes OUT/privacy.json from the ledger. `stopped_early`: why the job stopped before its plan.
  Status WriteReport(const std::string& stopped_early = "") const;

  int64_t ledger_steps() const;  // the steps of all the ledger's entries
  const privacy::DpEvent& plan() const { return plan_; }
  const SessionNoise& noise() const { return noise_; }
  const privacy::JobLedger& ledger() const { return ledger_; }

 private:
  PrivacySession(const DatacenterConfig& c, int world_size, int64_t n, const privacy::DpEvent& plan,
                 SessionNoise noise, privacy::JobLedger ledger);
  StatusOr<JobSpend> SpendOf(std::vector<privacy::DpEvent> extra) const;

  const DatacenterConfig* c_;
  int world_size_;
  int64_t n_;
  privacy::DpEvent plan_;
  SessionNoise noise_;
  privacy::JobLedger ledger_;   // the job's privacy session
  int64_t recorded_steps_ = 0;  // the step position of the last entry (or the start)
};

}  // namespace huddle::datacenter
