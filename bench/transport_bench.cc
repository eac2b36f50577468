// Coordinator ingest throughput of 40 MB updates over 127.0.0.1, CurveZMQ-encrypted versus
// plaintext, measured in the same run, for 1 and 8 concurrent clients.
//
// The coordinator (this process) runs as `huddle coordinator` does: 2 I/O threads, where CurveZMQ
// decrypts, and the same malloc policy. The clients run in a child process, each with its own
// ZeroMQ context and I/O thread (where it encrypts), as separate client processes would. Each
// iteration, every client sends one FitResult carrying a 40 MB tensor (10M float32) and the
// coordinator's transport receives and decodes all of them. Two rates per run:
//   bytes_per_second      update bytes received per second of wall-clock time; on a machine with
//                         few cores the clients' encryption competes with the coordinator for them;
//   bytes_per_coord_cpu_s update bytes per CPU-second spent by the coordinator process alone: its
//                         ingest capacity per core when the clients are elsewhere, as in
//                         deployment.
// BM_Seal / BM_Open time libsodium's crypto_box (XSalsa20-Poly1305, what CurveZMQ uses) on one
// 256 KiB chunk, the floor of the cost per byte. After the run, main prints `encrypted/plaintext`
// for both rates and each client count (target >= 0.5 with 8 clients).
//
//   build-main/bench/transport_bench [--benchmark_repetitions=3 ...]
#include <signal.h>
#include <sodium.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "common/memory.h"
#include "transport/curve_keys.h"
#include "transport/ports.h"
#include "transport/zmq_transport.h"

namespace huddle::transport {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kUpdateFloats = 10'000'000;  // 40 MB

struct Keys {
  CurveKeyPair server;
  std::string dir;        // server.key, and c<i>.key for each client (mode 0600)
  std::string allow_dir;  // c<i>.pub: the enrolled clients
};

// Server and client keys, the clients enrolled in a temporary allow-list (made once per count).
const Keys& TestKeys(int clients) {
  static std::map<int, Keys> cache;
  Keys& k = cache[clients];
  if (k.dir.empty()) {
    k.dir = (fs::temp_directory_path() / ("huddle_transport_bench_" + std::to_string(::getpid()) +
                                          "_" + std::to_string(clients)))
                .string();
    k.allow_dir = k.dir + "/allowed";
    fs::remove_all(k.dir);
    k.server = *GenerateKeyPair("server", "bench");
    (void)WriteKeyFiles(k.server, k.dir, "server");
    for (int i = 0; i < clients; ++i) {
      const std::string id = "c" + std::to_string(i);
      const CurveKeyPair client = *GenerateKeyPair("client", id);
      (void)WriteKeyFiles(client, k.dir, id);
      fs::create_directories(k.allow_dir);
      fs::rename(fs::path(k.dir) / (id + ".pub"), fs::path(k.allow_dir) / (id + ".pub"));
    }
  }
  return k;
}

wire::Message Update() {
  static auto list = [] {
    auto l = std::make_shared<TensorList>();
    Tensor t("fc0.weight", {kUpdateFloats / 1000, 1000});
    for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<float>(i % 97) * 1e-3f;
    l->push_back(std::move(t));
    return std::shared_ptr<const TensorList>(l);
  }();
  wire::Message msg = wire::MakeMessage(
      wire::FitResult{1000, 0.1, 0.5, 1.0, 1, std::string(wire::kNonceBytes, 'n')}, 1, "bench");
  msg.tensors = wire::ShareAll(list);
  return msg;
}

double ProcessCpuSeconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The client process (`transport_bench --clients ENDPOINT N KEY_DIR|-`): connects N clients
// (encrypted with the keys in KEY_DIR, or plaintext for "-") and, for every command byte read from
// stdin, makes each send one message ('h': a heartbeat, 'u': the 40 MB update). Exits at the end
// of input; status 3 if an update could not be queued. A separate program rather than a fork, so
// that the coordinator's memory is not shared copy-on-write with it.
int RunClients(const std::string& endpoint, int clients, const std::string& key_dir) {
  std::vector<std::unique_ptr<ClientTransport>> senders;
  for (int i = 0; i < clients; ++i) {
    ZmqOptions o;
    if (key_dir != "-") {
      auto server = ReadKeyFile(key_dir + "/server.pub", /*need_secret=*/false);
      auto client = ReadKeyFile(key_dir + "/c" + std::to_string(i) + ".key", /*need_secret=*/true);
      if (!server.ok() || !client.ok()) return 2;
      o.curve_client = CurveClientOptions{server->public_z85, *client};
    }
    auto c = ConnectZmqClient(endpoint, o);
    if (!c.ok()) return 2;
    senders.push_back(std::move(c).value());
  }
  const wire::Message update = Update();
  const wire::Message heartbeat = wire::MakeMessage(wire::Heartbeat{});
  char command = 0;
  int rc = 0;
  while (::read(STDIN_FILENO, &command, 1) == 1) {
    for (auto& s : senders) {
      // Heartbeats may find no connection yet; an update must always be queued.
      if (!s->Send(command == 'u' ? update : heartbeat).ok() && command == 'u') rc = 3;
    }
  }
  return rc;
}

std::string g_self;  // this program, to start the client process

void BM_Ingest(benchmark::State& state) {
  const int clients = static_cast<int>(state.range(0));
  const bool encrypted = state.range(1) != 0;
  const Keys& keys = TestKeys(clients);
  auto port = FreeLoopbackPort();
  if (!port.ok()) {
    state.SkipWithError(std::string(port.status().message()).c_str());
    return;
  }
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(*port);

  // The clients' process reads its commands from a pipe on its stdin.
  int control[2];
  if (::pipe(control) != 0) {
    state.SkipWithError("pipe() failed");
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, control[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, control[1]);
  const std::string count = std::to_string(clients);
  const std::string key_dir = encrypted ? keys.dir : "-";
  std::vector<char*> child_argv = {g_self.data(),
                                   const_cast<char*>("--clients"),
                                   const_cast<char*>(endpoint.c_str()),
                                   const_cast<char*>(count.c_str()),
                                   const_cast<char*>(key_dir.c_str()),
                                   nullptr};
  pid_t child = 0;
  const int spawned =
      ::posix_spawn(&child, g_self.c_str(), &actions, nullptr, child_argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(control[0]);
  if (spawned != 0) {
    ::close(control[1]);
    state.SkipWithError("cannot start the client process");
    return;
  }
  ::signal(SIGPIPE, SIG_IGN);  // a client process that died is reported, not fatal
  auto command = [&](char c) { return ::write(control[1], &c, 1) == 1; };
  auto finish = [&] {
    ::close(control[1]);
    int status = 0;
    ::waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };

  ZmqOptions server_options;
  server_options.io_threads = 2;
  server_options.max_messages_per_s = 0;
  if (encrypted) {
    server_options.curve_server = CurveServerOptions{keys.server, ZapOptions{keys.allow_dir}};
  }
  auto server = BindZmqServer(endpoint, server_options);
  if (!server.ok()) {
    finish();
    state.SkipWithError(std::string(server.status().message()).c_str());
    return;
  }
  // Connected (and, encrypted, authenticated) before timing starts.
  int joined = 0;
  for (int attempt = 0; attempt < 200 && joined < clients; ++attempt) {
    if (!command('h')) break;
    while (true) {
      auto in = (*server)->Receive(50);
      if (!in.ok() || !in->has_value()) break;
      ++joined;
    }
  }
  // Drain stray heartbeats so each iteration receives exactly its updates.
  while (true) {
    auto in = (*server)->Receive(100);
    if (!in.ok() || !in->has_value()) break;
  }
  const double cpu_start = ProcessCpuSeconds();
  for (auto _ : state) {
    if (!command('u')) {
      state.SkipWithError("the client process is gone");
      break;
    }
    for (int got = 0; got < clients;) {
      auto in = (*server)->Receive(10'000);
      if (!in.ok() || !in->has_value()) {
        state.SkipWithError("an update did not arrive within 10 s");
        break;
      }
      if ((*in)->message.ok() && (*in)->message->type() == wire::MessageType::kFitResult) ++got;
    }
    if (state.error_occurred()) break;
  }
  const double cpu_seconds = ProcessCpuSeconds() - cpu_start;
  const int rc = finish();
  if (rc != 0 && !state.error_occurred()) {
    state.SkipWithError(("the client process exited with status " + std::to_string(rc)).c_str());
  }
  const double bytes = static_cast<double>(state.iterations()) * clients * kUpdateFloats * 4;
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["bytes_per_coord_cpu_s"] = benchmark::Counter(bytes / cpu_seconds);
  state.SetLabel(encrypted ? "curve" : "plaintext");
}

BENCHMARK(BM_Ingest)
    ->ArgNames({"clients", "encrypted"})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Args({8, 0})
    ->Args({8, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

// crypto_box_easy_afternm / crypto_box_open_easy_afternm on one chunk (kMaxChunkBytes, one core).
void BM_Seal(benchmark::State& state, bool open) {
  unsigned char pk[crypto_box_PUBLICKEYBYTES], sk[crypto_box_SECRETKEYBYTES];
  unsigned char key[crypto_box_BEFORENMBYTES], nonce[crypto_box_NONCEBYTES] = {};
  if (sodium_init() < 0 || crypto_box_keypair(pk, sk) != 0 ||
      crypto_box_beforenm(key, pk, sk) != 0) {
    state.SkipWithError("libsodium failed to initialise");
    return;
  }
  const size_t n = wire::kMaxChunkBytes;
  std::vector<unsigned char> plain(n, 1), box(n + crypto_box_MACBYTES);
  (void)crypto_box_easy_afternm(box.data(), plain.data(), n, nonce, key);
  for (auto _ : state) {
    const int rc =
        open ? crypto_box_open_easy_afternm(plain.data(), box.data(), box.size(), nonce, key)
             : crypto_box_easy_afternm(box.data(), plain.data(), n, nonce, key);
    benchmark::DoNotOptimize(rc);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK_CAPTURE(BM_Seal, seal, false);
BENCHMARK_CAPTURE(BM_Seal, open, true);

}  // namespace
}  // namespace huddle::transport

int main(int argc, char** argv) {
  huddle::ConfigureMalloc();  // as `huddle coordinator` and `huddle client` do
  if (argc == 5 && std::string(argv[1]) == "--clients") {
    return huddle::transport::RunClients(argv[2], std::atoi(argv[3]), argv[4]);
  }
  huddle::transport::g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // CurveZMQ's rates over plaintext's for each client count.
  huddle::bench::RatioReporter reporter(
      [](const benchmark::BenchmarkReporter::Run& run) {
        if (run.run_name.function_name != "BM_Ingest") return std::pair<std::string, std::string>();
        const std::string& args = run.run_name.args;  // "clients:8/encrypted:1"
        return std::pair<std::string, std::string>(
            args.substr(0, args.find('/')),
            args.find("encrypted:1") != std::string::npos ? "CurveZMQ" : "plaintext");
      },
      "CurveZMQ", "plaintext", "encrypted/plaintext",
      std::vector<std::string>{"bytes_per_second", "bytes_per_coord_cpu_s"});
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
