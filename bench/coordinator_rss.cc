// The `huddle` binary's memory footprint, measured on the real binary (docs/deployment.md,
// "Memory"): every figure is one `huddle` process's own, from the kernel.
//
//   1. `huddle --help`: peak RSS (wait4's ru_maxrss of that process).
//   2. An idle coordinator: `huddle coordinator` waiting for its clients, VmRSS and VmHWM from
//      /proc/PID/status after --idle-s seconds.
//   3. The same coordinator's peak RSS over --rounds rounds with --clients real `huddle client`
//      processes (each on a tiny CSV shard of 8 rows, on the CPU) training a 784-H-10 MLP
//      (--hidden 1262: 1,003,300 parameters), upload_slots --slots, no evaluation; wait4's
//      ru_maxrss of the coordinator alone, against docs/deployment.md's budget for FedAvg:
//      64 MiB + (6 + upload slots) x model.
//
//   4. The coordinator's CPU time (user + system, wait4's rusage) over the whole run, per round.
//
//   coordinator_rss [--huddle PATH] [--clients 100] [--hidden 1262] [--rounds 3] [--slots 4]
//                   [--encrypted 0|1] [--secagg 0|1] [--idle-s 5]
//
// --encrypted 1: CurveZMQ with enrolled client keys, as `huddle run` and a default
// `huddle coordinator` work. --secagg 1: secure aggregation (every update clipped to norm 10,
// quantized and masked; the coordinator adds masked inputs and unmasks). PATH defaults to this
// build's huddle. Exits 1 when a step fails or the peak is over the budget.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/process.h"
#include "transport/ports.h"

namespace {

using namespace huddle;
namespace fs = std::filesystem;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int kInputs = 784;
constexpr int kClasses = 10;

struct Args {
  std::string huddle = HUDDLE_BIN_PATH;
  int clients = 100;
  int hidden = 1262;  // 784-1262-10: 1,003,300 parameters (3.8 MiB)
  int rounds = 3;
  int slots = 4;
  bool encrypted = false;
  bool secagg = false;
  int idle_s = 5;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--huddle") a.huddle = v;
    if (k == "--clients") a.clients = std::atoi(v.c_str());
    if (k == "--hidden") a.hidden = std::atoi(v.c_str());
    if (k == "--rounds") a.rounds = std::atoi(v.c_str());
    if (k == "--slots") a.slots = std::atoi(v.c_str());
    if (k == "--encrypted") a.encrypted = std::atoi(v.c_str()) != 0;
    if (k == "--secagg") a.secagg = std::atoi(v.c_str()) != 0;
    if (k == "--idle-s") a.idle_s = std::atoi(v.c_str());
  }
  return a;
}

// A finished child: its exit code, its own peak RSS and CPU time.
struct Exited {
  int code = -1;
  int64_t max_rss_kib = 0;
  double cpu_s = 0;
};

Exited Reap(pid_t pid) {
  int status = 0;
  rusage ru{};
  if (::wait4(pid, &status, 0, &ru) != pid) return {};
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return {cli::ExitCode(status), ru.ru_maxrss, seconds(ru.ru_utime) + seconds(ru.ru_stime)};
}

// VmRSS and VmHWM of a running process, in KiB (0 when unreadable).
std::pair<int64_t, int64_t> CurrentRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  int64_t rss = 0, hwm = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("VmRSS:")) rss = std::atoll(line.c_str() + 6);
    if (line.starts_with("VmHWM:")) hwm = std::atoll(line.c_str() + 6);
  }
  return {rss, hwm};
}

void Write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// 8 rows of label + 784 features: every client's shard (the data does not matter here).
std::string TinyCsv() {
  std::string csv;
  for (int row = 0; row < 8; ++row) {
    csv += std::to_string(row % kClasses);
    for (int j = 0; j < kInputs; ++j) csv += (j + row) % 7 == 0 ? ",0.5" : ",0";
    csv += "\n";
  }
  return csv;
}

std::string JobYaml(const Args& a, const fs::path& dir) {
  std::string yaml =
      "name: rss\nseed: 1\nrounds: " + std::to_string(a.rounds) + "\nmodel: {hidden: [" +
      std::to_string(a.hidden) +
      "]}\n"
      "train: {epochs: 1, batch_size: 8, learning_rate: 0.01}\n"
      "cohort: {size: " +
      std::to_string(a.clients) +
      "}\nround: {deadline_s: 300, quorum: " + std::to_string(a.clients) +
      ", upload_slots: " + std::to_string(a.slots) +
      "}\nevaluation: {every: 0}\ncoordinator: {min_clients: " + std::to_string(a.clients) +
      ", wait_for_clients_s: 300}\n";
  if (a.secagg) {
    yaml += "aggregation: {max_update_norm: 10}\nsecure_aggregation: {enabled: true}\n";
  }
  if (a.encrypted) {
    yaml += "security: {server_secret_key: " + (dir / "keys/server.key").string() +
            ", allowed_clients: " + (dir / "keys/allowed").string() + "}\n";
  }
  return yaml;
}

std::string ClientId(int i) { return "c" + std::to_string(i); }

int Run(const Args& a, const fs::path& dir) {
  // 1. --help.
  auto help = cli::Spawn({a.huddle, "--help"}, (dir / "help.log").string(), false);
  if (!help.ok()) return std::fprintf(stderr, "%s\n", help.status().ToString().c_str()), 1;
  const Exited h = Reap(*help);
  if (h.code != 0) return std::fprintf(stderr, "huddle --help exited with %d\n", h.code), 1;
  std::printf("huddle --help: peak RSS %.1f MiB\n", h.max_rss_kib / 1024.0);

  // 2. The idle coordinator.
  Write(dir / "shard.csv", TinyCsv());
  Write(dir / "job.yaml", JobYaml(a, dir));
  if (a.encrypted || a.secagg) {  // secure aggregation's members sign with certified keys
    std::vector<std::string> ids;
    for (int i = 0; i < a.clients; ++i) ids.push_back(ClientId(i));
    if (Status st = cli::GenerateLocalKeys((dir / "keys").string(), ids); !st.ok()) {
      return std::fprintf(stderr, "keys: %s\n", st.ToString().c_str()), 1;
    }
  }
  auto port = transport::FreeLoopbackPort();
  if (!port.ok()) return std::fprintf(stderr, "%s\n", port.status().ToString().c_str()), 1;
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(*port);
  std::vector<std::string> coord_argv = {
      a.huddle, "coordinator", "--config", (dir / "job.yaml").string(),
      "--bind", endpoint,      "--out",    (dir / "out").string()};
  if (!a.encrypted) coord_argv.push_back("--insecure");
  if (!a.encrypted && a.secagg) {
    coord_argv.insert(coord_argv.end(), {"--allow", (dir / "keys/allowed").string()});
  }
  auto coord = cli::Spawn(coord_argv, (dir / "coordinator.log").string(), false);
  if (!coord.ok()) return std::fprintf(stderr, "%s\n", coord.status().ToString().c_str()), 1;
  std::this_thread::sleep_for(std::chrono::seconds(a.idle_s));
  const auto [idle_rss, idle_hwm] = CurrentRss(*coord);
  std::printf("idle coordinator (%d s after start): RSS %.1f MiB (peak so far %.1f MiB)\n",
              a.idle_s, idle_rss / 1024.0, idle_hwm / 1024.0);

  // 3. Rounds with real clients.
  std::vector<pid_t> clients;
  for (int i = 0; i < a.clients; ++i) {
    std::vector<std::string> argv = {
        a.huddle,          "client",    "--coordinator", endpoint,
        "--client-id",     ClientId(i), "--data",        (dir / "shard.csv").string(),
        "--format",        "csv",       "--device",      "cpu",
        "--give-up-after", "60",        "--log-level",   "warn"};
    if (a.encrypted) {
      for (const std::string& flag :
           {std::string("--server-key"), (dir / "keys/server.pub").string(), std::string("--key"),
            (dir / "keys/clients" / (ClientId(i) + ".key")).string()}) {
        argv.push_back(flag);
      }
    } else {
      argv.push_back("--insecure");
      if (a.secagg) {
        argv.insert(argv.end(),
                    {"--key", (dir / "keys/clients" / (ClientId(i) + ".key")).string()});
      }
    }
    if (a.secagg) argv.insert(argv.end(), {"--project-key", (dir / "keys/project.pub").string()});
    auto pid = cli::Spawn(argv, (dir / (ClientId(i) + ".log")).string(), false);
    if (!pid.ok()) return std::fprintf(stderr, "%s\n", pid.status().ToString().c_str()), 1;
    clients.push_back(*pid);
  }
  const Exited c = Reap(*coord);
  int64_t client_peak_kib = 0;
  for (pid_t pid : clients) {
    ::kill(pid, SIGTERM);
    client_peak_kib = std::max(client_peak_kib, Reap(pid).max_rss_kib);
  }
  if (c.code != 0) {
    std::fprintf(stderr, "the coordinator exited with %d: %s\n", c.code,
                 cli::LastLogLine((dir / "coordinator.log").string()).c_str());
    return 1;
  }
  // Every round must have had every client's update ("round r/R | updates N/N" in its log).
  const std::string full =
      "| updates " + std::to_string(a.clients) + "/" + std::to_string(a.clients);
  int full_rounds = 0;
  std::ifstream log(dir / "coordinator.log");
  for (std::string line; std::getline(log, line);)
    full_rounds += line.find(full) != std::string::npos;
  if (full_rounds != a.rounds) {
    std::fprintf(stderr, "only %d of %d rounds had all %d updates (see the coordinator's log)\n",
                 full_rounds, a.rounds, a.clients);
    return 1;
  }
  const int64_t params =
      int64_t{kInputs} * a.hidden + a.hidden + int64_t{a.hidden} * kClasses + kClasses;
  const double model_mib = static_cast<double>(params) * 4 / kMiB;
  // The model, the round's shared copy, the exact sums (3 x model), the mean delta, and one update
  // per upload slot (docs/deployment.md, "Memory"; FedAvg keeps no optimizer state).
  const double model_copies = 6 + a.slots;
  const double budget_mib = 64 + model_copies * model_mib;
  const double peak_mib = c.max_rss_kib / 1024.0;
  std::printf(
      "coordinator, %d clients, %d rounds, %lld parameters (%.1f MiB), %d upload slots, %s%s: peak "
      "RSS %.1f MiB; budget 64 MiB + %g x model = %.1f MiB; ratio %.2f\n",
      a.clients, a.rounds, static_cast<long long>(params), model_mib, a.slots,
      a.encrypted ? "CurveZMQ" : "plaintext", a.secagg ? ", secure aggregation" : "", peak_mib,
      model_copies, budget_mib, peak_mib / budget_mib);
  std::printf("coordinator CPU time: %.2f s in all, %.2f s per round\n", c.cpu_s,
              c.cpu_s / a.rounds);
  std::printf("largest client peak RSS: %.1f MiB\n", client_peak_kib / 1024.0);
  // Each round's wall time, from metrics.jsonl's duration_s (training on 8 rows is negligible:
  // what remains is the round's messages, encryption and aggregation).
  std::string durations;
  std::ifstream metrics(dir / "out" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const size_t at = line.find("\"duration_s\":");
    if (at == std::string::npos) continue;
    durations += " " + line.substr(at + 13, line.find_first_of(",}", at) - at - 13);
  }
  std::printf("round wall time (s):%s\n", durations.c_str());
  std::ifstream again(dir / "coordinator.log");
  for (std::string line; std::getline(again, line);) {
    if (line.find("secure aggregation of") != std::string::npos) {
      std::printf("%s\n", line.substr(line.find("round ")).c_str());
      break;
    }
  }
  return peak_mib <= budget_mib ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  std::string tmpl = (fs::temp_directory_path() / "huddle_rss_XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return std::perror("mkdtemp"), 1;
  const int code = Run(a, tmpl);
  std::error_code ec;
  fs::remove_all(tmpl, ec);
  return code;
}
