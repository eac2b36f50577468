#include "datacenter/job.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/cord.h"
#include "common/file_util.h"
#include "common/rng.h"
#include "common/secure_random.h"
#include "data/csv.h"
#include "data/fashion_mnist.h"
#include "datacenter/checkpoint.h"
#include "datacenter/data_parallel.h"
#include "datacenter/internal/ps_job.h"
#include "datacenter/privacy_session.h"
#include "datacenter/reporter.h"
#include "kernels/backend.h"
#include "privacy/report.h"

namespace huddle::datacenter {
namespace {

constexpr uint64_t kInitStream = 0x696e6974;  // "init", as the coordinator's
// The key under which rank 0 publishes the run id it drew, when none was given.
constexpr char kRunIdKey[] = "huddle/run-id";
// Payloads that classify RunRank's errors (IsRefusal, IsStop).
constexpr char kRefusalPayload[] = "huddle.datacenter/refusal";
constexpr char kStopPayload[] = "huddle.datacenter/stop";

// `st` as the command prints it: "<what>: <message>" (just the message when `what` is empty).
Status Failed(std::string_view what, const Status& st) {
  if (what.empty()) return st;
  return Status(st.code(), fmt::format("{}: {}", what, st.message()));
}
// The same, refusing the configuration or flags (the command's exit code 2).
Status Refused(std::string_view what, const Status& st) {
  Status out = Failed(what, st);
  out.SetPayload(kRefusalPayload, absl::Cord("1"));
  return out;
}

StatusOr<data::Dataset> LoadTrainingData(const data::DataSpec& d) {
  if (d.format == "csv") {
    return data::LoadCsvDataset(d.path, data::CsvOptions{d.num_classes, d.csv_scale_255});
  }
  return data::LoadFashionMnist(d.path, data::Split::kTrain, nullptr);
}

// The run id: the one given, or (none given) one that rank 0 draws from the OS CSPRNG and
// publishes in the store, which the other ranks read.
StatusOr<std::string> AgreeRunId(const RankOptions& o, transport::KvStore& store,
                                 std::chrono::milliseconds timeout) {
  if (o.run_id != kDefaultRunId) return o.run_id;
  if (o.collective.rank == 0) {
    const std::string id = fmt::format("{:016x}", SecureRandomU64());
    HUDDLE_RETURN_IF_ERROR(store.Set(kRunIdKey, id));
    return id;
  }
  return store.Get(kRunIdKey, timeout);
}

// Whether checkpoint `s` is that of a job that ran to its end under config `c`: every step of the
// DP-SGD `plan`, or without DP-SGD every epoch, none of them part-way. A checkpoint of the other
// kind is not (the resume refuses it, saying why).
bool RanToItsEnd(const DatacenterConfig& c, const TrainingState& s,
                 const std::optional<privacy::DpEvent>& plan) {
  if (plan) return s.dp_sgd && s.steps >= plan->steps;
  return !s.dp_sgd && s.epochs_done >= c.train.epochs && s.epoch_rows == 0;
}

// --resume of a job whose checkpoint `s` says it ran to its end: there is nothing to train, and
// its outputs (summary.json, metrics, model, checkpoint, ledger, logs) are left as they are.
void SayAlreadyComplete(const DatacenterConfig& c, const TrainingState& s) {
  std::printf(
      "%s: the job in %s is already complete (%lld epochs, %lld steps; %s): nothing to resume, "
      "its outputs are left as they are (raise train.epochs to train further)\n",
      kJobCommand, c.out_dir.c_str(), static_cast<long long>(s.epochs_done),
      static_cast<long long>(s.steps), OutPath(c.out_dir, kDatacenterCheckpointFile).c_str());
  std::fflush(stdout);
}

// What rank 0 starts from (PrepareRank0).
struct Rank0Start {
  std::optional<TrainingState> resume;
  std::optional<PrivacySession> privacy;
  // --resume of a job that ran to its end (rank 0's checkpoint says so): rank 0 still joins the
  // others, whose resume then trains nothing, and writes nothing.
  bool complete = false;
};

// Rank 0, before joining the others: the start rules of the privacy ledger (DP-SGD; see
// datacenter/privacy_session.h), the checkpoint to resume from, and the metrics files cut back to
// it. A --resume of a job that ran to its end sets `complete` and changes nothing.
Status PrepareRank0(const DatacenterConfig& c, const RankOptions& o, int64_t n,
                    const std::optional<privacy::DpEvent>& plan, privacy::NoiseSource* noise,
                    Rank0Start* start) {
  std::optional<TrainingState>& resume = start->resume;
  std::optional<PrivacySession>& privacy = start->privacy;
  const std::string ckpt_path = OutPath(c.out_dir, kDatacenterCheckpointFile);
  StatusOr<TrainingState> state = absl::NotFoundError("no --resume");
  if (o.resume) {
    state = ReadTrainingState(ckpt_path);
    if (state.ok() && RanToItsEnd(c, *state, plan)) {
      start->complete = true;
      resume = std::move(state).value();
      return absl::OkStatus();
    }
  }
  if (!c.dp_sgd) {
    HUDDLE_RETURN_IF_ERROR(CheckNoLedgerForNonDpRun(c.out_dir));
  } else {
    const double z = plan->noise_multiplier;
    SessionNoise session{z > 0 ? noise->Describe() : kNoNoise, z > 0 && noise->is_private()};
    auto opened =
        PrivacySession::Open(c, o.collective.world_size, n, o.resume, *plan, std::move(session));
    if (!opened.ok()) return Failed("privacy ledger", opened.status());
    privacy.emplace(std::move(opened).value());
  }
  const std::vector<std::string> metrics = {OutPath(c.out_dir, "metrics.jsonl"),
                                            OutPath(c.out_dir, kOperatorMetricsFile)};
  bool start_over = false;  // --resume without a checkpoint, but with a ledger to keep
  if (o.resume) {
    start_over = absl::IsNotFound(state.status()) && privacy && privacy->ledger_steps() > 0;
    if (!state.ok() && !start_over) return Failed("--resume", state.status());
    if (state.ok()) resume = std::move(state).value();
  }
  // Refusals before anything is changed.
  if (privacy) {
    if (Status st = privacy->CheckStart(resume ? resume->steps : 0, resume.has_value()); !st.ok()) {
      return absl::IsFailedPrecondition(st) ? Refused("", st) : st;
    }
  }
  if (start_over) {
    // Killed before its first checkpoint: nothing to continue but the ledger's spend.
    std::printf(
        "%s: no checkpoint at %s: starting over from step 0; the %lld steps the ledger "
        "records stay counted\n",
        kJobCommand, ckpt_path.c_str(), static_cast<long long>(privacy->ledger_steps()));
  } else if (resume) {
    spdlog::info("resuming after epoch {} (step {}) from {}", resume->epochs_done, resume->steps,
                 ckpt_path);
    std::printf("%s: resuming after epoch %lld (step %lld%s)\n", kJobCommand,
                static_cast<long long>(resume->epochs_done), static_cast<long long>(resume->steps),
                resume->epoch_rows > 0 ? fmt::format(", {} rows into epoch {}", resume->epoch_rows,
                                                     resume->epochs_done + 1)
                                             .c_str()
                                       : "");
  }
  for (const std::string& path : metrics) {
    if (o.resume) {
      // The lines of epochs after the checkpoint (all of them when starting over) go.
      const auto keep = static_cast<uint64_t>(resume ? resume->epochs_done : 0);
      if (Status st = KeepJsonLinesUpTo(path, "epoch", keep); !st.ok()) return Failed(path, st);
    } else {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsRefusal(const Status& st) { return st.GetPayload(kRefusalPayload).has_value(); }
bool IsStop(const Status& st) { return st.GetPayload(kStopPayload).has_value(); }

StatusOr<bool> ResumesAFinishedJob(const DatacenterConfig& c) {
  auto state = ReadTrainingState(OutPath(c.out_dir, kDatacenterCheckpointFile));
  if (!state.ok()) return false;
  std::optional<privacy::DpEvent> plan;
  if (c.dp_sgd) {
    // The planned steps depend on the training set's size.
    auto train = LoadTrainingData(c.data);
    if (!train.ok()) return train.status();
    HUDDLE_ASSIGN_OR_RETURN(plan, PlanDpSgd(c, train->size()));
  }
  if (!RanToItsEnd(c, *state, plan)) return false;
  SayAlreadyComplete(c, *state);
  return true;
}

Status RunRank(const DatacenterConfig& c, const RankOptions& opts) {
  const int rank = opts.collective.rank;
  const int world = opts.collective.world_size;
  if (Status st = MakeDirs(c.out_dir); !st.ok()) return Failed("output directory", st);

  if (c.parameter_server && opts.use_cuda) {
    return Refused("datacenter.parameter_server",
                   absl::InvalidArgumentError("the parameter-server mode runs on the CPU "
                                              "only for now (device cpu)"));
  }
  // Everything that can fail alone comes before joining the others.
  auto train = LoadTrainingData(c.data);
  if (!train.ok()) return Failed("training data", train.status());
  std::optional<privacy::DpEvent> dp_plan;
  if (c.dp_sgd) {
    auto planned = PlanDpSgd(c, train->size());
    if (!planned.ok()) return Refused("", planned.status());
    dp_plan = *planned;
  }
  std::optional<data::Dataset> test;
  if (rank == 0 && !c.eval_data.empty()) {
    auto loaded = data::LoadFashionMnist(c.eval_data, data::Split::kTest, nullptr);
    if (!loaded.ok()) return Failed("evaluation data", loaded.status());
    test = std::move(loaded).value();
  }
  // DP-SGD: rank 0's noise (and the sampling key it broadcasts) from the OS CSPRNG.
  std::optional<privacy::NoiseSource> noise;
  if (c.dp_sgd && rank == 0) noise = privacy::NoiseSource::Secure();
  Rank0Start start;
  if (rank == 0) {
    HUDDLE_RETURN_IF_ERROR(
        PrepareRank0(c, opts, train->size(), dp_plan, noise ? &*noise : nullptr, &start));
  }
  const std::optional<TrainingState>& resume = start.resume;
  std::optional<PrivacySession>& privacy = start.privacy;
  const bool complete = start.complete;

  std::unique_ptr<kernels::Backend> backend;
  int gpu = -1;
  if (opts.use_cuda) {
    gpu = opts.local_rank >= 0 ? opts.local_rank : rank % std::max(1, kernels::CudaDeviceCount());
    auto opened = kernels::OpenBackend({kernels::DeviceRequest::Kind::kCuda, gpu});
    if (!opened.ok()) return Failed("device", opened.status());
    backend = std::move(opened).value();
  } else {
    backend = kernels::OpenCpuBackend();
  }

  std::unique_ptr<transport::KvServer> server;
  if (rank == 0 && opts.serve_rendezvous && opts.rendezvous.starts_with("tcp://")) {
    // On the address the user named, never on every interface.
    auto endpoint = transport::KvServerEndpointFor(opts.rendezvous);
    if (!endpoint.ok()) return Refused("--rendezvous", endpoint.status());
    auto started = transport::KvServer::Start(*endpoint, {}, opts.auth);
    if (!started.ok()) return Failed("serving the rendezvous", started.status());
    server = std::move(started).value();
    spdlog::info("serving the rendezvous on {} ({})", *endpoint,
                 opts.auth ? "CurveZMQ, the job's key" : "NOT authenticated");
  }
  auto store = transport::OpenKvStore(opts.rendezvous, std::chrono::seconds(30), opts.auth);
  if (!store.ok()) return Refused("--rendezvous", store.status());
  auto run_id = AgreeRunId(opts, **store, std::chrono::milliseconds(c.timeout_ms));
  if (!run_id.ok()) return Failed("joining the other ranks", run_id.status());
  if (c.parameter_server) {
    Status st = internal::RunParameterServerRank(
        c, opts, **store, "huddle/" + *run_id, *train, test ? &*test : nullptr,
        resume ? &*resume : nullptr, complete,
        [](std::string_view what, const Status& s) { return Refused(what, s); });
    if (absl::IsCancelled(st)) st.SetPayload(kStopPayload, absl::Cord("1"));
    if (st.ok() && rank == 0 && complete) SayAlreadyComplete(c, *resume);
    return st;
  }
  CollectiveOptions co = opts.collective;
  co.key_prefix = "huddle/" + *run_id;
  auto collective = opts.use_cuda ? ConnectNccl(**store, co, gpu) : ConnectGloo(**store, co);
  if (!collective.ok()) return Failed("joining the other ranks", collective.status());
  spdlog::info("rank {}/{} joined through {} ({} on {})", rank, world, opts.rendezvous,
               (*collective)->backend(), backend->name());

  DataParallelOptions o;
  o.train = c.train;
  o.train.backend = backend.get();
  o.seed = c.seed;
  o.bucket_bytes = c.bucket_bytes;
  o.first_bucket_bytes = c.first_bucket_bytes;
  o.checksum_every = c.checksum_every;
  o.overlap = c.overlap;
  o.state_on_rank0 = true;
  o.resume = resume ? &*resume : nullptr;
  if (c.dp_sgd) o.dp_sgd = DataParallelDpSgd{c.dp_sgd->dp, noise ? &*noise : nullptr};
  Reporter reporter(c, world, std::string((*collective)->backend()), test ? &*test : nullptr,
                    privacy ? &*privacy : nullptr);
  if (resume) reporter.set_last_steps(resume->steps);
  o.on_epoch = [&](const EpochReport& r) -> Status {
    if (rank == 0) HUDDLE_RETURN_IF_ERROR(reporter.OnEpoch(r));
    return absl::OkStatus();
  };
  if (const int64_t sleep_ms = SleepAfterStepForTesting(c, rank); sleep_ms > 0) {
    // datacenter.slowdown_for_testing: this rank emulates a device (and maybe a slow one).
    o.after_step_for_testing = [ms = sleep_ms](int64_t, float*, int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
  }
  // A stop (SIGINT/SIGTERM on any rank) takes effect on every rank after the same step.
  o.stop = opts.stop;
  std::optional<int64_t> stopped_at_step;
  if (!c.dp_sgd && !complete) {
    // With DP-SGD no checkpoint: the ledger records whole epochs before anything is released,
    // so the job resumes from its last epoch's checkpoint (steps since need no entry).
    o.on_stop = [&](const TrainingState& state) -> Status {
      HUDDLE_RETURN_IF_ERROR(
          WriteTrainingState(OutPath(c.out_dir, kDatacenterCheckpointFile), state));
      stopped_at_step = state.steps;
      return absl::OkStatus();
    };
  }
  if (rank == 0 && !complete) {
    if (!resume) {
      std::printf("%s: %d rank(s), %s, model %s, global batch %lld, %lld epochs\n", kJobCommand,
                  world, std::string((*collective)->backend()).c_str(),
                  models::DescribeModel(c.model).c_str(),
                  static_cast<long long>(c.dp_sgd ? c.dp_sgd->dp.expected_batch_size
                                                  : c.train.batch_size * world),
                  static_cast<long long>(c.train.epochs));
    }
    if (privacy) {
      const privacy::DpEvent& plan = privacy->plan();
      auto done = privacy->SpentWhenDone();
      std::printf(
          "DP-SGD across ranks: %lld steps (%lld to run), Poisson q = %.4g, noise multiplier %g, "
          "clip norm %g, %s accountant: when done, %s; the ledger (%s) records %lld steps so "
          "far; noise: %s on rank 0\n",
          static_cast<long long>(plan.steps),
          static_cast<long long>(std::max<int64_t>(0, plan.steps - (resume ? resume->steps : 0))),
          plan.sampling_rate, plan.noise_multiplier, c.dp_sgd->dp.clip_norm,
          privacy::AccountantName(c.dp_sgd->accountant),
          done.ok() ? done->Text().c_str() : std::string(done.status().message()).c_str(),
          privacy::kLedgerFile, static_cast<long long>(privacy->ledger_steps()),
          privacy->noise().description.c_str());
    }
    std::fflush(stdout);
  }
  TensorList params = models::InitModel(c.model, DeriveSeed(c.seed, kInitStream));
  if (opts.on_training_start) opts.on_training_start();
  auto stats = TrainDataParallel(**collective, c.model, o, data::DatasetView{&*train, {}}, &params);
  if (!stats.ok()) {
    const bool stopped = absl::IsCancelled(stats.status());
    if (stopped) {
      if (stopped_at_step) {
        std::printf("%s: stopped after step %lld; checkpoint %s written (continue with --resume)\n",
                    kJobCommand, static_cast<long long>(*stopped_at_step),
                    OutPath(c.out_dir, kDatacenterCheckpointFile).c_str());
      } else if (rank == 0) {
        std::printf("%s: stopped; --resume continues from the last epoch's checkpoint\n",
                    kJobCommand);
      }
      std::fflush(stdout);
    }
    if (privacy) {
      // The ledger may hold an entry whose epoch's outputs were not all written.
      const std::string why =
          stopped ? "stopped by a signal" : fmt::format("failed: {}", stats.status().message());
      if (Status st = privacy->WriteReport(why); !st.ok()) {
        spdlog::error("cannot write {}: {}", privacy::kPrivacyReportFile, st.message());
      }
    }
    Status failed = Failed(fmt::format("rank {}", rank), stats.status());
    if (stopped) failed.SetPayload(kStopPayload, absl::Cord("1"));
    return failed;
  }
  if (rank == 0 && complete) {
    SayAlreadyComplete(c, *resume);
    return absl::OkStatus();
  }
  if (rank == 0) {
    if (Status st = reporter.WriteSummary(*stats); !st.ok()) return Failed("summary.json", st);
    std::optional<JobSpend> spend;
    if (privacy) {
      if (Status st = privacy->WriteReport(); !st.ok()) {
        return Failed(privacy::kPrivacyReportFile, st);
      }
      auto spent = privacy->Spent();
      if (!spent.ok()) return Failed("privacy", spent.status());
      spend = *spent;
    }
    const double steps_per_s =
        static_cast<double>(stats->steps - (resume ? resume->steps : 0)) / stats->seconds;
    std::printf("done: %lld steps", static_cast<long long>(stats->steps));
    if (!privacy) std::printf(" in %.1f s (%.1f steps/s)", stats->seconds, steps_per_s);
    if (auto acc = reporter.final_test_accuracy()) std::printf(" | test accuracy %.4f", *acc);
    if (spend) {
      std::printf(" | %s (the ledger counts %lld steps)", spend->Text().c_str(),
                  static_cast<long long>(spend->ledger_steps));
    }
    if (auto t = reporter.target_seconds()) {
      std::printf(" | reached %.2f after %.1f s%s", c.target_accuracy, *t,
                  privacy ? " (not private)" : "");
    }
    if (privacy) std::printf(" | (not private) %.1f s (%.1f steps/s)", stats->seconds, steps_per_s);
    std::printf(
        " | replicas checked identical %lld times\noutputs: %s/{metrics.jsonl,%s"
        "summary.json,model.bin,checkpoint.bin}\n",
        static_cast<long long>(stats->checksums), c.out_dir.c_str(),
        privacy ? "operator_metrics.jsonl,privacy_ledger.jsonl,privacy.json," : "");
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace huddle::datacenter
