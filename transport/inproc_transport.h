// In-process transport for simulating large populations in one process.
//
// The coordinator talks to an InProcServerTransport exactly as it talks to ZeroMQ. Each simulated
// client is an InProcPeer (the same client agent code that runs behind a DEALER socket in a
// process). Messages are handed over as objects (payloads shared, never copied). Peer work runs on
// a small thread pool; each peer's messages are handled one at a time and in order (a strand per
// peer), so 1000+ clients need 1000+ agents but only `threads` threads.
#pragma once

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/transport.h"

namespace huddle::transport {

// A simulated client. Called from pool threads, never concurrently for one peer.
class InProcPeer {
 public:
  virtual ~InProcPeer() = default;
  // Messages to send when the simulation starts (e.g. Join).
  virtual std::vector<wire::Message> OnStart() = 0;
  // Handles one message from the coordinator; returns the replies. An error stops this peer
  // (it is logged; the coordinator sees a client that went silent).
  virtual StatusOr<std::vector<wire::Message>> OnMessage(const wire::Message& msg) = 0;
};

class InProcServerTransport final : public ServerTransport {
 public:
  // Peers are addressed by their index as a decimal string. `peers` must outlive the transport.
  InProcServerTransport(std::vector<InProcPeer*> peers, int threads);
  ~InProcServerTransport() override;

  // Starts the pool and delivers every peer's OnStart messages.
  void Start();

  Status Send(const PeerId& peer, const wire::Message& msg) override;
  StatusOr<std::optional<Inbound>> Receive(int64_t timeout_ms) override;
  uint64_t bytes_in() const override;
  uint64_t bytes_out() const override;

 private:
  struct Mailbox {
    std::deque<wire::Message> queue;
    bool scheduled = false;
    bool stopped = false;
  };
  void Worker() ABSL_LOCKS_EXCLUDED(mu_);
  void Deliver(size_t index, std::vector<wire::Message> replies) ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<InProcPeer*> peers_;
  int threads_;
  std::vector<std::thread> pool_;

  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;
  absl::CondVar inbox_cv_;
  std::vector<Mailbox> mailboxes_ ABSL_GUARDED_BY(mu_);
  std::deque<size_t> ready_ ABSL_GUARDED_BY(mu_);  // peers with queued messages, in order
  std::deque<Inbound> inbox_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t bytes_in_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_out_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace huddle::transport
