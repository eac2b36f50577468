#include "datacenter/internal/ps_job.h"

#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>

#include "common/file_util.h"
#include "common/rng.h"
#include "datacenter/parameter_server.h"
#include "datacenter/reporter.h"
#include "kernels/backend.h"

namespace huddle::datacenter::internal {
namespace {

constexpr uint64_t kInitStream = 0x696e6974;  // "init", as job.cc's

std::string ModeName(const ParameterServerConfig& ps) { return ps.async ? "async" : "sync"; }

// What every metrics row and summary.json say about the mode, and its counters so far.
nlohmann::json PsFields(const DatacenterConfig& c, int64_t world, const PsStats& s) {
  const ParameterServerConfig& ps = *c.parameter_server;
  nlohmann::json j;
  j["mode"] = "parameter_server";
  j["ps_mode"] = ModeName(ps);
  j["servers"] = ps.servers;
  j["workers"] = world - ps.servers;
  j["staleness_mean"] =
      s.staleness_count > 0 ? s.staleness_sum / static_cast<double>(s.staleness_count) : 0.0;
  j["staleness_max"] = s.staleness_max;
  j["ssp_waits"] = s.ssp_waits;
  j["ssp_wait_seconds"] = s.ssp_wait_seconds;
  j["backup_dropped"] = s.late_dropped;
  j["requeued_batches"] = s.requeued;
  j["dead_workers"] = s.dead_ranks;
  return j;
}

Status WriteSummary(const DatacenterConfig& c, int64_t world, const Reporter& reporter,
                    const PsStats& s) {
  const ParameterServerConfig& ps = *c.parameter_server;
  nlohmann::json j;
  j["job"] = c.job_name;
  j["world_size"] = world;
  j["backend"] = "zeromq";
  j["epochs"] = c.train.epochs;
  j["steps"] = s.steps;
  j["batch_per_worker_step"] = c.train.batch_size;
  if (auto acc = reporter.final_test_accuracy()) j["final_test_accuracy"] = *acc;
  if (c.target_accuracy > 0) {
    j["target_accuracy"] = c.target_accuracy;
    j["epoch_reaching_target"] =
        reporter.target_epoch() ? nlohmann::json(*reporter.target_epoch()) : nullptr;
    j["seconds_to_target"] =
        reporter.target_seconds() ? nlohmann::json(*reporter.target_seconds()) : nullptr;
  }
  j["seconds_this_session"] = s.seconds;
  j["train_loss"] = s.loss;
  j["train_accuracy"] = s.accuracy;
  j["gradients_counted"] = s.gradients;
  j.update(PsFields(c, world, s));
  j["staleness_bound"] = ps.staleness_bound ? nlohmann::json(*ps.staleness_bound) : nullptr;
  j["backup_workers"] = ps.backup_workers;
  return WriteFileAtomic(OutPath(c.out_dir, "summary.json"), j.dump(2) + "\n");
}

}  // namespace

Status RunParameterServerRank(
    const DatacenterConfig& c, const RankOptions& o, transport::KvStore& store,
    const std::string& key_prefix, const data::Dataset& train, const data::Dataset* test,
    const TrainingState* resume, bool complete,
    const std::function<Status(std::string_view, const Status&)>& refuse) {
  const int rank = o.collective.rank;
  const int64_t world = o.collective.world_size;
  const ParameterServerConfig& ps = *c.parameter_server;
  PsJob job;
  job.spec = c.model;
  job.train = c.train;
  job.seed = c.seed;
  job.ps = ps;
  job.world_size = world;
  job.examples = train.size();
  job.timeout_ms = c.timeout_ms;
  job.host = o.collective.host;
  job.auth = o.auth;
  job.key_prefix = key_prefix;
  job.init = models::InitModel(c.model, DeriveSeed(c.seed, kInitStream));
  if (Status st = ValidatePsJob(job); !st.ok()) return refuse("", st);
  if (resume != nullptr && resume->seed != c.seed) {
    return refuse("--resume",
                  absl::FailedPreconditionError(fmt::format(
                      "the checkpoint is of seed {}; this job's is {}", resume->seed, c.seed)));
  }
  if (resume != nullptr) {
    if (Status st = models::CheckParams(c.model, resume->params); !st.ok()) {
      return refuse("--resume", absl::FailedPreconditionError(fmt::format(
                                    "the checkpoint does not fit this model: {}", st.message())));
    }
  }
  const std::string what = fmt::format("rank {}", rank);
  const auto failed = [&](const Status& st) {
    return Status(st.code(), fmt::format("{}: {}", what, st.message()));
  };
  if (rank >= ps.servers) {
    PsWorkerOptions w;
    w.worker = rank - ps.servers;
    w.stop = o.stop;
    w.sleep_ms_per_step = SleepAfterStepForTesting(c, rank);
    if (ps.kill_rank_for_testing == rank) {
      w.vanish_after_step = [&](int64_t steps) {
        if (steps < ps.kill_after_steps_for_testing) return false;
        spdlog::warn("kill_for_testing: worker rank {} kills itself after step {}", rank, steps);
        std::fflush(nullptr);
        std::raise(SIGKILL);
        return true;
      };
    }
    std::unique_ptr<kernels::Backend> backend = kernels::OpenCpuBackend();
    w.backend = backend.get();
    spdlog::info("rank {}/{}: worker {} of the parameter-server mode ({})", rank, world, w.worker,
                 ModeName(ps));
    if (o.on_training_start) o.on_training_start();
    auto stats = RunPsWorker(store, job, w, data::DatasetView{&train, {}});
    if (!stats.ok()) return failed(stats.status());
    spdlog::info("worker rank {}: {} steps, {} examples", rank, stats->steps, stats->examples);
    return absl::OkStatus();
  }

  PsServerOptions so;
  so.server = rank;
  so.stop = o.stop;
  std::optional<Reporter> reporter;
  if (rank == 0) {
    so.resume = resume;
    so.seconds_before = resume != nullptr ? resume->seconds : 0;
    reporter.emplace(c, static_cast<int>(world), "zeromq", test, nullptr);
    if (resume != nullptr) reporter->set_last_steps(resume->steps);
    so.on_epoch = [&](const EpochReport& r, const PsStats& s) -> Status {
      reporter->set_row_fields(PsFields(c, world, s));
      return reporter->OnEpoch(r);
    };
    if (!complete && resume == nullptr) {
      std::printf(
          "%s: parameter-server mode (%s%s), %lld server(s) and %lld worker(s), model %s, "
          "batch %lld per worker step, %lld epochs\n",
          kJobCommand, ModeName(ps).c_str(),
          ps.staleness_bound      ? fmt::format(", staleness bound {}", *ps.staleness_bound).c_str()
          : ps.backup_workers > 0 ? fmt::format(", {} backup worker(s)", ps.backup_workers).c_str()
                                  : "",
          static_cast<long long>(ps.servers), static_cast<long long>(world - ps.servers),
          models::DescribeModel(c.model).c_str(), static_cast<long long>(c.train.batch_size),
          static_cast<long long>(c.train.epochs));
      std::fflush(stdout);
    }
  }
  if (o.on_training_start) o.on_training_start();
  auto stats = RunPsServer(store, job, so);
  if (!stats.ok()) return failed(stats.status());
  if (rank != 0 || complete) return absl::OkStatus();
  if (Status st = WriteSummary(c, world, *reporter, *stats); !st.ok()) {
    return Status(st.code(), fmt::format("summary.json: {}", st.message()));
  }
  std::printf("done: %lld %s in %.1f s", static_cast<long long>(stats->steps),
              ps.async ? "gradients applied" : "steps", stats->seconds);
  if (auto acc = reporter->final_test_accuracy()) std::printf(" | test accuracy %.4f", *acc);
  if (ps.async) {
    std::printf(" | staleness mean %.2f max %lld",
                stats->staleness_count > 0
                    ? stats->staleness_sum / static_cast<double>(stats->staleness_count)
                    : 0.0,
                static_cast<long long>(stats->staleness_max));
  }
  if (ps.staleness_bound)
    std::printf(" | SSP waits %lld", static_cast<long long>(stats->ssp_waits));
  if (!ps.async) {
    std::printf(" | late gradients dropped %lld", static_cast<long long>(stats->late_dropped));
  }
  if (!stats->dead_ranks.empty()) {
    std::printf(" | dead worker rank(s) %s (%lld batches re-run by the others)",
                fmt::format("{}", fmt::join(stats->dead_ranks, ", ")).c_str(),
                static_cast<long long>(stats->requeued));
  }
  std::printf("\noutputs: %s/{metrics.jsonl,summary.json,model.bin,checkpoint.bin}\n",
              c.out_dir.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace huddle::datacenter::internal
