#include "transport/inproc_transport.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "absl/strings/numbers.h"
#include "transport/internal/through_codec.h"

namespace huddle::transport {

using internal::ThroughCodec;

InProcServerTransport::InProcServerTransport(std::vector<InProcPeer*> peers, int threads)
    : peers_(std::move(peers)), threads_(std::max(1, threads)), mailboxes_(peers_.size()) {}

InProcServerTransport::~InProcServerTransport() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& t : pool_) t.join();
}

void InProcServerTransport::Start() {
  for (int i = 0; i < threads_; ++i) pool_.emplace_back([this] { Worker(); });
  for (size_t i = 0; i < peers_.size(); ++i) Deliver(i, peers_[i]->OnStart());
}

void InProcServerTransport::Deliver(size_t index, std::vector<wire::Message> replies) {
  if (replies.empty()) return;
  absl::MutexLock lock(&mu_);
  for (wire::Message& m : replies) {
    Inbound in;
    in.peer = std::to_string(index);
    in.message = ThroughCodec(m, &in.wire_bytes);
    bytes_in_ += in.wire_bytes;
    inbox_.push_back(std::move(in));
  }
  inbox_cv_.Signal();
}

Status InProcServerTransport::Send(const PeerId& peer, const wire::Message& msg) {
  size_t index;
  if (!absl::SimpleAtoi(peer, &index) || index >= peers_.size() || std::to_string(index) != peer) {
    return absl::NotFoundError(absl::StrCat("no simulated client '", peer, "'"));
  }
  absl::MutexLock lock(&mu_);
  Mailbox& box = mailboxes_[index];
  if (box.stopped) return absl::NotFoundError(absl::StrCat("simulated client ", peer, " stopped"));
  size_t wire_bytes = 0;
  StatusOr<wire::Message> decoded = ThroughCodec(msg, &wire_bytes);
  if (!decoded.ok()) return decoded.status();  // our own message failed validation: a bug
  bytes_out_ += wire_bytes;
  box.queue.push_back(std::move(decoded).value());
  if (!box.scheduled) {
    box.scheduled = true;
    ready_.push_back(index);
    work_cv_.Signal();
  }
  return absl::OkStatus();
}

void InProcServerTransport::Worker() {
  while (true) {
    size_t index;
    wire::Message msg;
    {
      absl::MutexLock lock(&mu_);
      while (!shutting_down_ && ready_.empty()) work_cv_.Wait(&mu_);
      if (shutting_down_) return;
      index = ready_.front();
      ready_.pop_front();
      msg = std::move(mailboxes_[index].queue.front());
      mailboxes_[index].queue.pop_front();
    }
    StatusOr<std::vector<wire::Message>> replies = peers_[index]->OnMessage(msg);
    if (!replies.ok()) {
      spdlog::warn("simulated client {} stopped: {}", index, replies.status().message());
    } else {
      Deliver(index, std::move(replies).value());
    }
    absl::MutexLock lock(&mu_);
    Mailbox& box = mailboxes_[index];
    if (!replies.ok()) {
      box.stopped = true;
      box.queue.clear();
    }
    if (!box.queue.empty()) {
      ready_.push_back(index);
      work_cv_.Signal();
    } else {
      box.scheduled = false;
    }
  }
}

StatusOr<std::optional<Inbound>> InProcServerTransport::Receive(int64_t timeout_ms) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, timeout_ms));
  absl::MutexLock lock(&mu_);
  while (inbox_.empty() && !inbox_cv_.WaitWithDeadline(&mu_, deadline)) {
  }
  if (inbox_.empty()) return std::optional<Inbound>();
  Inbound in = std::move(inbox_.front());
  inbox_.pop_front();
  return std::optional<Inbound>(std::move(in));
}

uint64_t InProcServerTransport::bytes_in() const {
  absl::MutexLock lock(&mu_);
  return bytes_in_;
}

uint64_t InProcServerTransport::bytes_out() const {
  absl::MutexLock lock(&mu_);
  return bytes_out_;
}

}  // namespace huddle::transport
