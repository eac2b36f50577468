// An enrolled, hostile client against a real coordinator (scripts/attack_figures.sh drives it):
// it speaks ZMTP and CurveZMQ itself (tests/wire/raw_curve_peer.h), so it can do what libzmq's own
// senders never do.
//
//   hostile_peer --port P --server-key server.pub --key mallory.key --mode endless|flood
//                [--connections 1] [--seconds 60]
//
// endless: on each connection, one multipart message that never ends (256 KiB frames with MORE
//          set), reconnecting whenever the coordinator cuts the connection.
// flood:   on each connection, complete Heartbeat messages as fast as TCP lets them through,
//          reconnecting when cut.
// Prints, at the end, what was written and how many connections the coordinator cut. Exits 1 if
// it never got through the handshake.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "proto/codec.h"
#include "tests/wire/raw_curve_peer.h"
#include "transport/curve_keys.h"

namespace {

using namespace huddle;
using Clock = std::chrono::steady_clock;

struct Args {
  int port = 0;
  std::string server_key, key, mode = "endless";
  int connections = 1;
  double seconds = 60;
};

struct Totals {
  std::atomic<uint64_t> bytes{0}, messages{0}, connected{0}, cut{0};
};

// One connection after another until the deadline; each ends when the coordinator cuts it.
void Attack(const Args& a, const transport::CurveKeyPair& server, const transport::CurveKeyPair& me,
            Clock::time_point end, Totals* totals) {
  const std::vector<char> chunk(wire::kMaxChunkBytes, 'x');
  const std::string heartbeat = wire::EncodeHeader(wire::MakeMessage(wire::Heartbeat{}));
  while (Clock::now() < end) {
    transport::testing::RawCurvePeer peer;
    if (!peer.Connect(a.port, server.public_z85, me).ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    totals->connected++;
    Status st = absl::OkStatus();
    while (st.ok() && Clock::now() < end) {
      if (a.mode == "endless") {
        st = peer.SendFrame(chunk.data(), chunk.size(), /*more=*/true);
      } else {
        st = peer.SendFrame(heartbeat.data(), heartbeat.size(), /*more=*/false);
        if (st.ok()) totals->messages++;
      }
    }
    totals->bytes += peer.bytes_written();
    if (!st.ok()) totals->cut++;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--port") a.port = std::atoi(v.c_str());
    if (k == "--server-key") a.server_key = v;
    if (k == "--key") a.key = v;
    if (k == "--mode") a.mode = v;
    if (k == "--connections") a.connections = std::atoi(v.c_str());
    if (k == "--seconds") a.seconds = std::atof(v.c_str());
  }
  auto server = transport::ReadKeyFile(a.server_key, /*need_secret=*/false);
  auto me = transport::ReadKeyFile(a.key, /*need_secret=*/true);
  if (!server.ok() || !me.ok() || a.port <= 0 || (a.mode != "endless" && a.mode != "flood")) {
    std::fprintf(stderr,
                 "usage: hostile_peer --port P --server-key server.pub --key client.key "
                 "--mode endless|flood [--connections N] [--seconds S]\n");
    return 2;
  }
  Totals totals;
  const auto start = Clock::now();
  const auto end = start + std::chrono::milliseconds(static_cast<int64_t>(a.seconds * 1000));
  std::vector<std::thread> threads;
  for (int c = 0; c < a.connections; ++c) {
    threads.emplace_back(Attack, std::cref(a), std::cref(*server), std::cref(*me), end, &totals);
  }
  for (std::thread& t : threads) t.join();
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "hostile_peer %s: %d connection(s) for %.1f s: wrote %.1f MiB (%llu messages) over %llu "
      "connections; %llu cut by the coordinator\n",
      a.mode.c_str(), a.connections, s, totals.bytes.load() / 1048576.0,
      static_cast<unsigned long long>(totals.messages.load()),
      static_cast<unsigned long long>(totals.connected.load()),
      static_cast<unsigned long long>(totals.cut.load()));
  return totals.connected.load() > 0 ? 0 : 1;
}
