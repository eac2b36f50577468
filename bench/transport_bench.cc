// Coordinator ingest throughput of 40 MB updates over 127.0.0.1, CurveZMQ-encrypted versus
// plaintext, measured in the same run, for 1 and 8 concurrent clients.
//
// Each iteration, every client queues one FitResult carrying a 40 MB tensor (10M float32) and the
// coordinator's transport receives and decodes all of them. The coordinator runs as
// `huddle coordinator` does (2 I/O threads, where CurveZMQ decrypts); each client has its own
// ZeroMQ context and I/O thread (where it encrypts), as separate client processes would. The
// reported rate is update bytes received per second. After the run, main prints
// `encrypted/plaintext` per client count (target >= 0.5 with 8 clients).
//
//   build-main/bench/transport_bench [--benchmark_repetitions=3 ...]
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "transport/curve_keys.h"
#include "transport/ports.h"
#include "transport/zmq_transport.h"

namespace huddle::transport {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kUpdateFloats = 10'000'000;  // 40 MB

struct Keys {
  CurveKeyPair server;
  std::vector<CurveKeyPair> clients;
  std::string allow_dir;
};

// Server and client keys, the clients enrolled in a temporary allow-list (made once).
const Keys& TestKeys(int clients) {
  static std::map<int, Keys> cache;
  Keys& k = cache[clients];
  if (k.allow_dir.empty()) {
    k.allow_dir =
        (fs::temp_directory_path() /
         ("huddle_transport_bench_" + std::to_string(::getpid()) + "_" + std::to_string(clients)))
            .string();
    fs::remove_all(k.allow_dir);
    k.server = *GenerateKeyPair("server", "bench");
    for (int i = 0; i < clients; ++i) {
      const std::string id = "c" + std::to_string(i);
      k.clients.push_back(*GenerateKeyPair("client", id));
      (void)WriteKeyFiles(k.clients.back(), k.allow_dir, id);
      fs::remove(fs::path(k.allow_dir) / (id + ".key"));
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

void BM_Ingest(benchmark::State& state) {
  const int clients = static_cast<int>(state.range(0));
  const bool encrypted = state.range(1) != 0;
  const Keys& keys = TestKeys(clients);

  ZmqOptions server_options;
  server_options.io_threads = 2;
  server_options.max_messages_per_s = 0;
  if (encrypted) {
    server_options.curve_server = CurveServerOptions{keys.server, ZapOptions{keys.allow_dir}};
  }
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(*FreeLoopbackPort());
  auto server = BindZmqServer(endpoint, server_options);
  if (!server.ok()) {
    state.SkipWithError(std::string(server.status().message()).c_str());
    return;
  }
  std::vector<std::unique_ptr<ClientTransport>> senders;
  for (int i = 0; i < clients; ++i) {
    ZmqOptions o;
    if (encrypted) o.curve_client = CurveClientOptions{keys.server.public_z85, keys.clients[i]};
    senders.push_back(std::move(ConnectZmqClient(endpoint, o)).value());
  }
  // Connected (and, encrypted, authenticated) before timing starts.
  int joined = 0;
  for (int attempt = 0; attempt < 200 && joined < clients; ++attempt) {
    for (auto& s : senders) (void)s->Send(wire::MakeMessage(wire::Heartbeat{}));
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
  const wire::Message update = Update();
  for (auto _ : state) {
    for (auto& s : senders) {
      if (!s->Send(update).ok()) state.SkipWithError("send queue full");
    }
    for (int got = 0; got < clients;) {
      auto in = (*server)->Receive(10'000);
      if (!in.ok() || !in->has_value()) {
        state.SkipWithError("an update did not arrive within 10 s");
        return;
      }
      if ((*in)->message.ok() && (*in)->message->type() == wire::MessageType::kFitResult) ++got;
    }
  }
  state.SetBytesProcessed(state.iterations() * clients * kUpdateFloats * 4);
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

}  // namespace
}  // namespace huddle::transport

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // CurveZMQ's bytes/s over plaintext's for each client count.
  huddle::bench::RatioReporter reporter(
      [](const benchmark::BenchmarkReporter::Run& run) {
        const std::string& args = run.run_name.args;  // "clients:8/encrypted:1"
        return std::make_pair(
            args.substr(0, args.find('/')),
            args.find("encrypted:1") != std::string::npos ? "CurveZMQ" : "plaintext");
      },
      "CurveZMQ", "plaintext", "encrypted/plaintext");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
