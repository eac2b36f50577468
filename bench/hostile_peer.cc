// An enrolled, hostile client against a real coordinator (scripts/attack_figures.sh drives it):
// it speaks ZMTP and CurveZMQ itself (tests/wire/raw_curve_peer.h), so it can do what libzmq's own
// senders never do.
//
//   hostile_peer --port P --server-key server.pub --key mallory.key --mode endless|flood|hold
//                [--connections 1] [--seconds 60] [--hold-bytes 3932160] [--identify 0|1]
//
// endless: on each connection, one multipart message that never ends (256 KiB frames with MORE
//          set), reconnecting whenever the coordinator cuts the connection.
// flood:   on each connection, complete Heartbeat messages as fast as TCP lets them through,
//          reconnecting when cut.
// hold:    on each connection, an unfinished message of --hold-bytes (256 KiB frames with MORE
//          set; default 3.75 MiB, under the coordinator's 4 MiB window), then nothing: the
//          connection holds it until cut, then reconnects. --identify 1 first sends a complete
//          Heartbeat, so the coordinator knows the connection's key.
// Prints, at the end, what was written and how many connections the coordinator cut. Exits 1 if
// it never got through the handshake.
#include <algorithm>
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
  uint64_t hold_bytes = uint64_t{3840} << 10;
  bool identify = false;
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
    if (a.mode == "hold") {
      if (a.identify) st = peer.SendFrame(heartbeat.data(), heartbeat.size(), /*more=*/false);
      for (uint64_t sent = 0; st.ok() && sent < a.hold_bytes; sent += chunk.size()) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), a.hold_bytes - sent));
        st = peer.SendFrame(chunk.data(), n, /*more=*/true);
      }
      while (st.ok() && Clock::now() < end) {
        if (!peer.Alive()) st = absl::UnavailableError("cut");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      totals->bytes += peer.bytes_written();
      if (!st.ok()) totals->cut++;
      continue;
    }
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
    if (k == "--hold-bytes") a.hold_bytes = std::strtoull(v.c_str(), nullptr, 10);
    if (k == "--identify") a.identify = v == "1";
  }
  auto server = transport::ReadKeyFile(a.server_key, /*need_secret=*/false);
  auto me = transport::ReadKeyFile(a.key, /*need_secret=*/true);
  if (!server.ok() || !me.ok() || a.port <= 0 ||
      (a.mode != "endless" && a.mode != "flood" && a.mode != "hold")) {
    std::fprintf(stderr,
                 "usage: hostile_peer --port P --server-key server.pub --key client.key "
                 "--mode endless|flood|hold [--connections N] [--seconds S] [--hold-bytes B] "
                 "[--identify 0|1]\n");
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
