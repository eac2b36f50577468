// The service's figures (issue 34), measured on the shipped `huddle` binary, every figure the
// measured process's own (from /proc):
//
//   service_load idle    [--agents 1000] [--warmup-s 15] [--window-s 30]
//     An idle `huddle serve` (CurveZMQ, every agent's key enrolled) with N *simulated* agents:
//     this program opens N agent sessions itself (one ZeroMQ context, CurveZMQ with each agent's
//     own key, the session Join and the heartbeats `huddle agent` sends), then reads the
//     service's CPU time (user + system) over the window and its VmRSS / VmHWM.
//   service_load latency [--agents 10] [--repeat 5]
//     N real `huddle agent` processes, each on a tenth of Fashion-MNIST; `huddle submit` of the
//     quickstart job (examples/service/job.yaml's recipe, 1 round) --repeat times; each time,
//     from the submit command's start to the moment the job's coordinator has its clients and
//     sends round 1 (its job.log line "N clients live", ISO-8601 UTC to the millisecond).
//   service_load rounds  [--agents 10] [--count 40] [--scrape 0|1]
//     One job of --count rounds (the quickstart's recipe) on N real agents, with or without a
//     client reading /metrics every second: the median round duration (run both, paired).
//   service_load jobs    [--agents 3] [--count 50]
//     --count consecutive jobs (a small MLP, 1 round) on N real agents; after each, VmRSS of the
//     service and of every agent: growth from the 5th job to the last shows a leak.
//
// --huddle PATH defaults to this build's binary. Prints one line per figure; exits 1 on failure.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "absl/time/time.h"
#include "cli/commands.h"
#include "cli/process.h"
#include "proto/codec.h"
#include "transport/curve_keys.h"
#include "transport/ports.h"

namespace {

using namespace huddle;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist";

struct Args {
  std::string mode;
  std::string huddle = HUDDLE_BIN_PATH;
  int agents = -1;
  int warmup_s = 15;
  int window_s = 30;
  int repeat = 5;
  int count = 50;
  bool scrape = false;
};

Args Parse(int argc, char** argv) {
  Args a;
  if (argc > 1) a.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--huddle") a.huddle = v;
    if (k == "--agents") a.agents = std::atoi(v.c_str());
    if (k == "--warmup-s") a.warmup_s = std::atoi(v.c_str());
    if (k == "--window-s") a.window_s = std::atoi(v.c_str());
    if (k == "--repeat") a.repeat = std::atoi(v.c_str());
    if (k == "--count") a.count = std::atoi(v.c_str());
    if (k == "--scrape") a.scrape = std::atoi(v.c_str()) != 0;
  }
  return a;
}

// Every process this program started, stopped by Die so that a failed run leaves none behind.
std::vector<pid_t>& Children() {
  static std::vector<pid_t> children;
  return children;
}

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "service_load: %s\n", why.c_str());
  for (pid_t pid : Children()) ::kill(pid, SIGKILL);
  std::exit(1);
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// utime + stime of `pid`, in seconds.
double CpuSeconds(pid_t pid) {
  const std::string stat = Read("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}
// A field of /proc/PID/status in MiB (VmRSS, VmHWM).
double StatusMiB(pid_t pid, const std::string& key) {
  std::istringstream in(Read("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::atof(line.c_str() + key.size() + 1) / 1024.0;
  }
  return -1;
}

struct Service {
  std::string dir;
  int agents_port = 0;
  int operators_port = 0;
  int http_port = 0;
  pid_t pid = -1;
};

// Keys for `ids`, server.yaml, and `huddle serve` started.
Service StartService(const Args& a, const std::vector<std::string>& ids) {
  Service s;
  s.dir =
      (fs::temp_directory_path() / ("huddle_service_load_" + std::to_string(::getpid()))).string();
  fs::remove_all(s.dir);
  fs::create_directories(s.dir);
  if (!cli::GenerateLocalKeys(s.dir + "/keys", ids).ok()) Die("cannot generate keys");
  auto op = transport::GenerateKeyPair("operator", "bench");
  if (!op.ok() || !transport::WriteKeyFiles(*op, s.dir + "/operator", "bench").ok()) {
    Die("cannot write the operator's key");
  }
  fs::create_directories(s.dir + "/operators");
  fs::copy_file(s.dir + "/operator/bench.pub", s.dir + "/operators/bench.pub");
  s.agents_port = *transport::FreeLoopbackPort();
  s.operators_port = *transport::FreeLoopbackPort();
  s.http_port = *transport::FreeLoopbackPort();
  Write(s.dir + "/server.yaml",
        "service:\n  bind: tcp://127.0.0.1:" + std::to_string(s.agents_port) +
            "\n  operator_bind: tcp://127.0.0.1:" + std::to_string(s.operators_port) +
            "\n  state_dir: " + s.dir + "/state\nsecurity:\n  server_secret_key: " + s.dir +
            "/keys/server.key\n  allowed_clients: " + s.dir + "/keys/allowed\n  operators: " +
            s.dir + "/operators\nhttp: {bind: \"127.0.0.1:" + std::to_string(s.http_port) +
            "\"}\nlog_level: info\n");
  auto pid = cli::Spawn({a.huddle, "serve", "--config", s.dir + "/server.yaml"},
                        s.dir + "/serve.log", false);
  if (!pid.ok()) Die("cannot start huddle serve");
  s.pid = *pid;
  Children().push_back(s.pid);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  int st = 0;
  if (::waitpid(s.pid, &st, WNOHANG) == s.pid) {
    Die("huddle serve exited: " + Read(s.dir + "/serve.log"));
  }
  return s;
}

void Stop(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  int st = 0;
  ::waitpid(pid, &st, 0);
}

// `huddle OP ...` as the bench's operator; its exit code.
int Operator(const Args& a, const Service& s, std::vector<std::string> args) {
  std::vector<std::string> argv = {a.huddle};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(),
              {"--service", "tcp://127.0.0.1:" + std::to_string(s.operators_port), "--server-key",
               s.dir + "/keys/server.pub", "--key", s.dir + "/operator/bench.key"});
  auto pid = cli::Spawn(argv, s.dir + "/op.log", false);
  if (!pid.ok()) return -1;
  int st = 0;
  ::waitpid(*pid, &st, 0);
  return cli::ExitCode(st);
}

std::vector<std::string> Ids(int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back("site-" + std::to_string(i));
  return ids;
}

void RaiseFileLimit() {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &r);
}

void SendMessage(zmq::socket_t& socket, const wire::Message& m) {
  const std::vector<wire::Frame> frames = wire::EncodeToFrames(m);
  for (size_t i = 0; i < frames.size(); ++i) {
    socket.send(zmq::buffer(frames[i].bytes.data(), frames[i].bytes.size()),
                i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::dontwait);
  }
}

int Idle(const Args& a) {
  const int n = a.agents > 0 ? a.agents : 1000;
  RaiseFileLimit();
  const std::vector<std::string> ids = Ids(n);
  Service s = StartService(a, ids);
  zmq::context_t context(2);
  context.set(zmq::ctxopt::max_sockets, n + 64);
  std::vector<zmq::socket_t> sockets;
  transport::CurveKeyPair server =
      *transport::ReadKeyFile(s.dir + "/keys/server.pub", /*need_secret=*/false);
  for (const std::string& id : ids) {
    auto key = transport::ReadKeyFile(s.dir + "/keys/clients/" + id + ".key", true);
    if (!key.ok()) Die(std::string(key.status().message()));
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::curve_serverkey, server.public_z85);
    socket.set(zmq::sockopt::curve_publickey, key->public_z85);
    socket.set(zmq::sockopt::curve_secretkey, key->secret_z85);
    socket.connect("tcp://127.0.0.1:" + std::to_string(s.agents_port));
    sockets.push_back(std::move(socket));
  }
  // Each simulated agent: its session Join, then a heartbeat every interval the Welcome gives.
  std::vector<int64_t> heartbeat_ms(n, 0);
  std::vector<Clock::time_point> next(n, Clock::now());
  int welcomed = 0;
  const auto end_warmup = Clock::now() + std::chrono::seconds(a.warmup_s);
  const auto end = end_warmup + std::chrono::seconds(a.window_s);
  double cpu0 = -1;
  while (Clock::now() < end) {
    const auto now = Clock::now();
    if (cpu0 < 0 && now >= end_warmup) cpu0 = CpuSeconds(s.pid);
    for (int i = 0; i < n; ++i) {
      if (now < next[i]) continue;
      wire::Message m;
      if (heartbeat_ms[i] == 0) {
        wire::Join join;
        join.client_id = ids[i];
        join.agent_version = "service_load";
        join.datasets = {"fmnist"};
        m = wire::MakeMessage(std::move(join), 0, ids[i]);
        next[i] = now + std::chrono::seconds(1);
      } else {
        m = wire::MakeMessage(wire::Heartbeat{}, 0, ids[i]);
        next[i] = now + std::chrono::milliseconds(heartbeat_ms[i]);
      }
      try {
        SendMessage(sockets[i], m);
      } catch (const zmq::error_t&) {  // not connected yet: the next tick retries
      }
      // Drain its replies.
      zmq::message_t frame;
      std::vector<wire::Frame> frames;
      while (sockets[i].recv(frame, zmq::recv_flags::dontwait)) {
        auto owner = std::make_shared<zmq::message_t>(std::move(frame));
        frames.push_back({owner, {static_cast<const std::byte*>(owner->data()), owner->size()}});
        if (!owner->more()) {
          auto msg = wire::Decode(frames);
          frames.clear();
          if (msg.ok() && msg->type() == wire::MessageType::kWelcome && heartbeat_ms[i] == 0) {
            heartbeat_ms[i] = std::get<wire::Welcome>(msg->body).heartbeat_interval_ms;
            ++welcomed;
          }
        }
        frame = zmq::message_t();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double cpu = CpuSeconds(s.pid) - cpu0;
  std::printf(
      "idle service, %d simulated agents (%d welcomed), CurveZMQ: CPU %.2f%% of a core "
      "over %d s; VmRSS %.1f MiB, VmHWM %.1f MiB\n",
      n, welcomed, 100.0 * cpu / a.window_s, a.window_s, StatusMiB(s.pid, "VmRSS"),
      StatusMiB(s.pid, "VmHWM"));
  Stop(s.pid);
  fs::remove_all(s.dir);
  return welcomed == n ? 0 : 1;
}

// N real agents, each on a 1/N IID shard of Fashion-MNIST.
std::vector<pid_t> StartAgents(const Args& a, const Service& s, int n) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const std::string id = "site-" + std::to_string(i);
    const std::string yaml = s.dir + "/" + id + ".yaml";
    Write(yaml, "coordinator: tcp://127.0.0.1:" + std::to_string(s.agents_port) +
                    "\nlog_level: warn\nsecurity:\n  server_public_key: " + s.dir +
                    "/keys/server.pub\n  secret_key: " + s.dir + "/keys/clients/" + id +
                    ".key\ndatasets:\n  fmnist: {path: " + kFashionMnist +
                    ", partition: iid, num_shards: " + std::to_string(n) +
                    ", shard: " + std::to_string(i) + "}\n");
    auto pid = cli::Spawn({a.huddle, "agent", "--config", yaml}, s.dir + "/" + id + ".log", false);
    if (!pid.ok()) Die("cannot start an agent");
    pids.push_back(*pid);
    Children().push_back(*pid);
  }
  return pids;
}

std::string JobYaml(const std::string& name, int agents, int hidden) {
  return "name: " + name + "\nseed: 1\nrounds: 1\nmodel: {kind: mlp, hidden: [" +
         std::to_string(hidden) +
         "]}\ntrain: {epochs: 1, batch_size: 32, learning_rate: 0.02, momentum: 0.9}\n"
         "cohort: {sampling: fixed, size: " +
         std::to_string(agents) + "}\nround: {deadline_s: 60, quorum: " + std::to_string(agents) +
         ", upload_slots: 4}\nevaluation: {every: 1}\ncoordinator: {min_clients: " +
         std::to_string(agents) + ", wait_for_clients_s: 120}\ndata: {name: fmnist}\n";
}

bool WaitForFile(const std::string& path, const std::string& needle, int seconds) {
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    if (Read(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

int Latency(const Args& a) {
  const int n = a.agents > 0 ? a.agents : 10;
  Service s = StartService(a, Ids(n));
  std::vector<pid_t> agents = StartAgents(a, s, n);
  std::this_thread::sleep_for(std::chrono::seconds(5));  // every agent connected and idle
  std::vector<double> ms;
  for (int r = 0; r < a.repeat; ++r) {
    const std::string name = "latency-" + std::to_string(r);
    Write(s.dir + "/" + name + ".yaml", JobYaml(name, n, 128));
    const absl::Time submitted = absl::Now();
    if (Operator(a, s, {"submit", s.dir + "/" + name + ".yaml"}) != 0) Die("submit failed");
    const std::string log = s.dir + "/state/jobs/" + name + "/job.log";
    if (!WaitForFile(log, "clients live", 60)) {
      Die("the job did not get its clients: " + Read(log) +
          Read(s.dir + "/state/jobs/" + name + "/state.json") + Read(s.dir + "/op.log"));
    }
    // "2026-11-28T23:13:25.502Z info 10 clients live"
    std::istringstream lines(Read(log));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.find("clients live") == std::string::npos) continue;
      absl::Time t;
      std::string err;
      if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E3SZ", line.substr(0, 24), &t, &err)) Die(err);
      ms.push_back(absl::ToDoubleMilliseconds(t - submitted));
    }
    if (!WaitForFile(s.dir + "/state/jobs/" + name + "/state.json", "completed", 120)) {
      Die("the job did not complete");
    }
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  std::printf("submit to round 1 (%d live agents, %zu jobs): median %.0f ms, min %.0f, max %.0f\n",
              n, sorted.size(), sorted[sorted.size() / 2], sorted.front(), sorted.back());
  for (pid_t p : agents) Stop(p);
  Stop(s.pid);
  fs::remove_all(s.dir);
  return 0;
}

// GET /metrics of the service once (the body's size; 0 on failure).
size_t Scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  size_t n = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    (void)!::send(fd, request.data(), request.size(), 0);
    char buf[16384];
    ssize_t got;
    while ((got = ::recv(fd, buf, sizeof(buf), 0)) > 0) n += static_cast<size_t>(got);
  }
  ::close(fd);
  return n;
}

// One job of --count rounds (the quickstart's recipe) on N agents, with or without a scraper
// reading /metrics every second (--scrape 1): the median round duration.
int Rounds(const Args& a) {
  const int n = a.agents > 0 ? a.agents : 10;
  Service s = StartService(a, Ids(n));
  std::vector<pid_t> agents = StartAgents(a, s, n);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  std::atomic<bool> done{false};
  std::atomic<int> scrapes{0};
  std::thread scraper([&] {
    while (a.scrape && !done.load()) {
      if (Scrape(s.http_port) > 0) scrapes++;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });
  std::string yaml = JobYaml("rounds", n, 128);
  yaml.replace(yaml.find("rounds: 1\n"), 10, "rounds: " + std::to_string(a.count) + "\n");
  Write(s.dir + "/rounds.yaml", yaml);
  if (Operator(a, s, {"submit", s.dir + "/rounds.yaml"}) != 0) Die("submit failed");
  if (!WaitForFile(s.dir + "/state/jobs/rounds/state.json", "\"completed\"", 600)) {
    Die("the job did not complete");
  }
  done.store(true);
  scraper.join();
  std::vector<double> durations;
  std::istringstream lines(Read(s.dir + "/state/jobs/rounds/out/metrics.jsonl"));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t at = line.find("\"duration_s\":");
    if (at != std::string::npos) durations.push_back(std::atof(line.c_str() + at + 13));
  }
  std::sort(durations.begin(), durations.end());
  std::printf("%d rounds on %d agents, %s: median round %.4f s (%d scrapes)\n", a.count, n,
              a.scrape ? "scraped every second" : "not scraped", durations[durations.size() / 2],
              scrapes.load());
  for (pid_t p : agents) Stop(p);
  Stop(s.pid);
  fs::remove_all(s.dir);
  return 0;
}

int Jobs(const Args& a) {
  const int n = a.agents > 0 ? a.agents : 3;
  Service s = StartService(a, Ids(n));
  std::vector<pid_t> agents = StartAgents(a, s, n);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  std::vector<double> service_rss, agent_rss;
  for (int j = 0; j < a.count; ++j) {
    const std::string name = "job-" + std::to_string(j);
    Write(s.dir + "/" + name + ".yaml", JobYaml(name, n, 32));
    if (Operator(a, s, {"submit", s.dir + "/" + name + ".yaml"}) != 0) Die("submit failed");
    if (!WaitForFile(s.dir + "/state/jobs/" + name + "/state.json", "\"completed\"", 120)) {
      Die("job " + name + " did not complete");
    }
    service_rss.push_back(StatusMiB(s.pid, "VmRSS"));
    double worst = 0;
    for (pid_t p : agents) worst = std::max(worst, StatusMiB(p, "VmRSS"));
    agent_rss.push_back(worst);
  }
  const size_t from = std::min<size_t>(4, service_rss.size() - 1);
  std::printf(
      "%d consecutive jobs on %d agents: service VmRSS %.1f MiB after job %zu, %.1f after "
      "job %d (max %.1f); largest agent VmRSS %.1f -> %.1f MiB (max %.1f)\n",
      a.count, n, service_rss[from], from + 1, service_rss.back(), a.count,
      *std::max_element(service_rss.begin(), service_rss.end()), agent_rss[from], agent_rss.back(),
      *std::max_element(agent_rss.begin(), agent_rss.end()));
  for (pid_t p : agents) Stop(p);
  Stop(s.pid);
  fs::remove_all(s.dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  if (a.mode == "idle") return Idle(a);
  if (a.mode == "latency") return Latency(a);
  if (a.mode == "jobs") return Jobs(a);
  if (a.mode == "rounds") return Rounds(a);
  std::fprintf(stderr, "usage: service_load idle|latency|jobs [options]\n");
  return 2;
}
