// `huddle datacenter`: one model trained synchronously across ranks (docs/datacenter.md).
//
// Launcher (no --rank): serves a rendezvous on 127.0.0.1, starts `nproc` rank processes of this
// binary under a fresh run id, shows rank 0's progress, and when a rank fails stops the others and
// quotes its error. Rank (--rank R --world-size W --rendezvous URL): loads the whole training set,
// joins the collective and trains; rank 0 also evaluates, appends OUT/metrics.jsonl, checkpoints
// and writes the model.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/process.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/rng.h"
#include "common/secure_random.h"
#include "common/tensor_io.h"
#include "data/csv.h"
#include "data/fashion_mnist.h"
#include "datacenter/checkpoint.h"
#include "datacenter/collective.h"
#include "datacenter/data_parallel.h"
#include "kernels/backend.h"
#include "transport/kv_store.h"

namespace huddle::cli {
namespace {

constexpr uint64_t kInitStream = 0x696e6974;  // "init", as the coordinator's
constexpr char kCommand[] = "huddle datacenter";

std::string Path(const std::string& dir, const char* file) { return dir + "/" + file; }

int Fail(int code, std::string_view what, const Status& st) {
  std::fprintf(stderr, "%s: %.*s%s%s\n", kCommand, static_cast<int>(what.size()), what.data(),
               what.empty() ? "" : ": ", std::string(st.message()).c_str());
  return code;
}

// `cpu`, `cuda` (GPU local_rank) or `auto` (a GPU when one is usable), resolved.
StatusOr<bool> UseCuda(const std::string& device) {
  if (device == "cpu") return false;
  const bool usable = kernels::BuiltWithCuda() && kernels::CudaDeviceCount() > 0;
  if (device == "auto") return usable;
  if (!kernels::BuiltWithCuda()) {
    return absl::FailedPreconditionError("device cuda: this build has no CUDA support");
  }
  if (!usable) return absl::FailedPreconditionError("device cuda: no usable GPU on this machine");
  return true;
}

StatusOr<data::Dataset> LoadTrainingData(const data::DataSpec& d) {
  if (d.format == "csv") {
    return data::LoadCsvDataset(d.path, data::CsvOptions{d.num_classes, d.csv_scale_255});
  }
  return data::LoadFashionMnist(d.path, data::Split::kTrain, nullptr);
}

// Rank 0's bookkeeping after each epoch: evaluation, metrics, progress, checkpoint.
class Reporter {
 public:
  Reporter(const DatacenterConfig& c, int world, std::string backend, const data::Dataset* test)
      : c_(c), world_(world), backend_(std::move(backend)), test_(test) {}

  // DP-SGD: the sampling rate of the run, for the epsilon spent after each epoch.
  void set_dp_rate(double q) { dp_rate_ = q; }

  // Epsilon at the configured delta after `steps` DP-SGD steps.
  StatusOr<double> EpsilonAfter(int64_t steps) const {
    const privacy::DpEvent event{dp_rate_, c_.dp_sgd->dp.noise_multiplier, steps};
    HUDDLE_ASSIGN_OR_RETURN(
        privacy::Spend spend,
        privacy::ComputeEpsilon(std::span(&event, 1), c_.dp_sgd->delta, c_.dp_sgd->accountant));
    return spend.epsilon;
  }

  Status OnEpoch(const datacenter::EpochReport& r) {
    const int64_t epoch = r.epoch + 1;  // 1-based in outputs
    const bool last = r.last;
    nlohmann::json m;
    m["epoch"] = epoch;
    m["steps"] = r.steps;
    m["train_loss"] = r.loss;
    m["train_accuracy"] = r.accuracy;
    m["seconds"] = r.seconds;
    m["epoch_seconds"] = r.epoch_seconds;
    m["world_size"] = world_;
    std::string line = fmt::format("epoch {}/{}: train loss {:.4f} acc {:.4f}", epoch, r.epochs,
                                   r.loss, r.accuracy);
    if (c_.dp_sgd) {
      HUDDLE_ASSIGN_OR_RETURN(const double epsilon, EpsilonAfter(r.steps));
      m["epsilon"] = epsilon;
      m["delta"] = c_.dp_sgd->delta;
      line +=
          fmt::format(" (not private) | epsilon {:.4g} at delta {:g}", epsilon, c_.dp_sgd->delta);
    }
    if (test_ != nullptr && (last || (c_.eval_every > 0 && epoch % c_.eval_every == 0))) {
      HUDDLE_ASSIGN_OR_RETURN(
          models::EvalStats eval,
          models::EvaluateMlp(c_.model, r.state->params, data::DatasetView{test_, {}}));
      m["test_loss"] = eval.loss;
      m["test_accuracy"] = eval.accuracy;
      line += fmt::format(" | test loss {:.4f} acc {:.4f}", eval.loss, eval.accuracy);
      final_test_accuracy_ = eval.accuracy;
      if (c_.target_accuracy > 0 && !target_seconds_ && eval.accuracy >= c_.target_accuracy) {
        target_seconds_ = r.seconds;
        target_epoch_ = epoch;
      }
    }
    line += fmt::format(" | {:.1f} s ({:.1f} steps/s)", r.seconds,
                        static_cast<double>(r.steps - last_steps_) / r.epoch_seconds);
    last_steps_ = r.steps;
    HUDDLE_RETURN_IF_ERROR(AppendLine(Path(c_.out_dir, "metrics.jsonl"), m.dump()));
    if (last || (c_.checkpoint_every > 0 && epoch % c_.checkpoint_every == 0)) {
      HUDDLE_RETURN_IF_ERROR(datacenter::WriteTrainingState(
          Path(c_.out_dir, datacenter::kDatacenterCheckpointFile), *r.state));
    }
    if (last)
      HUDDLE_RETURN_IF_ERROR(WriteModelFile(Path(c_.out_dir, "model.bin"), r.state->params));
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    return absl::OkStatus();
  }

  void set_last_steps(int64_t steps) { last_steps_ = steps; }

  Status WriteSummary(const datacenter::DataParallelStats& s) const {
    nlohmann::json j;
    j["job"] = c_.job_name;
    j["world_size"] = world_;
    j["backend"] = backend_;
    j["epochs"] = c_.train.epochs;
    j["steps"] = s.steps;
    j["global_batch"] = c_.train.batch_size * world_;
    j["seconds_this_session"] = s.seconds;
    j["train_loss"] = s.loss;
    j["train_accuracy"] = s.accuracy;
    j["reduce_seconds"] = s.reduce_seconds;
    j["wait_seconds"] = s.wait_seconds;
    j["bytes_reduced"] = s.bytes_reduced;
    j["buckets_per_step"] = s.buckets;
    j["replica_checks_passed"] = s.checksums;
    if (final_test_accuracy_) j["final_test_accuracy"] = *final_test_accuracy_;
    if (s.dp_event) {
      HUDDLE_ASSIGN_OR_RETURN(const double epsilon, EpsilonAfter(s.dp_event->steps));
      j["privacy"] = {{"mechanism", "dp-sgd across ranks (Poisson-subsampled Gaussian)"},
                      {"epsilon", epsilon},
                      {"delta", c_.dp_sgd->delta},
                      {"accountant", privacy::AccountantName(c_.dp_sgd->accountant)},
                      {"sampling_rate", s.dp_event->sampling_rate},
                      {"noise_multiplier", s.dp_event->noise_multiplier},
                      {"clip_norm", c_.dp_sgd->dp.clip_norm},
                      {"steps", s.dp_event->steps},
                      {"noise_source", s.private_noise ? "os-csprng" : "NOT PRIVATE"}};
    }
    if (c_.target_accuracy > 0) {
      j["target_accuracy"] = c_.target_accuracy;
      j["seconds_to_target"] = target_seconds_ ? nlohmann::json(*target_seconds_) : nullptr;
      j["epoch_reaching_target"] = target_epoch_ ? nlohmann::json(*target_epoch_) : nullptr;
    }
    return WriteFileAtomic(Path(c_.out_dir, "summary.json"), j.dump(2) + "\n");
  }

  std::optional<double> final_test_accuracy() const { return final_test_accuracy_; }
  std::optional<double> target_seconds() const { return target_seconds_; }

 private:
  const DatacenterConfig& c_;
  int world_;
  std::string backend_;
  const data::Dataset* test_;
  int64_t last_steps_ = 0;
  std::optional<double> final_test_accuracy_, target_seconds_;
  std::optional<int64_t> target_epoch_;
  double dp_rate_ = 0;
};

// DP-SGD: the run's steps and privacy spend, checked against the budget before anything trains.
// Every rank computes the same answer from the same configuration and data size.
StatusOr<privacy::DpEvent> PlanPrivacy(const DatacenterConfig& c, int64_t n) {
  const DatacenterDpSgd& d = *c.dp_sgd;
  const int64_t m = d.dp.expected_batch_size;
  if (m > n) {
    return absl::InvalidArgumentError(fmt::format(
        "train.dp_sgd.expected_batch_size is {}; the training set has only {} examples", m, n));
  }
  // As models::TrainMlpDpSgd: round(epochs * n / m) steps, at least one.
  const __int128 steps = (static_cast<__int128>(c.train.epochs) * n + m / 2) / m;
  const privacy::DpEvent event{static_cast<double>(m) / static_cast<double>(n),
                               d.dp.noise_multiplier,
                               std::max<int64_t>(1, static_cast<int64_t>(steps))};
  HUDDLE_ASSIGN_OR_RETURN(privacy::Spend spend,
                          privacy::ComputeEpsilon(std::span(&event, 1), d.delta, d.accountant));
  if (d.epsilon_budget && !(spend.epsilon <= *d.epsilon_budget)) {
    auto z = privacy::CalibrateNoiseMultiplier(*d.epsilon_budget, d.delta, event.sampling_rate,
                                               event.steps, d.accountant);
    return absl::FailedPreconditionError(fmt::format(
        "train.dp_sgd: {} steps at q = {:.4g} with noise_multiplier {} would spend epsilon {:.4g} "
        "at delta {:g}, over the budget of {} (noise_multiplier {} would fit; or fewer epochs, "
        "or a smaller expected_batch_size)",
        event.steps, event.sampling_rate, event.noise_multiplier, spend.epsilon, d.delta,
        *d.epsilon_budget, z.ok() ? fmt::format("{:.4g}", *z) : "none up to 1e12"));
  }
  return event;
}

// The endpoint rank 0 serves the rendezvous on: the URL's port on every interface.
StatusOr<std::string> ServeEndpoint(const std::string& url) {
  const size_t colon = url.rfind(':');
  if (!url.starts_with("tcp://") || colon == std::string::npos || colon < 6) {
    return absl::InvalidArgumentError(
        fmt::format("--rendezvous '{}': rank 0 serves tcp://HOST:PORT rendezvous only", url));
  }
  return "tcp://0.0.0.0" + url.substr(colon);
}

int RunRank(const DatacenterConfig& c, const DatacenterFlags& f) {
  if (Status st = SetupLogging(c.log_level, fmt::format("rank {}", f.rank)); !st.ok()) {
    return Fail(2, "", st);
  }
  auto cuda = UseCuda(c.device);
  if (!cuda.ok()) return Fail(2, "", cuda.status());
  datacenter::CollectiveOptions co;
  co.rank = f.rank;
  co.world_size = f.world_size;
  co.timeout = std::chrono::milliseconds(c.timeout_ms);
  co.host = f.host;
  co.key_prefix = "huddle/" + f.run_id;
  if (Status st = datacenter::ValidateCollectiveOptions(co); !st.ok()) return Fail(2, "", st);
  if (Status st = MakeDirs(c.out_dir); !st.ok()) return Fail(1, "output directory", st);

  // Everything that can fail alone comes before joining the others.
  auto train = LoadTrainingData(c.data);
  if (!train.ok()) return Fail(1, "training data", train.status());
  std::optional<privacy::DpEvent> dp_plan;
  if (c.dp_sgd) {
    auto planned = PlanPrivacy(c, train->size());
    if (!planned.ok()) return Fail(2, "", planned.status());
    dp_plan = *planned;
  }
  std::optional<data::Dataset> test;
  if (f.rank == 0 && !c.eval_data.empty()) {
    auto loaded = data::LoadFashionMnist(c.eval_data, data::Split::kTest, nullptr);
    if (!loaded.ok()) return Fail(1, "evaluation data", loaded.status());
    test = std::move(loaded).value();
  }
  std::optional<datacenter::TrainingState> resume;
  const std::string ckpt_path = Path(c.out_dir, datacenter::kDatacenterCheckpointFile);
  if (f.rank == 0 && f.resume) {
    auto state = datacenter::ReadTrainingState(ckpt_path);
    if (!state.ok()) return Fail(1, "--resume", state.status());
    resume = std::move(state).value();
    if (Status st = KeepJsonLinesUpTo(Path(c.out_dir, "metrics.jsonl"), "epoch",
                                      static_cast<uint64_t>(resume->epochs_done));
        !st.ok()) {
      return Fail(1, "metrics.jsonl", st);
    }
    spdlog::info("resuming after epoch {} (step {}) from {}", resume->epochs_done, resume->steps,
                 ckpt_path);
  } else if (f.rank == 0) {
    std::error_code ec;
    std::filesystem::remove(Path(c.out_dir, "metrics.jsonl"), ec);
  }

  std::unique_ptr<kernels::Backend> backend;
  int gpu = -1;
  if (*cuda) {
    gpu = f.local_rank >= 0 ? f.local_rank : f.rank % std::max(1, kernels::CudaDeviceCount());
    auto opened = kernels::OpenBackend({kernels::DeviceRequest::Kind::kCuda, gpu});
    if (!opened.ok()) return Fail(1, "device", opened.status());
    backend = std::move(opened).value();
  } else {
    backend = kernels::OpenCpuBackend();
  }

  std::unique_ptr<transport::KvServer> server;
  if (f.rank == 0 && f.serve_rendezvous && f.rendezvous.starts_with("tcp://")) {
    auto endpoint = ServeEndpoint(f.rendezvous);
    if (!endpoint.ok()) return Fail(2, "", endpoint.status());
    auto started = transport::KvServer::Start(*endpoint);
    if (!started.ok()) return Fail(1, "serving the rendezvous", started.status());
    server = std::move(started).value();
    spdlog::info("serving the rendezvous on {}", *endpoint);
  }
  auto store = transport::OpenKvStore(f.rendezvous);
  if (!store.ok()) return Fail(2, "--rendezvous", store.status());
  auto collective =
      *cuda ? datacenter::ConnectNccl(**store, co, gpu) : datacenter::ConnectGloo(**store, co);
  if (!collective.ok()) return Fail(1, "joining the other ranks", collective.status());
  spdlog::info("rank {}/{} joined through {} ({} on {})", f.rank, f.world_size, f.rendezvous,
               (*collective)->backend(), backend->name());

  datacenter::DataParallelOptions o;
  o.train = c.train;
  o.train.backend = backend.get();
  o.seed = c.seed;
  o.bucket_bytes = c.bucket_bytes;
  o.first_bucket_bytes = c.first_bucket_bytes;
  o.checksum_every = c.checksum_every;
  o.overlap = c.overlap;
  o.state_on_rank0 = true;
  o.resume = resume ? &*resume : nullptr;
  // DP-SGD: rank 0's noise (and the sampling key it broadcasts) from the OS CSPRNG.
  std::optional<privacy::NoiseSource> noise;
  if (c.dp_sgd) {
    if (f.rank == 0) noise = privacy::NoiseSource::Secure();
    o.dp_sgd = datacenter::DataParallelDpSgd{c.dp_sgd->dp, noise ? &*noise : nullptr};
  }
  Reporter reporter(c, f.world_size, std::string((*collective)->backend()),
                    test ? &*test : nullptr);
  if (resume) reporter.set_last_steps(resume->steps);
  if (dp_plan) reporter.set_dp_rate(dp_plan->sampling_rate);
  o.on_epoch = [&](const datacenter::EpochReport& r) -> Status {
    if (f.rank == 0) HUDDLE_RETURN_IF_ERROR(reporter.OnEpoch(r));
    if (StopFlag().load()) return absl::CancelledError("stopped by a signal");
    return absl::OkStatus();
  };
  if (f.rank == 0 && !resume) {
    std::printf("%s: %d rank(s), %s, model %s, global batch %lld, %lld epochs\n", kCommand,
                f.world_size, std::string((*collective)->backend()).c_str(),
                models::DescribeMlp(c.model).c_str(),
                static_cast<long long>(c.dp_sgd ? c.dp_sgd->dp.expected_batch_size
                                                : c.train.batch_size * f.world_size),
                static_cast<long long>(c.train.epochs));
    if (dp_plan) {
      auto eps = reporter.EpsilonAfter(dp_plan->steps);
      std::printf(
          "DP-SGD across ranks: %lld steps, Poisson q = %.4g, noise multiplier %g, clip "
          "norm %g: epsilon %.4g at delta %g (%s); noise from the OS CSPRNG on rank 0\n",
          static_cast<long long>(dp_plan->steps), dp_plan->sampling_rate, dp_plan->noise_multiplier,
          c.dp_sgd->dp.clip_norm, eps.ok() ? *eps : -1.0, c.dp_sgd->delta,
          privacy::AccountantName(c.dp_sgd->accountant));
    }
    std::fflush(stdout);
  }
  TensorList params = models::InitMlp(c.model, DeriveSeed(c.seed, kInitStream));
  auto stats = datacenter::TrainDataParallel(**collective, c.model, o,
                                             data::DatasetView{&*train, {}}, &params);
  if (!stats.ok()) {
    return Fail(absl::IsCancelled(stats.status()) ? 130 : 1, fmt::format("rank {}", f.rank),
                stats.status());
  }
  if (f.rank == 0) {
    if (Status st = reporter.WriteSummary(*stats); !st.ok()) return Fail(1, "summary.json", st);
    std::printf("done: %lld steps in %.1f s (%.1f steps/s)", static_cast<long long>(stats->steps),
                stats->seconds,
                static_cast<double>(stats->steps - (resume ? resume->steps : 0)) / stats->seconds);
    if (auto acc = reporter.final_test_accuracy()) std::printf(" | test accuracy %.4f", *acc);
    if (stats->dp_event) {
      auto eps = reporter.EpsilonAfter(stats->dp_event->steps);
      if (eps.ok()) std::printf(" | epsilon %.4g at delta %g", *eps, c.dp_sgd->delta);
    }
    if (auto t = reporter.target_seconds()) {
      std::printf(" | reached %.2f after %.1f s", c.target_accuracy, *t);
    }
    std::printf(
        " | replicas checked identical %lld times\noutputs: %s/{metrics.jsonl,"
        "summary.json,model.bin,checkpoint.bin}\n",
        static_cast<long long>(stats->checksums), c.out_dir.c_str());
    std::fflush(stdout);
  }
  return 0;
}

// `--nproc N`: N ranks of this binary on this host.
int Launch(const DatacenterConfig& c, const DatacenterFlags& f, int64_t nproc,
           const std::string& exe) {
  auto cuda = UseCuda(c.device);
  if (!cuda.ok()) return Fail(2, "", cuda.status());
  if (*cuda && nproc > kernels::CudaDeviceCount()) {
    return Fail(2, "",
                absl::InvalidArgumentError(fmt::format(
                    "--nproc {} with device {}: this host has {} GPU(s), and NCCL needs one per "
                    "rank",
                    nproc, c.device, kernels::CudaDeviceCount())));
  }
  const std::string logs = c.out_dir + "/logs";
  if (Status st = MakeDirs(logs); !st.ok()) return Fail(1, "output directory", st);
  auto server = transport::KvServer::Start("tcp://127.0.0.1:0");
  if (!server.ok()) return Fail(1, "serving the rendezvous", server.status());
  const std::string run_id = fmt::format("{:016x}", SecureRandomU64());
  std::printf("%s: %lld ranks on this host, rendezvous %s, logs in %s\n", kCommand,
              static_cast<long long>(nproc), (*server)->url().c_str(), logs.c_str());
  std::fflush(stdout);

  std::vector<pid_t> ranks;
  std::vector<std::string> rank_logs;
  for (int64_t r = 0; r < nproc; ++r) {
    std::vector<std::string> argv = {exe,
                                     "datacenter",
                                     "--config",
                                     f.config,
                                     "--out",
                                     c.out_dir,
                                     "--rank",
                                     std::to_string(r),
                                     "--world-size",
                                     std::to_string(nproc),
                                     "--local-rank",
                                     std::to_string(r),
                                     "--rendezvous",
                                     (*server)->url(),
                                     "--run-id",
                                     run_id,
                                     "--no-serve-rendezvous",
                                     "--device",
                                     c.device};
    if (f.resume) argv.push_back("--resume");
    rank_logs.push_back(fmt::format("{}/rank-{}.log", logs, r));
    auto pid = Spawn(argv, rank_logs.back(), /*keep_stdout=*/r == 0);
    if (!pid.ok()) {
      for (pid_t p : ranks) ::kill(p, SIGTERM);
      return Fail(1, "starting the ranks", pid.status());
    }
    ranks.push_back(*pid);
  }

  // The first rank to fail is the one to quote: the others usually fail because of it. They
  // notice on their own within the collective timeout; a few seconds later they are stopped.
  std::vector<int> codes(ranks.size(), -1);
  int first_failed = -1;
  auto failed_at = std::chrono::steady_clock::now();
  size_t running = ranks.size();
  while (running > 0) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      int status = 0;
      if (codes[r] >= 0 || ::waitpid(ranks[r], &status, WNOHANG) != ranks[r]) continue;
      codes[r] = ExitCode(status);
      --running;
      if (codes[r] != 0 && first_failed < 0) {
        first_failed = static_cast<int>(r);
        failed_at = std::chrono::steady_clock::now();
      }
    }
    const bool grace_over =
        first_failed >= 0 && std::chrono::steady_clock::now() - failed_at > std::chrono::seconds(5);
    if (StopFlag().load() || grace_over) {
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (codes[r] < 0) ::kill(ranks[r], SIGTERM);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (first_failed < 0) return 0;
  std::fprintf(stderr, "%s: rank %d exited with %d: %s (see %s)\n", kCommand, first_failed,
               codes[first_failed], LastLogLine(rank_logs[first_failed]).c_str(),
               rank_logs[first_failed].c_str());
  return codes[first_failed] == 130 ? 130 : 1;
}

}  // namespace

int RunDatacenterCommand(const DatacenterFlags& flags, const std::string& self_exe) {
  auto config = LoadDatacenterConfig(flags.config);
  if (!config.ok()) return Fail(2, "", config.status());
  DatacenterConfig c = std::move(config).value();
  if (!flags.out_dir.empty()) c.out_dir = flags.out_dir;
  if (!flags.device.empty()) {
    if (flags.device != "cpu" && flags.device != "cuda" && flags.device != "auto") {
      return Fail(2, "",
                  absl::InvalidArgumentError(
                      fmt::format("--device '{}': give cpu, cuda or auto", flags.device)));
    }
    c.device = flags.device;
  }
  const bool rank_mode = flags.rank >= 0 || flags.world_size > 0 || !flags.rendezvous.empty();
  if (!rank_mode) return Launch(c, flags, flags.nproc > 0 ? flags.nproc : c.nproc, self_exe);
  if (flags.nproc > 0) {
    return Fail(
        2, "",
        absl::InvalidArgumentError("--nproc starts ranks on this host; it does not combine with "
                                   "--rank/--world-size/--rendezvous"));
  }
  if (flags.rank < 0 || flags.world_size <= 0 || flags.rendezvous.empty()) {
    return Fail(
        2, "",
        absl::InvalidArgumentError("a rank needs all of --rank R, --world-size W and --rendezvous "
                                   "tcp://HOST:PORT (or file:///DIR)"));
  }
  const bool loopback_rendezvous = flags.rendezvous.starts_with("tcp://127.") ||
                                   flags.rendezvous.starts_with("tcp://localhost") ||
                                   flags.rendezvous.starts_with("file://");
  if (flags.world_size > 1 && !loopback_rendezvous && flags.host.starts_with("127.")) {
    return Fail(2, "",
                absl::InvalidArgumentError(
                    "--host: give this host's address that the other ranks can reach "
                    "(the rendezvous is on another host; 127.0.0.1 would only work on "
                    "one machine)"));
  }
  return RunRank(c, flags);
}

}  // namespace huddle::cli
