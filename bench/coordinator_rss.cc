// Coordinator peak memory during rounds with many clients and a large model.
//
// A real coordinator (the library, ZeroMQ on 127.0.0.1, no evaluation) runs in a child process;
// the parent plays N synthetic clients on one ZeroMQ context: each joins, answers every fit
// instruction with an upload request and every grant with a full-size update (one shared buffer,
// sent zero-copy). The child reports its own peak RSS (getrusage) after the last round, so the
// figure is the coordinator's alone.
//
//   coordinator_rss [--clients 100] [--hidden 1262] [--rounds 3] [--slots 4] [--encrypted 1]
//
// With --encrypted 1 every connection is CurveZMQ with enrolled client keys, as `huddle run` and
// a default `huddle coordinator` work.
//
// Prints the peak RSS, the model size and the budget (64 MB + 4 x model size).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/memory.h"
#include "coordinator/coordinator.h"
#include "proto/codec.h"
#include "transport/curve_keys.h"
#include "transport/ports.h"
#include "transport/zmq_transport.h"

namespace {

using namespace huddle;

struct Args {
  int clients = 100;
  int64_t hidden = 1262;  // 784-1262-10: 1,003,300 parameters (4.0 MB)
  int rounds = 3;
  int slots = 4;
  bool encrypted = false;
};

// Server and client keys for --encrypted, the clients enrolled in `allow_dir`.
struct Keys {
  transport::CurveKeyPair server;
  std::vector<transport::CurveKeyPair> clients;
  std::string allow_dir;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--clients") a.clients = v;
    if (k == "--hidden") a.hidden = v;
    if (k == "--rounds") a.rounds = v;
    if (k == "--slots") a.slots = v;
    if (k == "--encrypted") a.encrypted = v != 0;
  }
  return a;
}

std::string ClientId(int i) { return "synthetic-" + std::to_string(i); }

StatusOr<Keys> MakeKeys(const Args& a, const std::string& dir) {
  Keys k;
  k.allow_dir = dir;
  HUDDLE_ASSIGN_OR_RETURN(k.server, transport::GenerateKeyPair("server", "rss"));
  for (int i = 0; i < a.clients; ++i) {
    HUDDLE_ASSIGN_OR_RETURN(auto client, transport::GenerateKeyPair("client", ClientId(i)));
    HUDDLE_RETURN_IF_ERROR(transport::WriteKeyFiles(client, dir, ClientId(i)));
    std::filesystem::remove(std::filesystem::path(dir) / (ClientId(i) + ".key"));
    k.clients.push_back(std::move(client));
  }
  return k;
}

int RunCoordinator(const Args& a, const Keys& keys, const std::string& endpoint, int report_fd) {
  ConfigureMalloc();  // as `huddle coordinator` does
  coordinator::CoordinatorOptions o;
  o.job_name = "rss";
  o.rounds = a.rounds;
  o.model.hidden = {a.hidden};
  o.cohort.size = a.clients;
  o.min_clients = a.clients;
  o.quorum = a.clients;
  o.upload_slots = a.slots;
  o.eval_every = 0;
  o.client_timeout_ms = 0;
  o.out_dir =
      (std::filesystem::temp_directory_path() / ("huddle_rss_" + std::to_string(::getpid())))
          .string();
  transport::ZmqOptions z;
  z.io_threads = 2;  // as `huddle coordinator` (cli/security.cc)
  z.recv_hwm = 64;
  if (a.encrypted) {
    z.curve_server = transport::CurveServerOptions{keys.server, {keys.allow_dir}};
  }
  auto server = transport::BindZmqServer(endpoint, z);
  if (!server.ok()) return 1;
  int64_t rounds_ok = 0;
  coordinator::Coordinator coord(o, server->get(), SteadyClock::Get(), {},
                                 [&](const coordinator::RoundMetrics& m) {
                                   rounds_ok += m.results == a.clients;
                                   std::fprintf(stderr, "%s\n", m.ProgressLine().c_str());
                                 });
  Status st = coord.Run();
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  char line[128];
  const int n = std::snprintf(line, sizeof(line), "%ld %lld %d\n", ru.ru_maxrss,
                              static_cast<long long>(rounds_ok), st.ok() ? 1 : 0);
  (void)!::write(report_fd, line, static_cast<size_t>(n));
  std::filesystem::remove_all(o.out_dir);
  return st.ok() ? 0 : 1;
}

void Release(void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }

void SendMessage(zmq::socket_t& s, const wire::Message& m) {
  const std::string header = wire::EncodeHeader(m);
  s.send(zmq::buffer(header), m.tensors.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const auto& p = m.tensors[i];
    const auto chunks = wire::Chunks(p.bytes);
    for (size_t c = 0; c < chunks.size(); ++c) {
      zmq::message_t f(const_cast<std::byte*>(chunks[c].data()), chunks[c].size(), &Release,
                       new std::shared_ptr<const void>(p.owner));
      const bool last = i + 1 == m.tensors.size() && c + 1 == chunks.size();
      s.send(f, last ? zmq::send_flags::none : zmq::send_flags::sndmore);
    }
  }
}

// The synthetic clients. Returns when every client got Shutdown or after a time limit.
void RunClients(const Args& a, const Keys& keys, const std::string& endpoint) {
  models::MlpSpec spec;
  spec.hidden = {a.hidden};
  auto delta = std::make_shared<TensorList>();
  for (const TensorSpec& t : models::MlpLayout(spec)) {
    Tensor x(t.name, t.shape);
    for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = 1e-4f * static_cast<float>(i % 7);
    delta->push_back(std::move(x));
  }
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> sockets;
  std::vector<zmq::pollitem_t> items;
  for (int i = 0; i < a.clients; ++i) {
    sockets.emplace_back(ctx, zmq::socket_type::dealer);
    sockets.back().set(zmq::sockopt::linger, 0);
    if (a.encrypted) {
      sockets.back().set(zmq::sockopt::curve_serverkey, keys.server.public_z85);
      sockets.back().set(zmq::sockopt::curve_publickey, keys.clients[i].public_z85);
      sockets.back().set(zmq::sockopt::curve_secretkey, keys.clients[i].secret_z85);
    }
    sockets.back().connect(endpoint);
    SendMessage(sockets.back(), wire::MakeMessage(wire::Join{ClientId(i), 1000, "bench"}));
  }
  for (auto& s : sockets) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
  std::vector<uint64_t> version(sockets.size(), 0);
  std::vector<std::string> nonce(sockets.size());
  int finished = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (finished < a.clients && std::chrono::steady_clock::now() < until) {
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
    for (size_t i = 0; i < sockets.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      std::vector<wire::Frame> frames;
      while (true) {
        auto m = std::make_shared<zmq::message_t>();
        (void)sockets[i].recv(*m);
        const bool more = m->more();
        frames.push_back({m, {static_cast<const std::byte*>(m->data()), m->size()}});
        if (!more) break;
      }
      auto msg = wire::Decode(frames);
      if (!msg.ok()) continue;
      switch (msg->type()) {
        case wire::MessageType::kFitInstruction:
          version[i] = std::get<wire::FitInstruction>(msg->body).model_version;
          nonce[i] = std::get<wire::FitInstruction>(msg->body).nonce;
          SendMessage(sockets[i],
                      wire::MakeMessage(wire::UploadRequest{1000, nonce[i]}, msg->round));
          break;
        case wire::MessageType::kUploadGrant: {
          wire::Message r = wire::MakeMessage(
              wire::FitResult{1000, 0.1, 0.5, 0.01, version[i], nonce[i]}, msg->round);
          r.tensors = wire::ShareAll(delta);
          SendMessage(sockets[i], r);
          break;
        }
        case wire::MessageType::kShutdown:
          ++finished;
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  auto port = transport::FreeLoopbackPort();
  if (!port.ok()) return 1;
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(*port);
  const std::string key_dir =
      (std::filesystem::temp_directory_path() / ("huddle_rss_keys_" + std::to_string(::getpid())))
          .string();
  Keys keys;
  if (a.encrypted) {
    auto made = MakeKeys(a, key_dir);
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
      return 1;
    }
    keys = *std::move(made);
  }
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    ::_exit(RunCoordinator(a, keys, endpoint, fds[1]));
  }
  ::close(fds[1]);
  RunClients(a, keys, endpoint);
  char buf[128] = {};
  const ssize_t n = ::read(fds[0], buf, sizeof(buf) - 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  long rss_kb = 0;
  long long rounds_ok = 0;
  int ok = 0;
  if (n <= 0 || std::sscanf(buf, "%ld %lld %d", &rss_kb, &rounds_ok, &ok) != 3 || !ok) {
    std::fprintf(stderr, "coordinator failed\n");
    return 1;
  }
  models::MlpSpec spec;
  spec.hidden = {a.hidden};
  const double model_mb = static_cast<double>(TotalElements(models::MlpLayout(spec))) * 4 / 1048576;
  const double rss_mb = static_cast<double>(rss_kb) / 1024;
  const double budget = 64 + 4 * model_mb;
  std::filesystem::remove_all(key_dir);
  std::printf("clients %d, rounds %d (%lld with every result), upload slots %d, %s\n", a.clients,
              a.rounds, rounds_ok, a.slots, a.encrypted ? "CurveZMQ" : "plaintext");
  std::printf("model: %.2f MiB (%lld parameters)\n", model_mb,
              static_cast<long long>(TotalElements(models::MlpLayout(spec))));
  std::printf(
      "coordinator peak RSS: %.1f MiB; budget 64 MiB + 4 x model = %.1f MiB; "
      "peak/budget = %.2f\n",
      rss_mb, budget, rss_mb / budget);
  return 0;
}
