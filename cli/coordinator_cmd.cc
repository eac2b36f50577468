// `huddle coordinator`: serve a job over ZeroMQ.
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "common/clock.h"
#include "common/logging.h"
#include "coordinator/coordinator.h"
#include "data/csv.h"
#include "data/fashion_mnist.h"
#include "models/model.h"
#include "transport/zmq_transport.h"

namespace huddle::cli {

StatusOr<coordinator::Evaluator> MakeEvaluator(const JobConfig& job) {
  const coordinator::CoordinatorOptions& o = job.coordinator;
  // Server-side evaluation only: federated evaluation is the clients', and an external model
  // cannot run here (job_config.cc then sets no server evaluation).
  if (o.eval_every <= 0 || o.eval_mode != coordinator::CoordinatorOptions::EvalMode::kServer ||
      o.model.external()) {
    return coordinator::Evaluator();
  }
  // The test set is loaded and checked against the model (its features, its labels within the
  // model's classes) now, before round 1, and a scattering2d model's test set transformed once;
  // every error names evaluation.data.
  const models::ModelSpec& spec = o.model;
  auto error = [](const Status& st) {
    return Status(st.code(), absl::StrCat("evaluation.data: ", st.message()));
  };
  // Any label the format can hold is read: the width is checked first, then the labels against
  // the model's classes (Evaluator::Create).
  constexpr int64_t kAnyLabel = int64_t{1} << 16;
  const data::IdxFilePair files = data::FashionMnistFiles(job.eval_data, data::Split::kTest);
  StatusOr<data::Dataset> loaded =
      job.eval_format == "csv"
          ? data::LoadCsvDataset(job.eval_data, {kAnyLabel, job.eval_scale_255})
          : data::LoadIdxDataset(files.images, files.labels, nullptr, kAnyLabel);
  if (!loaded.ok()) return error(loaded.status());
  if (loaded->feature_dim != spec.input_dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluation.data: ", job.eval_data, " has ", loaded->feature_dim,
                     " features per example; the model (", models::DescribeModel(spec),
                     ") expects ", spec.input_dim()));
  }
  // The evaluator reads the data it was made from: the data must outlive it (members are
  // destroyed in reverse order).
  struct TestSet {
    data::Dataset data;
    std::unique_ptr<models::Evaluator> evaluator;
  };
  auto test = std::make_shared<TestSet>();
  test->data = *std::move(loaded);
  auto evaluator = models::Evaluator::Create(spec, data::DatasetView{&test->data, {}});
  if (!evaluator.ok()) {
    return error(Status(evaluator.status().code(),
                        absl::StrCat(job.eval_data, ": ", evaluator.status().message())));
  }
  test->evaluator = *std::move(evaluator);
  return coordinator::Evaluator([test](const TensorList& model) -> StatusOr<models::EvalStats> {
    return test->evaluator->Evaluate(model);
  });
}

std::string JobHeadline(const coordinator::CoordinatorOptions& o) {
  const std::string what = o.async.enabled
                               ? absl::StrCat("asynchronous steps (concurrency ",
                                              o.async.concurrency, ", buffer ", o.async.buffer, ")")
                               : "rounds";
  return absl::StrCat("job '", o.job_name, "': ", o.rounds, " ", what, ", model ",
                      models::DescribeModel(o.model));
}

void PrintJobSummary(const coordinator::CoordinatorOptions& o, const coordinator::JobSummary& s,
                     bool clock_simulated) {
  // An asynchronous job's rounds are its server steps.
  const char* unit = o.async.enabled ? "step" : "round";
  std::printf("done: %llu %ss in %.1f s%s", static_cast<unsigned long long>(s.rounds_completed),
              unit, s.elapsed_s, clock_simulated ? " (virtual)" : "");
  if (s.final_test_accuracy) {
    std::printf(" | final test accuracy %.4f (best %.4f at %s %llu)", *s.final_test_accuracy,
                *s.best_test_accuracy, unit, static_cast<unsigned long long>(*s.best_round));
  }
  if (s.final_test_accuracy &&
      o.eval_mode == coordinator::CoordinatorOptions::EvalMode::kFederated) {
    std::printf(" (federated evaluation)");
  }
  if (s.final_evaluation_unanswered) {
    std::printf(" | the final federated evaluation had no answers (accuracy unknown)");
  }
  if (s.evaluations_without_answers > 0 && !s.final_evaluation_unanswered) {
    std::printf(" | %lld of %lld federated evaluations had no answers",
                static_cast<long long>(s.evaluations_without_answers),
                static_cast<long long>(s.federated_evaluations));
  }
  if (s.epsilon && s.not_private_because.empty()) {
    std::printf(" | epsilon %.4g at delta %g", *s.epsilon, *s.delta);
  } else if (s.epsilon) {
    std::printf(" | NOT PRIVATE (%s; nominal epsilon %.4g)",
                absl::StrJoin(s.not_private_because, "; ").c_str(), *s.epsilon);
  }
  std::printf(" | %.1f MB in, %.1f MB out\n", s.bytes_in / 1e6, s.bytes_out / 1e6);
  if (!s.stop_reason.empty()) std::printf("stopped early: %s\n", s.stop_reason.c_str());
  if (!o.out_dir.empty()) {
    std::printf("outputs: %s/{metrics.jsonl,summary.json,model.bin%s}\n", o.out_dir.c_str(),
                o.privacy.mode != privacy::PrivacyMode::kNone
                    ? ",privacy.json,privacy_ledger.jsonl,operator_metrics.jsonl"
                    : "");
  }
  std::fflush(stdout);
}

int RunCoordinatorWith(JobConfig job, transport::ServerTransport* transport, const Clock* clock) {
  const coordinator::CoordinatorOptions& o = job.coordinator;
  LogStartNotes(job);
  StatusOr<coordinator::Evaluator> evaluator = MakeEvaluator(job);
  if (!evaluator.ok()) {
    std::fprintf(stderr, "huddle coordinator: %s\n",
                 std::string(evaluator.status().message()).c_str());
    return kExitFailed;
  }
  auto on_round = [](const coordinator::RoundMetrics& m) {
    std::printf("%s\n", m.ProgressLine().c_str());
    std::fflush(stdout);
  };
  coordinator::Coordinator coord(o, transport, clock, *std::move(evaluator), on_round);
  std::printf("%s\n", JobHeadline(o).c_str());
  std::fflush(stdout);
  Status st = coord.Run(&StopFlag());
  if (!st.ok()) {
    std::fprintf(stderr, "huddle coordinator: %s%s\n", absl::IsAborted(st) ? "job failed: " : "",
                 std::string(st.message()).c_str());
    return absl::IsCancelled(st) ? StopExitCode() : kExitFailed;
  }
  PrintJobSummary(o, coord.summary(), clock->simulated());
  return 0;
}

int RunCoordinatorCommand(const CoordinatorFlags& flags) {
  auto job = LoadJobConfig(flags.config);
  if (!job.ok()) {
    std::fprintf(stderr, "huddle coordinator: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  if (!flags.out_dir.empty()) job->coordinator.out_dir = flags.out_dir;
  if (!flags.bind.empty()) job->bind = flags.bind;
  job->coordinator.resume = flags.resume;
  job->coordinator.allow_legacy_checkpoint = flags.allow_legacy_checkpoint;
  job->coordinator.force = flags.force;
  if (job->coordinator.out_dir.empty())
    job->coordinator.out_dir = "runs/" + job->coordinator.job_name;
  if (!flags.server_key.empty()) job->security.server_secret_key = flags.server_key;
  if (!flags.allow.empty()) job->security.allowed_clients = flags.allow;
  // Before binding: an earlier job's outputs are never replaced by accident (a usage error, as in
  // `huddle run`).
  if (Status st = coordinator::CheckOutputDir(job->coordinator); !st.ok()) {
    std::fprintf(stderr, "huddle coordinator: %s\n", std::string(st.message()).c_str());
    return kExitUsage;
  }
  if (Status st = SetupLogging(job->log_level, "coordinator"); !st.ok()) return 2;
  if (job->coordinator.secure_aggregation.enabled) {
    if (job->security.allowed_clients.empty()) {
      std::fprintf(stderr,
                   "huddle coordinator: secure aggregation lists each member with its certificate "
                   "from the allow-list: set security.allowed_clients (or --allow), a directory "
                   "of certified client .pub files (huddle certify)\n");
      return 2;
    }
    job->coordinator.secure_aggregation.certificates =
        AllowListCertificates(job->security.allowed_clients);
  }
  auto zopts = CoordinatorTransportOptions(*job, flags.insecure);
  if (!zopts.ok()) {
    std::fprintf(stderr, "huddle coordinator: %s\n", std::string(zopts.status().message()).c_str());
    return 2;
  }
  auto server = transport::BindZmqServer(job->bind, *zopts);
  if (!server.ok()) {
    std::fprintf(stderr, "huddle coordinator: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  spdlog::info("listening on {}", job->bind);
  return RunCoordinatorWith(std::move(job).value(), server->get());
}

}  // namespace huddle::cli
