// Rank 0's bookkeeping after each epoch of a `huddle datacenter` job (datacenter/job.h): ledger
// (DP-SGD), evaluation, metrics, checkpoint, model, privacy report, progress; and the job's
// summary.json at its end.
//
// With DP-SGD the epoch's ledger entry is durable before any of the rest is written
// (datacenter/privacy_session.h), and the outputs are split: metrics.jsonl and summary.json's top
// level hold only public or DP-protected values; values computed from the private data without
// noise, and timings, go to operator_metrics.jsonl and summary.json's `operator` object. Each
// metrics row has `time`, when it was written (ISO-8601 UTC, common/time_format.h); with DP-SGD
// only the operator's rows do: successive times give the epochs' durations, which depend on the
// secret sample's sizes.
//
// Thread-safety: none (rank 0's training thread, from DataParallelOptions::on_epoch).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"
#include "data/dataset.h"
#include "datacenter/data_parallel.h"
#include "datacenter/job_options.h"
#include "datacenter/privacy_session.h"
#include "models/model.h"

namespace huddle::datacenter {

class Reporter {
 public:
  // `c` must outlive the reporter; `backend` names the collective (summary.json). `test` (rank 0's
  // evaluation set, null: no evaluation) and `privacy` (rank 0 of a DP-SGD job, else null) are
  // not owned. `clock` (its WallMs: the rows' `time`) must outlive the reporter.
  Reporter(const DatacenterConfig& c, int world, std::string backend, const data::Dataset* test,
           PrivacySession* privacy, const Clock* clock = SteadyClock::Get());
  ~Reporter();

  // After epoch r.epoch: appends the ledger entry (DP-SGD) and rewrites privacy.json, evaluates
  // (every evaluation.every epochs and after the last), appends the metrics line(s), writes the
  // checkpoint (every checkpoint.every_epochs and after the last) and, after the last, model.bin;
  // then prints the epoch's progress line.
  Status OnEpoch(const EpochReport& r);

  // Fields added to every following metrics row (the parameter-server mode's "mode" and
  // counters); not with DP-SGD.
  void set_row_fields(nlohmann::json fields) { row_fields_ = std::move(fields); }

  // The step count the next epoch's steps/s is measured from (a resume's checkpoint).
  void set_last_steps(int64_t steps) { last_steps_ = steps; }

  // Writes OUT/summary.json for the training session that ended with `s`.
  Status WriteSummary(const DataParallelStats& s) const;

  std::optional<double> final_test_accuracy() const { return final_test_accuracy_; }
  std::optional<double> target_seconds() const { return target_seconds_; }
  std::optional<int64_t> target_epoch() const { return target_epoch_; }

 private:
  // datacenter.crash_for_testing: dies here as a machine failing at this point would.
  void CrashIfAskedForTesting(std::string_view after, int64_t epoch) const;

  const DatacenterConfig& c_;
  int world_;
  std::string backend_;
  const data::Dataset* test_;
  std::unique_ptr<models::Evaluator> evaluator_;
  PrivacySession* privacy_;
  const Clock* clock_;
  int64_t last_steps_ = 0;
  nlohmann::json row_fields_ = nlohmann::json::object();
  std::optional<double> final_test_accuracy_, target_seconds_;
  std::optional<int64_t> target_epoch_;
};

}  // namespace huddle::datacenter
