#include "service/job_channel.h"

#include <algorithm>

#include "absl/time/time.h"

namespace huddle::service {

Status Outbox::Send(const transport::PeerId& peer, const wire::Message& msg, uint64_t* bytes_out) {
  auto request = std::make_shared<Request>();
  request->peer = peer;
  request->message = msg;  // shares the tensor payloads; copies only the header fields
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::UnavailableError("the service is stopping");
    queue_.push_back(request);
  }
  wake_();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](Request* r) { return r->done; }, request.get()));
  if (bytes_out != nullptr) *bytes_out = request->bytes_out;
  return request->status;
}

void Outbox::SetAllowance(const transport::PeerId& peer, size_t bytes) {
  auto request = std::make_shared<Request>();
  request->peer = peer;
  request->allowance_bytes = bytes;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    queue_.push_back(std::move(request));
  }
  wake_();
}

void Outbox::Drain(const std::function<void(Request&)>& run) {
  std::deque<std::shared_ptr<Request>> batch;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(queue_);
  }
  for (const std::shared_ptr<Request>& r : batch) run(*r);
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<Request>& r : batch) r->done = true;
}

void Outbox::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (const std::shared_ptr<Request>& r : queue_) {
    r->status = absl::UnavailableError("the service is stopping");
    r->done = true;
  }
  queue_.clear();
}

void JobChannel::Deliver(transport::Inbound in) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    bytes_in_ += in.wire_bytes;
    inbox_.push_back(std::move(in));
  }
  cv_.Signal();
}

void JobChannel::Close() {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  cv_.SignalAll();
}

void JobChannel::Wake() {
  {
    absl::MutexLock lock(&mu_);
    woken_ = true;
  }
  cv_.SignalAll();
}

Status JobChannel::Send(const transport::PeerId& peer, const wire::Message& msg) {
  uint64_t bytes = 0;
  Status st = outbox_->Send(peer, msg, &bytes);
  bytes_out_ += bytes;
  return st;
}

StatusOr<std::optional<transport::Inbound>> JobChannel::Receive(int64_t timeout_ms) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, timeout_ms));
  absl::MutexLock lock(&mu_);
  while (inbox_.empty() && !closed_ && !woken_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  woken_ = false;
  if (inbox_.empty()) return std::optional<transport::Inbound>();
  transport::Inbound in = std::move(inbox_.front());
  inbox_.pop_front();
  return std::optional<transport::Inbound>(std::move(in));
}

uint64_t JobChannel::bytes_in() const {
  absl::MutexLock lock(&mu_);
  return bytes_in_;
}

uint64_t JobChannel::bytes_out() const { return bytes_out_; }

void JobChannel::SetUploadAllowance(const transport::PeerId& peer, size_t bytes) {
  outbox_->SetAllowance(peer, bytes);
}

}  // namespace huddle::service
