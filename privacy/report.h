// privacy.json: what a job's privacy guarantee is, in one file a privacy officer can read.
//
// Every job that trains under differential privacy (federated client-level DP, DP-SGD inside
// clients, DP-SGD across datacenter ranks) writes OUT/privacy.json beside summary.json after every
// release and at the end: the unit of privacy (a client's whole data, or one example), the
// adjacency (add/remove or replace-one), the mechanism, how records are sampled and what secrecy
// the amplification by sampling assumes, the accountant, the releases (q, z, C, steps, grouped from
// the ledger), epsilon at delta, the noise source, and every assumption the number relies on.
// A federated job under client-level DP also restates its plan: the noise schedule it was started
// with, the epsilon all its rounds would spend, and its planned rounds against the rounds run
// (those whose release the ledger records).
//
// `epsilon` is null when the run is not private (seeded noise, zero noise): the accountant's
// number is then kept as `nominal_epsilon` and `not_private_because` says why; nothing reports
// such a run as private.
//
// Thread-safety: values and stateless functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "privacy/accountant.h"
#include "privacy/budget.h"
#include "privacy/ledger.h"

namespace huddle::privacy {

inline constexpr char kPrivacyReportFile[] = "privacy.json";
// Under DP, the values computed from private data without noise (counts, losses, timings) go to
// this file and to summary.json's `operator` object, marked with kOperatorOnly, never beside the
// DP-protected ones.
inline constexpr char kOperatorMetricsFile[] = "operator_metrics.jsonl";
inline constexpr char kOperatorOnly[] = "operator-only: not DP-protected";

// A run of consecutive ledger entries with the same (q, z, C, adjacency, noise).
struct ReportReleases {
  uint64_t first_round = 0;  // round (federated) or epoch (datacenter), inclusive
  uint64_t last_round = 0;
  int64_t entries = 0;  // ledger entries (releases) in the run
  int64_t steps = 0;    // mechanism steps in the run (DP-SGD: gradient steps)
  double sampling_rate = 0;
  double noise_multiplier = 0;            // as configured: noise std / C
  double accounted_noise_multiplier = 0;  // what the accountant uses (z / 2 under replace-one)
  double clip_norm = 0;
  std::string adjacency;
  std::string noise;
  std::string mechanism;  // the ledger's: poisson_gaussian or distributed_discrete_gaussian
  double tau = 0;         // distributed_discrete_gaussian only (accountant.h)
};

// Groups a ledger's entries (of one unit) into runs.
std::vector<ReportReleases> GroupReleases(std::span<const LedgerEntry> entries);

// The plan a federated client-level DP job was started with (privacy/budget.h).
struct ReportPlan {
  int64_t rounds_planned = 0;  // the job's `rounds`
  // Rounds whose release the ledger records (an earlier run's included; a round re-run after a
  // crash counts once): fewer than planned when the job stopped early or has not finished.
  int64_t rounds_run = 0;
  std::optional<double> epsilon;             // what all the planned rounds spend (the plan's bound)
  bool stop_at_budget = false;               // privacy.stop_at_budget
  std::vector<PlannedRange> noise_schedule;  // z and C (the initial C under adaptive clipping)
  // Participation-bounded accounting (asynchronous training; budget.h): the bound the
  // coordinator enforces, which the epsilon (the worst client's) rests on.
  struct Participation {
    int64_t max_participations = 0;
    int64_t min_separation = 1;
  };
  std::optional<Participation> participation;
};

struct PrivacyReport {
  std::string job;
  std::string scope;       // "federated" | "client" | "datacenter"
  std::string unit;        // kUnitClient | kUnitExample
  std::string adjacency;   // kAddRemove | kReplaceOne
  std::string mechanism;   // e.g. "DP-FedAvg with central noise"
  std::string sampling;    // how records are sampled, and the secrecy amplification assumes
  std::string accountant;  // "rdp" | "pld" | "analytic"
  double delta = 0;
  double nominal_epsilon = 0;  // the accountant's epsilon at delta over the releases
  bool is_private = true;      // false: `epsilon` is null, see not_private_because
  // Non-empty: the guarantee holds but this report cannot state one epsilon for it (DP-SGD inside
  // federated clients: each client's spend depends on its own data size, which it does not
  // report); `epsilon` is null and this says where each unit's epsilon is kept.
  std::string epsilon_kept_by;
  std::vector<std::string> not_private_because;
  std::optional<double> budget_epsilon;  // the configured total, if any
  std::optional<ReportPlan> plan;        // federated client-level DP only
  std::vector<ReportReleases> releases;
  std::string noise_source;              // "os-csprng", "seeded (NOT PRIVATE)", ...
  std::string ledger;                    // the ledger file (relative to the report)
  std::vector<std::string> assumptions;  // what the epsilon relies on
  std::vector<std::string> not_covered;  // outputs and parties the guarantee does not cover
  std::string stopped_early;             // why the job stopped before its plan, if it did
};

// The report as pretty-printed JSON (with a trailing newline).
std::string PrivacyReportJson(const PrivacyReport& report);
// Writes dir/privacy.json atomically.
Status WritePrivacyReport(const std::string& dir, const PrivacyReport& report);

}  // namespace huddle::privacy
