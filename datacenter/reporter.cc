#include "datacenter/reporter.h"

#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>

#include "common/file_util.h"
#include "common/tensor_io.h"
#include "common/time_format.h"
#include "datacenter/checkpoint.h"
#include "privacy/report.h"

namespace huddle::datacenter {

Reporter::Reporter(const DatacenterConfig& c, int world, std::string backend,
                   const data::Dataset* test, PrivacySession* privacy, const Clock* clock)
    : c_(c),
      world_(world),
      backend_(std::move(backend)),
      test_(test),
      privacy_(privacy),
      clock_(clock) {}

Reporter::~Reporter() = default;

Status Reporter::OnEpoch(const EpochReport& r) {
  const int64_t epoch = r.epoch + 1;  // 1-based in outputs
  const bool last = r.last;
  if (privacy_ != nullptr) {
    // Before anything computed from this epoch's steps leaves rank 0; privacy.json (from the
    // ledger alone) follows it at once, so that it never describes fewer steps than an output.
    HUDDLE_RETURN_IF_ERROR(privacy_->Record(epoch, r.steps));
    CrashIfAskedForTesting("ledger", epoch);
    HUDDLE_RETURN_IF_ERROR(privacy_->WriteReport());
  }
  std::optional<models::EvalStats> eval;
  if (test_ != nullptr && (last || (c_.eval_every > 0 && epoch % c_.eval_every == 0))) {
    if (!evaluator_) {  // once: a scattering2d model's test set is transformed once
      HUDDLE_ASSIGN_OR_RETURN(evaluator_,
                              models::Evaluator::Create(c_.model, data::DatasetView{test_, {}}));
    }
    HUDDLE_ASSIGN_OR_RETURN(eval, evaluator_->Evaluate(r.state->params));
    final_test_accuracy_ = eval->accuracy;
    if (c_.target_accuracy > 0 && !target_seconds_ && eval->accuracy >= c_.target_accuracy) {
      target_seconds_ = r.seconds;
      target_epoch_ = epoch;
    }
  }
  const double steps_per_s = static_cast<double>(r.steps - last_steps_) / r.epoch_seconds;
  last_steps_ = r.steps;
  nlohmann::json m;
  m["epoch"] = epoch;
  m["steps"] = r.steps;
  std::string line = fmt::format("epoch {}/{}: ", epoch, r.epochs);
  if (privacy_ != nullptr) {
    HUDDLE_ASSIGN_OR_RETURN(const JobSpend spend, privacy_->Spent());
    spend.AddTo(&m);
    line += spend.Text();
    if (eval) {
      m["test_loss"] = eval->loss;
      m["test_accuracy"] = eval->accuracy;
      line += fmt::format(" | test loss {:.4f} acc {:.4f}", eval->loss, eval->accuracy);
    }
    line += fmt::format(" | (not private) train loss {:.4f} acc {:.4f}, {:.1f} s ({:.1f} steps/s)",
                        r.loss, r.accuracy, r.seconds, steps_per_s);
    nlohmann::json op;
    op["epoch"] = epoch;
    op["steps"] = r.steps;
    op["train_loss"] = r.loss;
    op["train_accuracy"] = r.accuracy;
    op["seconds"] = r.seconds;
    op["epoch_seconds"] = r.epoch_seconds;
    op["world_size"] = world_;
    op["dp_protected"] = false;
    op["time"] = Iso8601Utc(clock_->WallMs());  // not in metrics.jsonl: a timing (reporter.h)
    HUDDLE_RETURN_IF_ERROR(AppendLine(OutPath(c_.out_dir, "metrics.jsonl"), m.dump()));
    HUDDLE_RETURN_IF_ERROR(AppendLine(OutPath(c_.out_dir, kOperatorMetricsFile), op.dump()));
  } else {
    m["train_loss"] = r.loss;
    m["train_accuracy"] = r.accuracy;
    m["seconds"] = r.seconds;
    m["epoch_seconds"] = r.epoch_seconds;
    m["world_size"] = world_;
    line += fmt::format("train loss {:.4f} acc {:.4f}", r.loss, r.accuracy);
    if (eval) {
      m["test_loss"] = eval->loss;
      m["test_accuracy"] = eval->accuracy;
      line += fmt::format(" | test loss {:.4f} acc {:.4f}", eval->loss, eval->accuracy);
    }
    line += fmt::format(" | {:.1f} s ({:.1f} steps/s)", r.seconds, steps_per_s);
    m.update(row_fields_);
    m["time"] = Iso8601Utc(clock_->WallMs());
    HUDDLE_RETURN_IF_ERROR(AppendLine(OutPath(c_.out_dir, "metrics.jsonl"), m.dump()));
  }
  CrashIfAskedForTesting("metrics", epoch);
  if (last || (c_.checkpoint_every > 0 && epoch % c_.checkpoint_every == 0)) {
    HUDDLE_RETURN_IF_ERROR(
        WriteTrainingState(OutPath(c_.out_dir, kDatacenterCheckpointFile), *r.state));
    CrashIfAskedForTesting("checkpoint", epoch);
  }
  if (last)
    HUDDLE_RETURN_IF_ERROR(WriteModelFile(OutPath(c_.out_dir, "model.bin"), r.state->params));
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

Status Reporter::WriteSummary(const DataParallelStats& s) const {
  nlohmann::json j;
  j["job"] = c_.job_name;
  j["world_size"] = world_;
  j["backend"] = backend_;
  j["epochs"] = c_.train.epochs;
  j["steps"] = s.steps;
  if (final_test_accuracy_) j["final_test_accuracy"] = *final_test_accuracy_;
  if (c_.target_accuracy > 0) {
    j["target_accuracy"] = c_.target_accuracy;
    j["epoch_reaching_target"] = target_epoch_ ? nlohmann::json(*target_epoch_) : nullptr;
  }
  // Values computed from the private data without noise, and timings: at the top level
  // without DP-SGD (as ever), under `operator` with it.
  nlohmann::json op;
  op["seconds_this_session"] = s.seconds;
  op["train_loss"] = s.loss;
  op["train_accuracy"] = s.accuracy;
  op["reduce_seconds"] = s.reduce_seconds;
  op["wait_seconds"] = s.wait_seconds;
  op["bytes_reduced"] = s.bytes_reduced;
  op["buckets_per_step"] = s.buckets;
  op["replica_checks_passed"] = s.checksums;
  if (c_.target_accuracy > 0) {
    op["seconds_to_target"] = target_seconds_ ? nlohmann::json(*target_seconds_) : nullptr;
  }
  if (privacy_ == nullptr) {
    j["global_batch"] = c_.train.batch_size * world_;
    j.update(op);
    return WriteFileAtomic(OutPath(c_.out_dir, "summary.json"), j.dump(2) + "\n");
  }
  const privacy::DpEvent& plan = privacy_->plan();
  HUDDLE_ASSIGN_OR_RETURN(const JobSpend spend, privacy_->Spent());
  j["expected_batch_size"] = c_.dp_sgd->dp.expected_batch_size;
  nlohmann::json p = {{"mechanism", "dp-sgd across ranks (Poisson-subsampled Gaussian)"},
                      {"accountant", privacy::AccountantName(c_.dp_sgd->accountant)},
                      {"sampling_rate", plan.sampling_rate},
                      {"noise_multiplier", plan.noise_multiplier},
                      {"clip_norm", c_.dp_sgd->dp.clip_norm},
                      {"steps", plan.steps},
                      {"noise_source", privacy_->noise().description},
                      {"ledger", privacy::kLedgerFile},
                      {"report", privacy::kPrivacyReportFile}};
  spend.AddTo(&p);
  j["privacy"] = std::move(p);
  op["note"] = kOperatorOnly;
  op["dp_protected"] = false;
  j["operator"] = std::move(op);
  return WriteFileAtomic(OutPath(c_.out_dir, "summary.json"), j.dump(2) + "\n");
}

void Reporter::CrashIfAskedForTesting(std::string_view after, int64_t epoch) const {
  if (c_.crash_after_for_testing == after && c_.crash_epoch_for_testing == epoch) {
    spdlog::warn("crash_for_testing: killing rank 0 after the {} of epoch {}", after, epoch);
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
}

}  // namespace huddle::datacenter
