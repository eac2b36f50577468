// JobSummary's JSON and the output-directory check (job_summary.h).
#include "coordinator/job_summary.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "coordinator/checkpoint.h"
#include "coordinator/round_metrics.h"
#include "privacy/ledger.h"
#include "privacy/report.h"

namespace huddle::coordinator {
namespace {

std::string Path(const std::string& dir, const char* file) {
  return (std::filesystem::path(dir) / file).string();
}

}  // namespace

Status CheckOutputDir(const CoordinatorOptions& options) {
  if (options.out_dir.empty() || options.resume || options.force) return absl::OkStatus();
  std::vector<std::string> found;
  for (const char* file : {kCheckpointFile, kMetricsFile, "summary.json", "model.bin"}) {
    if (std::filesystem::exists(Path(options.out_dir, file))) found.push_back(file);
  }
  if (found.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      options.out_dir, " holds the outputs of an earlier job (", absl::StrJoin(found, ", "),
      "): continue that job with --resume, replace its outputs with --force, or choose another "
      "output directory"));
}

std::string JobSummary::ToJson(const CoordinatorOptions& options) const {
  nlohmann::ordered_json j;
  auto opt = [](const auto& v) { return v ? nlohmann::ordered_json(*v) : nullptr; };
  j["job"] = options.job_name;
  j["rounds"] = options.rounds;
  j["rounds_completed"] = rounds_completed;
  j["final_test_accuracy"] = opt(final_test_accuracy);
  j["final_test_loss"] = opt(final_test_loss);
  j["best_test_accuracy"] = opt(best_test_accuracy);
  j["best_round"] = opt(best_round);
  const bool dp = options.privacy.mode != privacy::PrivacyMode::kNone;
  if (!dp) {
    j["elapsed_s"] = elapsed_s;
    j["bytes_in"] = bytes_in;
    j["bytes_out"] = bytes_out;
  }
  j["model_file"] = "model.bin";
  // How the job trained: lock-step rounds, or buffered asynchronous steps (`rounds` then counts
  // server steps).
  if (options.async.enabled) {
    const AsyncOptions& a = options.async;
    static constexpr const char* kWeights[] = {"constant", "polynomial", "hinge"};
    j["training"] = {{"mode", "async"},
                     {"concurrency", a.concurrency},
                     {"buffer", a.buffer},
                     {"staleness_weight", kWeights[static_cast<int>(a.weight)]},
                     {"max_staleness", a.max_staleness}};
  } else {
    j["training"] = {{"mode", "sync"}};
  }
  j["training"]["clock"] = virtual_clock ? "virtual" : "real";
  if (dp) {
    nlohmann::ordered_json p;
    p["mode"] = privacy::PrivacyModeName(options.privacy.mode);
    const bool is_private = not_private_because.empty();
    p["private"] = is_private;
    p["epsilon"] = epsilon && is_private ? nlohmann::ordered_json(*epsilon) : nullptr;
    if (!is_private) {
      p["not_private_because"] = not_private_because;
      p["nominal_epsilon"] = opt(epsilon);
    }
    p["delta"] = options.privacy.delta;
    p["ledger"] = privacy::kLedgerFile;
    p["report"] = privacy::kPrivacyReportFile;
    j["privacy"] = std::move(p);
    // Timings and traffic reveal how many clients took part: for the operator only.
    j["operator"] = {{"note", privacy::kOperatorOnly},
                     {"elapsed_s", elapsed_s},
                     {"bytes_in", bytes_in},
                     {"bytes_out", bytes_out}};
  }
  if (options.secure_aggregation.enabled) {
    // The settings are the configuration's; which rounds released and who lied, the operator's
    // (under DP, counts of clients are not covered by the guarantee).
    const aggregation::secagg::GraphOptions& g = options.secure_aggregation.graph;
    nlohmann::ordered_json a;
    a["enabled"] = true;
    a["corrupt_fraction"] = g.corrupt_fraction;
    a["security_bits"] = g.security_bits;
    a["weight_by_examples"] = options.secure_aggregation.weight_by_examples;
    nlohmann::ordered_json outcome = {{"rounds_released", secure_rounds_released},
                                      {"rounds_refused", secure_rounds_refused},
                                      {"restarts", secure_restarts},
                                      {"blamed", secure_blamed}};
    if (dp) {
      outcome["note"] = privacy::kOperatorOnly;
      a["operator"] = std::move(outcome);
    } else {
      a.update(outcome);
    }
    j["secure_aggregation"] = std::move(a);
  }
  if (options.eval_mode == CoordinatorOptions::EvalMode::kFederated) {
    nlohmann::ordered_json e;
    e["mode"] = "federated";
    e["evaluations"] = federated_evaluations;
    e["without_answers"] = evaluations_without_answers;
    if (final_evaluation_unanswered) {
      e["final"] =
          "no answers: no client answered the evaluation of the final model in time, so its "
          "accuracy is unknown (final_test_accuracy is null)";
    }
    j["evaluation"] = std::move(e);
  }
  if (!stop_reason.empty()) j["stopped_early"] = stop_reason;
  if (!failure.empty()) {
    // Under DP the only failure (no update accepted in the run) is a count of results: for the
    // operator, beside the other counts.
    (dp ? j["operator"]["failed"] : j["failed"]) = failure;
  }
  return j.dump(2) + "\n";
}

void JobSummary::ResumeFrom(const Checkpoint& ckpt) {
  rounds_completed = ckpt.completed_round;
  elapsed_s = ckpt.elapsed_s;
  bytes_in = ckpt.bytes_in;
  bytes_out = ckpt.bytes_out;
  auto known = [](double v) { return std::isnan(v) ? std::nullopt : std::optional<double>(v); };
  final_test_accuracy = known(ckpt.final_test_accuracy);
  final_test_loss = known(ckpt.final_test_loss);
  best_test_accuracy = known(ckpt.best_test_accuracy);
  if (ckpt.best_round > 0) best_round = ckpt.best_round;
}

void JobSummary::SaveTo(Checkpoint* ckpt) const {
  ckpt->completed_round = rounds_completed;
  ckpt->elapsed_s = elapsed_s;
  ckpt->bytes_in = bytes_in;
  ckpt->bytes_out = bytes_out;
  const double none = std::numeric_limits<double>::quiet_NaN();
  ckpt->final_test_accuracy = final_test_accuracy.value_or(none);
  ckpt->final_test_loss = final_test_loss.value_or(none);
  if (std::isinf(ckpt->final_test_loss)) ckpt->final_test_loss = none;
  ckpt->best_test_accuracy = best_test_accuracy.value_or(none);
  ckpt->best_round = best_round.value_or(0);
}

}  // namespace huddle::coordinator
