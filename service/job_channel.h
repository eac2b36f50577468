// One job's view of the service's transport: the ServerTransport its Coordinator runs over.
//
// The service's dispatcher thread owns the real transport (one ZeroMQ endpoint for every job and
// every agent) and routes each inbound message to the channel of the job its connection joined
// (Deliver). The job's thread receives them here, and its sends travel back through the
// dispatcher: Send queues the message on the service's Outbox, wakes the transport and waits for
// the dispatcher to have sent it, so the Coordinator sees the transport's own answer (NotFound for
// a peer that is gone) exactly as over a transport of its own. Nothing the dispatcher does waits
// for a job: it only appends to inboxes and drains the outbox, so no job can stall another.
//
// A channel counts its own job's bytes in and out. Refusals before a message reaches a job
// (handshakes, rate limits, cut connections) are the service's, reported in its metrics, not a
// job's: auth_rejections() and the like answer 0 here.
//
// Thread-safety: Deliver and Close from the dispatcher thread; Receive, Send and
// SetUploadAllowance from the job's thread (one); Wake from any.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/transport.h"

namespace huddle::service {

// What jobs ask of the dispatcher, in the order they asked: a message to send (the sender waits
// for its status) or an upload allowance to set. Thread-safe.
class Outbox {
 public:
  struct Request {
    transport::PeerId peer;
    std::optional<wire::Message> message;  // a send; else an allowance
    size_t allowance_bytes = 0;
    // A send's outcome, filled by the dispatcher (Complete).
    Status status;
    uint64_t bytes_out = 0;
    bool done = false;
  };

  // `wake` is called (from the asking thread) after each request is queued.
  explicit Outbox(std::function<void()> wake) : wake_(std::move(wake)) {}

  // Queues a send and waits until the dispatcher ran it (or the outbox closed: Unavailable).
  Status Send(const transport::PeerId& peer, const wire::Message& msg, uint64_t* bytes_out);
  void SetAllowance(const transport::PeerId& peer, size_t bytes);

  // Dispatcher side: runs every queued request with `run` (which sets status and bytes_out of a
  // send) and wakes their senders.
  void Drain(const std::function<void(Request&)>& run);
  // Fails every waiting and future send (the dispatcher is going away).
  void Close();

 private:
  std::function<void()> wake_;
  absl::Mutex mu_;
  std::deque<std::shared_ptr<Request>> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class JobChannel final : public transport::ServerTransport {
 public:
  // `outbox` must outlive the channel.
  explicit JobChannel(Outbox* outbox) : outbox_(outbox) {}

  // Dispatcher side: a message for this job (its connection joined the job).
  void Deliver(transport::Inbound in);
  // Dispatcher side: nothing more will be delivered (the service stops); Receive then returns
  // what is queued, then nullopt at once.
  void Close();

  Status Send(const transport::PeerId& peer, const wire::Message& msg) override;
  StatusOr<std::optional<transport::Inbound>> Receive(int64_t timeout_ms) override;
  uint64_t bytes_in() const override;
  uint64_t bytes_out() const override;
  bool authenticates() const override { return authenticates_; }
  void SetUploadAllowance(const transport::PeerId& peer, size_t bytes) override;
  void Wake() override;

  void set_authenticates(bool a) { authenticates_ = a; }

 private:
  Outbox* outbox_;
  bool authenticates_ = false;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<transport::Inbound> inbox_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t bytes_in_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_out_ = 0;  // the job's thread only
};

}  // namespace huddle::service
