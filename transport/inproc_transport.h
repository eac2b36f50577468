// In-process transport for simulating large populations in one process.
//
// The coordinator talks to an InProcServerTransport exactly as it talks to ZeroMQ. Each simulated
// client is an InProcPeer (the same client agent code that runs behind a DEALER socket in a
// process). Messages are handed over as objects (payloads shared, never copied). Peer work runs on
// a small thread pool; each peer's messages are handled one at a time and in order (a strand per
// peer), so 1000+ clients need 1000+ agents but only `threads` threads.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

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
  void Worker();
  void Deliver(size_t index, std::vector<wire::Message> replies);

  std::vector<InProcPeer*> peers_;
  int threads_;
  std::vector<std::thread> pool_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable inbox_cv_;
  std::vector<Mailbox> mailboxes_;
  std::deque<size_t> ready_;  // peers with queued messages, in scheduling order
  std::deque<Inbound> inbox_;
  bool shutting_down_ = false;
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
};

}  // namespace huddle::transport
