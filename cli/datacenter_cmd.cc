// `huddle datacenter`: one model trained synchronously across ranks (docs/datacenter.md).
//
// Launcher (no --rank): serves a rendezvous on 127.0.0.1, starts `nproc` rank processes of this
// binary under a fresh run id, shows rank 0's progress, and when a rank fails stops the others and
// quotes its error. Rank (--rank R --world-size W --rendezvous URL): loads the whole training set,
// joins the collective and trains; rank 0 also evaluates, appends OUT/metrics.jsonl, checkpoints
// and writes the model. With train.dp_sgd, rank 0 first appends each epoch's steps to the privacy
// ledger, reports every epsilon from it, writes OUT/privacy.json, and keeps the values computed
// from the private data without noise apart (datacenter/privacy_session.h).
//
// Security of the rendezvous (docs/datacenter.md): a tcp:// rendezvous is authenticated with the
// job's CurveZMQ key pair (transport/kv_store.h). The launcher generates one per job and hands it
// to its ranks as a 0600 key file in a private directory named by HUDDLE_RENDEZVOUS_KEY in their
// environment (never on the command line); ranks started by hand read the same variable (a
// key file of `huddle keygen`, copied to every host), and refuse an unauthenticated tcp://
// rendezvous unless HUDDLE_RENDEZVOUS_INSECURE=1.
//
// Stopping: SIGINT/SIGTERM set the stop flag. While training, every rank stops after the same
// step (datacenter::DataParallelOptions::stop), rank 0 writes a checkpoint that --resume
// continues from exactly, and the rank exits with 128 + the signal. Before training (loading,
// rendezvous) a rank exits at once. The launcher forwards the signal, waits for its ranks and
// reports a clean stop with 128 + the signal (130 for SIGINT, 143 for SIGTERM).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
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
#include "datacenter/privacy_session.h"
#include "kernels/backend.h"
#include "privacy/report.h"
#include "transport/curve_keys.h"
#include "transport/kv_store.h"

namespace huddle::cli {
namespace {

using datacenter::CheckNoLedgerForNonDpRun;
using datacenter::DatacenterPrivacy;
using datacenter::JobSpend;
using datacenter::kNoNoise;
using datacenter::kOperatorMetricsFile;
using datacenter::kOperatorOnly;
using datacenter::PlanDpSgd;
using datacenter::SessionNoise;

constexpr uint64_t kInitStream = 0x696e6974;  // "init", as the coordinator's
constexpr char kCommand[] = "huddle datacenter";
// The job's rendezvous key file (tcp://), and the explicit opt-out of authentication.
constexpr char kKeyEnv[] = "HUDDLE_RENDEZVOUS_KEY";
constexpr char kInsecureEnv[] = "HUDDLE_RENDEZVOUS_INSECURE";
// The key under which rank 0 publishes the run id it drew, when none was given.
constexpr char kRunIdKey[] = "huddle/run-id";
constexpr char kDefaultRunId[] = "default";  // DatacenterFlags::run_id when --run-id is absent

// The signal that set StopFlag() (0: none yet). Recorded by this command's own handlers so that
// exit codes and messages can name it.
std::atomic<int>& StopSignal() {
  static std::atomic<int> signal{0};
  return signal;
}

void InstallDatacenterStopHandlers() {
  StopFlag();  // initialised here, not first in a signal handler
  StopSignal();
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    int none = 0;
    StopSignal().compare_exchange_strong(none, sig);
    StopFlag().store(true);
  };
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

// The shell's convention for a stop by signal: 130 (SIGINT), 143 (SIGTERM).
int StopExitCode() { return 128 + (StopSignal().load() != 0 ? StopSignal().load() : SIGTERM); }
const char* StopSignalName() { return StopSignal().load() == SIGINT ? "SIGINT" : "SIGTERM"; }
bool IsStopExitCode(int code) { return code == 128 + SIGINT || code == 128 + SIGTERM; }

// A stop requested before training (loading the data, waiting at the rendezvous) ends the rank at
// once: nothing is trained yet, so nothing needs saving. Once training runs, the trainer stops
// within a few steps and checkpoints; if it cannot (a collective stuck until its timeout), the
// process still ends `grace` after the request.
class StopWatchdog {
 public:
  explicit StopWatchdog(std::chrono::milliseconds grace) : grace_(grace) {
    thread_ = std::thread([this] { Watch(); });
  }
  ~StopWatchdog() {
    done_ = true;
    thread_.join();
  }
  void TrainingStarted() { training_ = true; }

 private:
  void Watch() {
    std::optional<std::chrono::steady_clock::time_point> asked;
    while (!done_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!StopFlag().load()) continue;
      const auto now = std::chrono::steady_clock::now();
      if (!asked) asked = now;
      if (!training_ || now - *asked > grace_) {
        std::fprintf(stderr, "%s: stopped by %s %s\n", kCommand, StopSignalName(),
                     training_ ? "(training did not stop in time)" : "before training");
        std::fflush(nullptr);
        std::_Exit(StopExitCode());
      }
    }
  }

  std::chrono::milliseconds grace_;
  std::atomic<bool> training_{false}, done_{false};
  std::thread thread_;
};

// The rendezvous key of a rank: the file --rendezvous-key (or HUDDLE_RENDEZVOUS_KEY) names; none
// for a file:// store; a refusal for an unauthenticated tcp:// rendezvous unless
// --insecure-rendezvous (or HUDDLE_RENDEZVOUS_INSECURE=1).
StatusOr<std::optional<transport::KvAuth>> RendezvousAuth(const DatacenterFlags& f) {
  const std::string& rendezvous = f.rendezvous;
  const char* env_path = std::getenv(kKeyEnv);
  const char* path = !f.rendezvous_key.empty() ? f.rendezvous_key.c_str() : env_path;
  const char* env_insecure = std::getenv(kInsecureEnv);
  const char* insecure = f.insecure_rendezvous ? "1" : env_insecure;
  if (!rendezvous.starts_with("tcp://")) {
    if (path != nullptr && *path != '\0') {
      return absl::InvalidArgumentError(fmt::format(
          "{} is set, but the rendezvous {} is not tcp://: a file store is protected by its "
          "directory's permissions, not by a key",
          kKeyEnv, rendezvous));
    }
    return std::optional<transport::KvAuth>();
  }
  if (path != nullptr && *path != '\0') {
    auto auth = transport::ReadKvAuthFile(path);
    if (!auth.ok()) {
      return Status(auth.status().code(),
                    fmt::format("rendezvous key {}: {}", path, auth.status().message()));
    }
    return std::optional<transport::KvAuth>(*std::move(auth));
  }
  if (insecure != nullptr && std::string_view(insecure) == "1") {
    spdlog::warn(
        "the rendezvous {} is NOT authenticated ({}=1): anyone who reaches it can join "
        "this job",
        rendezvous, kInsecureEnv);
    return std::optional<transport::KvAuth>();
  }
  return absl::FailedPreconditionError(fmt::format(
      "a tcp:// rendezvous needs the job's key, or anyone who reaches {} could join the job as a "
      "rank: make one with `huddle keygen server --id JOB --out DIR`, copy DIR/JOB.key to every "
      "host (mode 0600) and pass --rendezvous-key DIR/JOB.key (or set {}) to every rank; or pass "
      "--insecure-rendezvous (or set {}=1) to run unauthenticated on a network where every host "
      "is trusted",
      rendezvous, kKeyEnv, kInsecureEnv));
}

// The run id: the one given, or (none given) one that rank 0 draws from the OS CSPRNG and
// publishes in the store, which the other ranks read.
StatusOr<std::string> AgreeRunId(const DatacenterFlags& f, transport::KvStore& store,
                                 std::chrono::milliseconds timeout) {
  if (f.run_id != kDefaultRunId) return f.run_id;
  if (f.rank == 0) {
    const std::string id = fmt::format("{:016x}", SecureRandomU64());
    HUDDLE_RETURN_IF_ERROR(store.Set(kRunIdKey, id));
    return id;
  }
  return store.Get(kRunIdKey, timeout);
}

std::string Path(const std::string& dir, const char* file) { return dir + "/" + file; }

int Fail(int code, std::string_view what, const Status& st) {
  std::fprintf(stderr, "%s: %.*s%s%s\n", kCommand, static_cast<int>(what.size()), what.data(),
               what.empty() ? "" : ": ", std::string(st.message()).c_str());
  return code;
}

// `cpu`, `cuda` (GPU local_rank) or `auto` (a GPU when one is usable), resolved.
StatusOr<bool> UseCuda(const std::string& device) {
  if (device == "cpu") return false;
  // `auto` loads the CUDA plugin only where an NVIDIA driver is present.
  if (device == "auto") return kernels::CudaDeviceCount() > 0;
  StatusOr<int> gpus = kernels::CountCudaDevices();
  if (!gpus.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("device cuda: ", gpus.status().message()));
  }
  if (*gpus == 0)
    return absl::FailedPreconditionError("device cuda: no usable GPU on this machine");
  return true;
}

StatusOr<data::Dataset> LoadTrainingData(const data::DataSpec& d) {
  if (d.format == "csv") {
    return data::LoadCsvDataset(d.path, data::CsvOptions{d.num_classes, d.csv_scale_255});
  }
  return data::LoadFashionMnist(d.path, data::Split::kTrain, nullptr);
}

// Rank 0's bookkeeping after each epoch: ledger (DP-SGD), evaluation, metrics, checkpoint,
// model, privacy report, progress. With DP-SGD the epoch's ledger entry is durable before any of
// the rest is written (datacenter/privacy_session.h), and the outputs are split: metrics.jsonl and
// summary.json's top level hold only public or DP-protected values; values computed from the
// private data without noise, and timings, go to operator_metrics.jsonl and summary.json's
// `operator` object.
class Reporter {
 public:
  // `privacy` (rank 0 of a DP-SGD job) is not owned and may be null.
  Reporter(const DatacenterConfig& c, int world, std::string backend, const data::Dataset* test,
           DatacenterPrivacy* privacy)
      : c_(c), world_(world), backend_(std::move(backend)), test_(test), privacy_(privacy) {}

  Status OnEpoch(const datacenter::EpochReport& r) {
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
      line +=
          fmt::format(" | (not private) train loss {:.4f} acc {:.4f}, {:.1f} s ({:.1f} steps/s)",
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
      HUDDLE_RETURN_IF_ERROR(AppendLine(Path(c_.out_dir, "metrics.jsonl"), m.dump()));
      HUDDLE_RETURN_IF_ERROR(AppendLine(Path(c_.out_dir, kOperatorMetricsFile), op.dump()));
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
      HUDDLE_RETURN_IF_ERROR(AppendLine(Path(c_.out_dir, "metrics.jsonl"), m.dump()));
    }
    CrashIfAskedForTesting("metrics", epoch);
    if (last || (c_.checkpoint_every > 0 && epoch % c_.checkpoint_every == 0)) {
      HUDDLE_RETURN_IF_ERROR(datacenter::WriteTrainingState(
          Path(c_.out_dir, datacenter::kDatacenterCheckpointFile), *r.state));
      CrashIfAskedForTesting("checkpoint", epoch);
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
      return WriteFileAtomic(Path(c_.out_dir, "summary.json"), j.dump(2) + "\n");
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
    return WriteFileAtomic(Path(c_.out_dir, "summary.json"), j.dump(2) + "\n");
  }

  std::optional<double> final_test_accuracy() const { return final_test_accuracy_; }
  std::optional<double> target_seconds() const { return target_seconds_; }

 private:
  // datacenter.crash_for_testing: dies here as a machine failing at this point would.
  void CrashIfAskedForTesting(std::string_view after, int64_t epoch) const {
    if (c_.crash_after_for_testing == after && c_.crash_epoch_for_testing == epoch) {
      spdlog::warn("crash_for_testing: killing rank 0 after the {} of epoch {}", after, epoch);
      std::fflush(nullptr);
      std::raise(SIGKILL);
    }
  }

  const DatacenterConfig& c_;
  int world_;
  std::string backend_;
  const data::Dataset* test_;
  std::unique_ptr<models::Evaluator> evaluator_;
  DatacenterPrivacy* privacy_;
  int64_t last_steps_ = 0;
  std::optional<double> final_test_accuracy_, target_seconds_;
  std::optional<int64_t> target_epoch_;
};

// Whether checkpoint `s` is that of a job that ran to its end under config `c`: every step of the
// DP-SGD `plan`, or without DP-SGD every epoch, none of them part-way. A checkpoint of the other
// kind is not (the resume refuses it, saying why).
bool RanToItsEnd(const DatacenterConfig& c, const datacenter::TrainingState& s,
                 const std::optional<privacy::DpEvent>& plan) {
  if (plan) return s.dp_sgd && s.steps >= plan->steps;
  return !s.dp_sgd && s.epochs_done >= c.train.epochs && s.epoch_rows == 0;
}

// --resume of a job whose checkpoint `s` says it ran to its end: there is nothing to train, and
// its outputs (summary.json, metrics, model, checkpoint, ledger, logs) are left as they are.
void SayAlreadyComplete(const DatacenterConfig& c, const datacenter::TrainingState& s) {
  std::printf(
      "%s: the job in %s is already complete (%lld epochs, %lld steps; %s): nothing to resume, "
      "its outputs are left as they are (raise train.epochs to train further)\n",
      kCommand, c.out_dir.c_str(), static_cast<long long>(s.epochs_done),
      static_cast<long long>(s.steps),
      Path(c.out_dir, datacenter::kDatacenterCheckpointFile).c_str());
  std::fflush(stdout);
}

// Rank 0, before joining the others: the start rules of the privacy ledger (DP-SGD; see
// datacenter/privacy_session.h), the checkpoint to resume from, and the metrics files cut back to
// it. A --resume of a job that ran to its end sets *complete and changes nothing. Returns 0, or the
// exit code after saying why.
int PrepareRank0(const DatacenterConfig& c, const DatacenterFlags& f, int64_t n,
                 const std::optional<privacy::DpEvent>& plan, privacy::NoiseSource* noise,
                 std::optional<datacenter::TrainingState>* resume,
                 std::optional<DatacenterPrivacy>* privacy, bool* complete) {
  const std::string ckpt_path = Path(c.out_dir, datacenter::kDatacenterCheckpointFile);
  StatusOr<datacenter::TrainingState> state = absl::NotFoundError("no --resume");
  if (f.resume) {
    state = datacenter::ReadTrainingState(ckpt_path);
    if (state.ok() && RanToItsEnd(c, *state, plan)) {
      *complete = true;
      *resume = std::move(state).value();
      return 0;
    }
  }
  if (!c.dp_sgd) {
    if (Status st = CheckNoLedgerForNonDpRun(c.out_dir); !st.ok()) return Fail(1, "", st);
  } else {
    const double z = plan->noise_multiplier;
    SessionNoise session{z > 0 ? noise->Describe() : kNoNoise, z > 0 && noise->is_private()};
    auto opened = DatacenterPrivacy::Open(c, f.world_size, n, f.resume, *plan, std::move(session));
    if (!opened.ok()) return Fail(1, "privacy ledger", opened.status());
    privacy->emplace(std::move(opened).value());
  }
  const std::vector<std::string> metrics = {Path(c.out_dir, "metrics.jsonl"),
                                            Path(c.out_dir, kOperatorMetricsFile)};
  bool start_over = false;  // --resume without a checkpoint, but with a ledger to keep
  if (f.resume) {
    start_over = absl::IsNotFound(state.status()) && *privacy && (*privacy)->ledger_steps() > 0;
    if (!state.ok() && !start_over) return Fail(1, "--resume", state.status());
    if (state.ok()) *resume = std::move(state).value();
  }
  // Refusals before anything is changed.
  if (*privacy) {
    if (Status st = (*privacy)->CheckStart(*resume ? (*resume)->steps : 0, resume->has_value());
        !st.ok()) {
      return Fail(absl::IsFailedPrecondition(st) ? 2 : 1, "", st);
    }
  }
  if (start_over) {
    // Killed before its first checkpoint: nothing to continue but the ledger's spend.
    std::printf(
        "%s: no checkpoint at %s: starting over from step 0; the %lld steps the ledger "
        "records stay counted\n",
        kCommand, ckpt_path.c_str(), static_cast<long long>((*privacy)->ledger_steps()));
  } else if (*resume) {
    spdlog::info("resuming after epoch {} (step {}) from {}", (*resume)->epochs_done,
                 (*resume)->steps, ckpt_path);
    std::printf(
        "%s: resuming after epoch %lld (step %lld%s)\n", kCommand,
        static_cast<long long>((*resume)->epochs_done), static_cast<long long>((*resume)->steps),
        (*resume)->epoch_rows > 0 ? fmt::format(", {} rows into epoch {}", (*resume)->epoch_rows,
                                                (*resume)->epochs_done + 1)
                                        .c_str()
                                  : "");
  }
  for (const std::string& path : metrics) {
    if (f.resume) {
      // The lines of epochs after the checkpoint (all of them when starting over) go.
      const auto keep = static_cast<uint64_t>(*resume ? (*resume)->epochs_done : 0);
      if (Status st = KeepJsonLinesUpTo(path, "epoch", keep); !st.ok()) return Fail(1, path, st);
    } else {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  }
  return 0;
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
  if (Status st = datacenter::ValidateCollectiveOptions(co); !st.ok()) return Fail(2, "", st);
  auto auth = RendezvousAuth(f);
  if (!auth.ok()) return Fail(2, "", auth.status());
  StopWatchdog watchdog(std::chrono::milliseconds(c.timeout_ms) + std::chrono::seconds(10));
  if (Status st = MakeDirs(c.out_dir); !st.ok()) return Fail(1, "output directory", st);

  // Everything that can fail alone comes before joining the others.
  auto train = LoadTrainingData(c.data);
  if (!train.ok()) return Fail(1, "training data", train.status());
  std::optional<privacy::DpEvent> dp_plan;
  if (c.dp_sgd) {
    auto planned = PlanDpSgd(c, train->size());
    if (!planned.ok()) return Fail(2, "", planned.status());
    dp_plan = *planned;
  }
  std::optional<data::Dataset> test;
  if (f.rank == 0 && !c.eval_data.empty()) {
    auto loaded = data::LoadFashionMnist(c.eval_data, data::Split::kTest, nullptr);
    if (!loaded.ok()) return Fail(1, "evaluation data", loaded.status());
    test = std::move(loaded).value();
  }
  // DP-SGD: rank 0's noise (and the sampling key it broadcasts) from the OS CSPRNG.
  std::optional<privacy::NoiseSource> noise;
  if (c.dp_sgd && f.rank == 0) noise = privacy::NoiseSource::Secure();
  std::optional<datacenter::TrainingState> resume;
  std::optional<DatacenterPrivacy> privacy;
  // --resume of a job that ran to its end (rank 0's checkpoint says so): rank 0 still joins the
  // others, whose resume then trains nothing, and writes nothing.
  bool complete = false;
  if (f.rank == 0) {
    const int code = PrepareRank0(c, f, train->size(), dp_plan, noise ? &*noise : nullptr, &resume,
                                  &privacy, &complete);
    if (code != 0) return code;
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
    // On the address the user named, never on every interface.
    auto endpoint = transport::KvServerEndpointFor(f.rendezvous);
    if (!endpoint.ok()) return Fail(2, "--rendezvous", endpoint.status());
    auto started = transport::KvServer::Start(*endpoint, {}, *auth);
    if (!started.ok()) return Fail(1, "serving the rendezvous", started.status());
    server = std::move(started).value();
    spdlog::info("serving the rendezvous on {} ({})", *endpoint,
                 *auth ? "CurveZMQ, the job's key" : "NOT authenticated");
  }
  auto store = transport::OpenKvStore(f.rendezvous, std::chrono::seconds(30), *auth);
  if (!store.ok()) return Fail(2, "--rendezvous", store.status());
  auto run_id = AgreeRunId(f, **store, std::chrono::milliseconds(c.timeout_ms));
  if (!run_id.ok()) return Fail(1, "joining the other ranks", run_id.status());
  co.key_prefix = "huddle/" + *run_id;
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
  if (c.dp_sgd) {
    o.dp_sgd = datacenter::DataParallelDpSgd{c.dp_sgd->dp, noise ? &*noise : nullptr};
  }
  Reporter reporter(c, f.world_size, std::string((*collective)->backend()), test ? &*test : nullptr,
                    privacy ? &*privacy : nullptr);
  if (resume) reporter.set_last_steps(resume->steps);
  o.on_epoch = [&](const datacenter::EpochReport& r) -> Status {
    if (f.rank == 0) HUDDLE_RETURN_IF_ERROR(reporter.OnEpoch(r));
    return absl::OkStatus();
  };
  // A stop (SIGINT/SIGTERM on any rank) takes effect on every rank after the same step.
  o.stop = &StopFlag();
  std::optional<int64_t> stopped_at_step;
  if (!c.dp_sgd && !complete) {
    // With DP-SGD no checkpoint: the ledger records whole epochs before anything is released,
    // so the job resumes from its last epoch's checkpoint (steps since need no entry).
    o.on_stop = [&](const datacenter::TrainingState& state) -> Status {
      HUDDLE_RETURN_IF_ERROR(datacenter::WriteTrainingState(
          Path(c.out_dir, datacenter::kDatacenterCheckpointFile), state));
      stopped_at_step = state.steps;
      return absl::OkStatus();
    };
  }
  if (f.rank == 0 && !complete) {
    if (!resume) {
      std::printf("%s: %d rank(s), %s, model %s, global batch %lld, %lld epochs\n", kCommand,
                  f.world_size, std::string((*collective)->backend()).c_str(),
                  models::DescribeModel(c.model).c_str(),
                  static_cast<long long>(c.dp_sgd ? c.dp_sgd->dp.expected_batch_size
                                                  : c.train.batch_size * f.world_size),
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
  watchdog.TrainingStarted();
  auto stats = datacenter::TrainDataParallel(**collective, c.model, o,
                                             data::DatasetView{&*train, {}}, &params);
  if (!stats.ok()) {
    const bool stopped = absl::IsCancelled(stats.status());
    if (stopped) {
      if (stopped_at_step) {
        std::printf("%s: stopped after step %lld; checkpoint %s written (continue with --resume)\n",
                    kCommand, static_cast<long long>(*stopped_at_step),
                    Path(c.out_dir, datacenter::kDatacenterCheckpointFile).c_str());
      } else if (f.rank == 0) {
        std::printf("%s: stopped; --resume continues from the last epoch's checkpoint\n", kCommand);
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
    return Fail(stopped ? StopExitCode() : 1, fmt::format("rank {}", f.rank), stats.status());
  }
  if (f.rank == 0 && complete) {
    SayAlreadyComplete(c, *resume);
    return 0;
  }
  if (f.rank == 0) {
    if (Status st = reporter.WriteSummary(*stats); !st.ok()) return Fail(1, "summary.json", st);
    std::optional<JobSpend> spend;
    if (privacy) {
      if (Status st = privacy->WriteReport(); !st.ok()) {
        return Fail(1, privacy::kPrivacyReportFile, st);
      }
      auto spent = privacy->Spent();
      if (!spent.ok()) return Fail(1, "privacy", spent.status());
      spend = *spent;
    }
    std::printf("done: %lld steps", static_cast<long long>(stats->steps));
    if (!privacy) {
      std::printf(
          " in %.1f s (%.1f steps/s)", stats->seconds,
          static_cast<double>(stats->steps - (resume ? resume->steps : 0)) / stats->seconds);
    }
    if (auto acc = reporter.final_test_accuracy()) std::printf(" | test accuracy %.4f", *acc);
    if (spend) {
      std::printf(" | %s (the ledger counts %lld steps)", spend->Text().c_str(),
                  static_cast<long long>(spend->ledger_steps));
    }
    if (auto t = reporter.target_seconds()) {
      std::printf(" | reached %.2f after %.1f s%s", c.target_accuracy, *t,
                  privacy ? " (not private)" : "");
    }
    if (privacy) {
      std::printf(
          " | (not private) %.1f s (%.1f steps/s)", stats->seconds,
          static_cast<double>(stats->steps - (resume ? resume->steps : 0)) / stats->seconds);
    }
    std::printf(
        " | replicas checked identical %lld times\noutputs: %s/{metrics.jsonl,%s"
        "summary.json,model.bin,checkpoint.bin}\n",
        static_cast<long long>(stats->checksums), c.out_dir.c_str(),
        privacy ? "operator_metrics.jsonl,privacy_ledger.jsonl,privacy.json," : "");
    std::fflush(stdout);
  }
  return 0;
}

// The launcher's per-job rendezvous key: DIR/rendezvous.key (0600) in a fresh directory (0700)
// under the system's temporary directory, removed with this object. Its path, not the key,
// travels to the ranks, in their environment.
class PrivateKeyDir {
 public:
  static StatusOr<PrivateKeyDir> Create(const transport::KvAuth& auth) {
    std::error_code ec;
    const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    std::string pattern = (ec ? std::string("/tmp") : tmp.string()) + "/huddle-rendezvous-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::UnavailableError(
          fmt::format("cannot create a private directory {}: {}", pattern, std::strerror(errno)));
    }
    PrivateKeyDir dir(pattern);
    HUDDLE_RETURN_IF_ERROR(transport::WriteKeyFiles(
        transport::CurveKeyPair{"server", "rendezvous", auth.public_z85, auth.secret_z85}, dir.dir_,
        "rendezvous"));
    return dir;
  }
  PrivateKeyDir(PrivateKeyDir&& other) noexcept : dir_(std::exchange(other.dir_, "")) {}
  PrivateKeyDir& operator=(PrivateKeyDir&&) = delete;
  ~PrivateKeyDir() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string key_file() const { return dir_ + "/rendezvous.key"; }

 private:
  explicit PrivateKeyDir(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

// The launcher's --resume: whether the job's checkpoint says it ran to its end (then said here).
// No checkpoint, or one the ranks will refuse, is false: the ranks say why.
StatusOr<bool> ResumesAFinishedJob(const DatacenterConfig& c) {
  auto state =
      datacenter::ReadTrainingState(Path(c.out_dir, datacenter::kDatacenterCheckpointFile));
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
  if (f.resume) {
    // A job that ran to its end: say so and start no rank, so that not even its logs change.
    auto complete = ResumesAFinishedJob(c);
    if (!complete.ok()) return Fail(1, "--resume", complete.status());
    if (*complete) return 0;
  }
  const std::string logs = c.out_dir + "/logs";
  if (Status st = MakeDirs(logs); !st.ok()) return Fail(1, "output directory", st);
  // The job's rendezvous key: fresh, in a private directory that goes with the launcher.
  auto auth = transport::GenerateKvAuth();
  if (!auth.ok()) return Fail(1, "rendezvous key", auth.status());
  auto key_dir = PrivateKeyDir::Create(*auth);
  if (!key_dir.ok()) return Fail(1, "rendezvous key", key_dir.status());
  auto server = transport::KvServer::Start("tcp://127.0.0.1:0", {}, *auth);
  if (!server.ok()) return Fail(1, "serving the rendezvous", server.status());
  const std::vector<std::string> rank_env = {fmt::format("{}={}", kKeyEnv, key_dir->key_file())};
  const std::string run_id =
      f.run_id != kDefaultRunId ? f.run_id : fmt::format("{:016x}", SecureRandomU64());
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
    auto pid = Spawn(argv, rank_logs.back(), /*keep_stdout=*/r == 0, rank_env);
    if (!pid.ok()) {
      for (pid_t p : ranks) ::kill(p, SIGTERM);
      return Fail(1, "starting the ranks", pid.status());
    }
    ranks.push_back(*pid);
  }

  // The first rank to fail is the one to quote: the others usually fail because of it. They
  // notice on their own within the collective timeout; a few seconds later they are stopped. A
  // stop (SIGINT/SIGTERM here) is forwarded once; ranks that have not ended `stop_grace` later
  // (stuck in a collective) are killed.
  std::vector<int> codes(ranks.size(), -1);
  int first_failed = -1;
  auto failed_at = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> stop_at;
  const auto stop_grace = std::chrono::milliseconds(c.timeout_ms) + std::chrono::seconds(15);
  size_t running = ranks.size();
  while (running > 0) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      int status = 0;
      if (codes[r] >= 0 || ::waitpid(ranks[r], &status, WNOHANG) != ranks[r]) continue;
      codes[r] = ExitCode(status);
      --running;
      const bool clean_stop = stop_at && (codes[r] == 0 || IsStopExitCode(codes[r]));
      if (codes[r] != 0 && !clean_stop && first_failed < 0) {
        first_failed = static_cast<int>(r);
        failed_at = std::chrono::steady_clock::now();
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (StopFlag().load() && !stop_at) {
      stop_at = now;
      std::fprintf(stderr, "%s: %s: stopping the ranks after their current step\n", kCommand,
                   StopSignalName());
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (codes[r] < 0)
          ::kill(ranks[r], StopSignal().load() != 0 ? StopSignal().load() : SIGTERM);
      }
    }
    const bool grace_over = first_failed >= 0 && now - failed_at > std::chrono::seconds(5);
    const bool stop_over = stop_at && now - *stop_at > stop_grace;
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (codes[r] < 0 && (grace_over || stop_over))
        ::kill(ranks[r], stop_over ? SIGKILL : SIGTERM);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (first_failed >= 0) {
    std::fprintf(stderr, "%s: rank %d exited with %d: %s (see %s)\n", kCommand, first_failed,
                 codes[first_failed], LastLogLine(rank_logs[first_failed]).c_str(),
                 rank_logs[first_failed].c_str());
    return 1;
  }
  if (stop_at) {
    std::fprintf(stderr,
                 "%s: stopped by %s: every rank stopped cleanly; continue with --resume (see %s)\n",
                 kCommand, StopSignalName(), logs.c_str());
    return StopExitCode();
  }
  return 0;
}

}  // namespace

int RunDatacenterCommand(const DatacenterFlags& flags, const std::string& self_exe) {
  InstallDatacenterStopHandlers();
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
