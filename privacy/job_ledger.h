// A job's privacy session: the ledger of one job's DP releases under its output directory
// (OUT/privacy_ledger.jsonl, ledger.h) and the rules every kind of job applies to it.
//
//   - A fresh start over a ledger with entries is refused (FailedPrecondition): those releases
//     were made, and deleting the ledger would forget privacy already spent. The job continues
//     with --resume, or starts in a new output directory.
//   - A resume must be covered by the ledger (DataLoss otherwise): every round a checkpoint
//     completed (CheckRoundsCovered: a federated job), or every step it took (CheckStepsCovered:
//     a datacenter DP-SGD job), has its entry, since every release is appended before anything
//     computed from it leaves the job. A ledger that counts less was deleted, truncated or
//     replaced, and the spend of the model being resumed cannot be known.
//   - Append() is durable before it returns (ledger.h): append before releasing.
//   - WriteReport() writes OUT/privacy.json (report.h) with the ledger's releases.
//
// What a job spends and whether a next release fits its budget are the job's plan's to compute
// (budget.h's PrivacyPlan, or the job's own accountant) over Events().
//
// Thread-safety: none; one writer (the coordinator's round thread, or a datacenter job's rank 0).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "privacy/ledger.h"
#include "privacy/report.h"

namespace huddle::privacy {

struct JobLedgerOptions {
  // --resume: the job continues an earlier run. Without it, a ledger with entries is refused.
  bool resume = false;
  // What the job's releases are called in its messages: "<N> DP releases of an earlier run".
  std::string releases = "DP";
  // Messages also count the entries' steps ("3 DP-SGD releases (1200 steps)"): DP-SGD jobs.
  bool count_steps = false;
  // Stamps each appended entry's `time` (LedgerOpenOptions::clock). Must outlive the ledger.
  const Clock* clock = SteadyClock::Get();
};

// The noise of this session of a job (this process's run, between resumes), for NotPrivateBecause.
struct SessionNoise {
  bool is_private = true;
  std::string why_not;         // when not private: why, in the words of the job's configuration
  bool adds_releases = false;  // this session adds (or will add) releases to the ledger
};

class JobLedger {
 public:
  // Opens (creating) `out_dir`/privacy_ledger.jsonl and replays it (PrivacyLedger::Open), then
  // refuses a fresh start over its entries (above).
  static StatusOr<JobLedger> Open(const std::string& out_dir, const JobLedgerOptions& options);

  // DataLoss unless every round 1..`completed_rounds` has an entry.
  Status CheckRoundsCovered(uint64_t completed_rounds) const;
  // DataLoss when the entries count fewer steps than `checkpoint_steps`, those of the checkpoint
  // at `checkpoint` (a path, for the message).
  Status CheckStepsCovered(int64_t checkpoint_steps, std::string_view checkpoint) const;

  // Durably appends `entry` (PrivacyLedger::Append): nothing computed from the release may leave
  // the job before it returns OK.
  Status Append(const LedgerEntry& entry);

  // Why the job is not private; empty when it is. The one rule for every kind of job:
  //   - one line per run of equal recorded releases (GroupReleases) whose noise multiplier is 0 or
  //     whose noise label is not private (IsPrivateNoise); `round` names a round in the lines
  //     ("epoch": "epochs 3-5 (120 steps)"). An earlier session's releases count as this one's.
  //   - then, when no recorded release gave a reason, `session.why_not` if this session's noise is
  //     not private and the session adds releases or none are recorded yet (its noise is then what
  //     the job's guarantee rests on).
  std::vector<std::string> NotPrivateBecause(std::string_view round = "round",
                                             const SessionNoise& session = {}) const;
  // NotPrivateBecause(round, session).empty(), in constant time (for every round's metrics).
  bool IsPrivate(const SessionNoise& session = {}) const;

  // Writes `out_dir`/privacy.json: `report` with its ledger file and the ledger's releases.
  Status WriteReport(PrivacyReport report) const;

  const std::vector<LedgerEntry>& entries() const { return ledger_.entries(); }
  // The entries as accountant events (PrivacyLedger::Events).
  std::vector<DpEvent> Events(std::string_view unit = {}) const { return ledger_.Events(unit); }
  int64_t steps() const;  // the steps of all the entries
  const std::string& path() const { return ledger_.path(); }
  const std::string& out_dir() const { return out_dir_; }

 private:
  JobLedger(std::string out_dir, PrivacyLedger ledger);
  // NotPrivateBecause's second rule: the session's noise decides, and is not private.
  bool SessionMakesItNotPrivate(const SessionNoise& session) const;

  std::string out_dir_;
  PrivacyLedger ledger_;
  int64_t not_private_entries_ = 0;  // entries that fail IsPrivateRelease
};

}  // namespace huddle::privacy
