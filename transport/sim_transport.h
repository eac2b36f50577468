// A discrete-event simulation of a federation in one process, on a virtual clock.
//
// SimulatedServerTransport carries messages between the coordinator and InProcPeers (the same
// simulated clients as InProcServerTransport, through the same wire codec), but time is virtual:
// the coordinator's clock (VirtualClock, owned by the transport) is advanced only by Receive, to
// the virtual time at which the next reply is due. Heterogeneous clients (slow devices, thin
// links, dropouts) cost no real time, and the run is deterministic: the order in which replies
// reach the coordinator, and the virtual time at which each does, depend only on what the
// coordinator sent and when, never on thread timing. The same job and seed give the same run,
// bitwise.
//
// The model (conservative: every reply's virtual time is fixed the moment its message is sent):
//   1. A peer is a serial processor behind a link of `latency_s` and `bandwidth_bytes_per_s`
//      each way. When the coordinator sends message M to peer i at virtual time t:
//        start = max(t + latency + bytes(M) / bandwidth, busy_until[i])
//        done  = start + compute(i, M)
//        due   = done + latency + reply_bytes / bandwidth
//        busy_until[i] = done
//      bytes(M) is M's size on the wire. reply_bytes is the model's payload bytes when M is an
//      UploadGrant (the reply is the FitResult; the model's size is that of the last
//      FitInstruction's tensors sent), else 0. compute(i, M) is the options' callback (virtual
//      seconds; absent: 0).
//   2. M itself is handled at once (real time) on a thread pool: OnMessage runs one message at a
//      time per peer, in order (a strand per peer), in parallel with everything else. Its replies
//      are held until the coordinator's virtual clock reaches `due`.
//   3. Receive(timeout_ms) takes the pending message E with the smallest (due, sequence number
//      given at Send). If E is due by now + timeout, it waits in real time until E's OnMessage has
//      run, advances the clock to max(now, due) and returns E's replies, one per call, all at
//      `due` (a message with no replies is passed over, and the next one considered). Otherwise it
//      advances the clock by timeout_ms and returns nothing.
//   4. Dropout: a FitInstruction is lost with peer i's dropout probability (a draw from the seed,
//      i and the count of FitInstructions sent to i so far): the peer never gets it and never
//      answers it; the coordinator sees a silent member. Counted in dropouts().
//   5. Start() delivers every peer's OnStart messages (Joins) at virtual time 0, in peer order.
//   6. A peer whose OnMessage fails stops (logged, as in InProcServerTransport): its later
//      messages are dropped, and once the failed message's replies would have been due, Send to
//      it is NotFound.
// bytes_out counts each message's wire size at Send (a lost one too: it left the coordinator);
// bytes_in each reply's when Receive returns it.
//
// Thread-safety: as ServerTransport (one owning thread); the clock may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "transport/inproc_transport.h"
#include "transport/transport.h"

namespace huddle::transport {

// Virtual time for a SimulatedServerTransport's coordinator: starts at 0 and is advanced only by
// that transport (never backwards). WallMs() is the real system clock: it only labels records.
class VirtualClock final : public Clock {
 public:
  int64_t NowMs() const override { return now_us_.load(std::memory_order_acquire) / 1000; }
  int64_t WallMs() const override;
  bool simulated() const override { return true; }
  // Microseconds of virtual time since the start.
  int64_t NowUs() const { return now_us_.load(std::memory_order_acquire); }

 private:
  friend class SimulatedServerTransport;
  void AdvanceToUs(int64_t us) {
    if (us > now_us_.load(std::memory_order_relaxed)) now_us_.store(us, std::memory_order_release);
  }
  std::atomic<int64_t> now_us_{0};
};

struct SimulatedTransportOptions {
  int threads = 2;                   // pool threads running the peers' OnMessage
  double latency_s = 0;              // one-way, per message
  double bandwidth_bytes_per_s = 0;  // per peer's link, each way; 0: unlimited
  // Virtual seconds peer `peer` computes on `msg` (>= 0; a negative or non-finite value counts
  // as 0). Called on the owning thread, at Send. Absent: every message costs 0.
  std::function<double(size_t peer, const wire::Message& msg)> compute;
  // Per peer, the probability in [0, 1] that a FitInstruction is lost; empty: none are.
  std::vector<double> dropout;
  uint64_t seed = 0;  // of the dropout draws
};

class SimulatedServerTransport final : public ServerTransport {
 public:
  // Peers are addressed by their index as a decimal string. `peers` must outlive the transport.
  SimulatedServerTransport(std::vector<InProcPeer*> peers, SimulatedTransportOptions options);
  ~SimulatedServerTransport() override;

  // Starts the pool and queues every peer's OnStart messages, due at virtual time 0.
  void Start();

  Status Send(const PeerId& peer, const wire::Message& msg) override;
  StatusOr<std::optional<Inbound>> Receive(int64_t timeout_ms) override;
  uint64_t bytes_in() const override;
  uint64_t bytes_out() const override;

  // The coordinator's clock (advanced by Receive only).
  const VirtualClock* clock() const { return &clock_; }
  // FitInstructions lost to dropout so far.
  uint64_t dropouts() const;

 private:
  // A message sent to a peer, ordered by (due_us, seq): its replies once its OnMessage ran.
  using EventKey = std::pair<int64_t, uint64_t>;
  struct Event {
    size_t peer = 0;
    bool ran = false;     // OnMessage returned (or the message was dropped by a stopped peer)
    bool failed = false;  // OnMessage failed: the peer stops
    std::vector<Inbound> replies;
  };
  struct Mailbox {
    std::deque<std::pair<EventKey, wire::Message>> queue;
    bool scheduled = false;
    bool stopped = false;  // OnMessage failed (real time): later messages are not handled
    bool gone = false;     // the failure is due (virtual time): Send is NotFound
    int64_t busy_until_us = 0;
    uint64_t fit_instructions = 0;
  };
  void Worker() ABSL_LOCKS_EXCLUDED(mu_);
  // Microseconds of `seconds` (>= 0; non-finite or negative: 0).
  static int64_t Micros(double seconds);
  int64_t TransferUs(size_t bytes) const;
  bool DropsFit(size_t index, uint64_t count) const;

  std::vector<InProcPeer*> peers_;
  SimulatedTransportOptions options_;
  VirtualClock clock_;
  std::vector<std::thread> pool_;

  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;
  absl::CondVar ran_cv_;
  std::vector<Mailbox> mailboxes_ ABSL_GUARDED_BY(mu_);
  std::deque<size_t> ready_ ABSL_GUARDED_BY(mu_);  // peers with queued messages, in order
  std::map<EventKey, Event> events_ ABSL_GUARDED_BY(mu_);
  std::deque<Inbound> due_ ABSL_GUARDED_BY(mu_);  // a delivered event's remaining replies
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  size_t model_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // the last FitInstruction's payload
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t bytes_in_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_out_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropouts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace huddle::transport
