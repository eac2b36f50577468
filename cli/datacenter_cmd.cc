// `huddle datacenter`: one model trained synchronously across ranks (docs/datacenter.md).
//
// Launcher (no --rank): serves a rendezvous on 127.0.0.1, starts `nproc` rank processes of this
// binary under a fresh run id, shows rank 0's progress, and when a rank fails stops the others and
// quotes its error. Rank (--rank R --world-size W --rendezvous URL): the job itself
// (datacenter/job.h: loading, joining the collective, training, rank 0's outputs and privacy
// ledger) under this command's logging, rendezvous key, stop signals and exit codes.
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
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/process.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/secure_random.h"
#include "datacenter/collective.h"
#include "datacenter/job.h"
#include "kernels/backend.h"
#include "transport/curve_keys.h"
#include "transport/kv_store.h"

namespace huddle::cli {
namespace {

constexpr const char* kCommand = datacenter::kJobCommand;
// The job's rendezvous key file (tcp://), and the explicit opt-out of authentication.
constexpr char kKeyEnv[] = "HUDDLE_RENDEZVOUS_KEY";
constexpr char kInsecureEnv[] = "HUDDLE_RENDEZVOUS_INSECURE";
using datacenter::kDefaultRunId;  // DatacenterFlags::run_id when --run-id is absent

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

// One rank (--rank/--world-size/--rendezvous): the job (datacenter/job.h) under this command's
// logging, device choice, rendezvous key, stop signals and exit codes.
int RunRank(const DatacenterConfig& c, const DatacenterFlags& f) {
  if (Status st = SetupLogging(c.log_level, fmt::format("rank {}", f.rank)); !st.ok()) {
    return Fail(2, "", st);
  }
  auto cuda = UseCuda(c.device);
  if (!cuda.ok()) return Fail(2, "", cuda.status());
  datacenter::RankOptions o;
  o.collective.rank = f.rank;
  o.collective.world_size = f.world_size;
  o.collective.timeout = std::chrono::milliseconds(c.timeout_ms);
  o.collective.host = f.host;
  if (Status st = datacenter::ValidateCollectiveOptions(o.collective); !st.ok()) {
    return Fail(2, "", st);
  }
  auto auth = RendezvousAuth(f);
  if (!auth.ok()) return Fail(2, "", auth.status());
  StopWatchdog watchdog(std::chrono::milliseconds(c.timeout_ms) + std::chrono::seconds(10));
  o.use_cuda = *cuda;
  o.local_rank = f.local_rank;
  o.rendezvous = f.rendezvous;
  o.auth = *auth;
  o.serve_rendezvous = f.serve_rendezvous;
  o.run_id = f.run_id;
  o.resume = f.resume;
  o.stop = &StopFlag();
  o.on_training_start = [&watchdog] { watchdog.TrainingStarted(); };
  const Status st = datacenter::RunRank(c, o);
  if (st.ok()) return 0;
  if (datacenter::IsStop(st)) return Fail(StopExitCode(), "", st);
  return Fail(datacenter::IsRefusal(st) ? 2 : 1, "", st);
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
    auto complete = datacenter::ResumesAFinishedJob(c);
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
      // The parameter-server mode goes on without a failed worker (ranks from `servers` on).
      if (c.parameter_server && static_cast<int64_t>(r) >= c.parameter_server->servers &&
          codes[r] != 0 && !clean_stop) {
        std::fprintf(stderr,
                     "%s: worker rank %zu exited with %d: %s (see %s); the parameter servers go "
                     "on without it\n",
                     kCommand, r, codes[r], LastLogLine(rank_logs[r]).c_str(),
                     rank_logs[r].c_str());
        continue;
      }
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
