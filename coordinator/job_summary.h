// What a job did, as written to OUT/summary.json at its end (Coordinator::summary()), and the check
// that keeps a fresh job from mixing its outputs with an earlier job's.
//
// JobSummary is a plain value filled in by the coordinator as rounds complete (and from a resumed
// checkpoint); ToJson writes it under the job's options: under DP the counts, timings and traffic
// that reveal who took part go under "operator", apart from what the guarantee covers.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/checkpoint.h"
#include "coordinator/options.h"

namespace huddle::coordinator {

struct JobSummary {
  uint64_t rounds_completed = 0;
  std::optional<double> final_test_accuracy;
  std::optional<double> final_test_loss;
  std::optional<double> best_test_accuracy;
  std::optional<uint64_t> best_round;
  double elapsed_s = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  std::optional<double> epsilon;  // under DP: the accountant's spend at the job's delta
  std::optional<double> delta;
  // Under DP: why the job is not private (RoundPrivacy::NotPrivateBecause); when not empty,
  // epsilon is nominal and reported as such.
  std::vector<std::string> not_private_because;
  std::string stop_reason;  // why the job ended before its last round ("" = it did not)
  std::string failure;      // why the job failed (it trained nothing); "" when it did not
  // Federated evaluation (this run): evaluations run, and how many had no accepted answer. When the
  // latest one had none, final_test_accuracy and final_test_loss are null (unknown) and
  // `final_evaluation_unanswered` says so; best_* keep the best answered evaluation.
  int64_t federated_evaluations = 0;
  int64_t evaluations_without_answers = 0;
  bool final_evaluation_unanswered = false;
  // Secure aggregation (this run): rounds whose sum was unmasked, rounds that released nothing,
  // sessions started again, and the clients found lying (left out of later rounds).
  int64_t secure_rounds_released = 0;
  int64_t secure_rounds_refused = 0;
  int64_t secure_restarts = 0;
  std::vector<std::string> secure_blamed;
  // The job ran on a simulation's virtual clock (Clock::simulated()): its times are virtual.
  bool virtual_clock = false;
  std::string ToJson(const CoordinatorOptions& options) const;
  // A resumed job's counts and evaluations so far, from its checkpoint.
  void ResumeFrom(const Checkpoint& checkpoint);
  // The inverse: writes those fields of `checkpoint` (unknown values as NaN; an infinite final
  // loss, a diverged model's under the server's evaluator, as unknown too: a checkpoint holds
  // only values it reads back, CheckCheckpointValues).
  void SaveTo(Checkpoint* checkpoint) const;
};

// Refuses an out_dir that holds an earlier job's outputs (checkpoint, metrics, summary, model)
// unless options.resume or options.force, naming both: starting afresh there would lose them.
Status CheckOutputDir(const CoordinatorOptions& options);

}  // namespace huddle::coordinator
