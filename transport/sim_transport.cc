#include "transport/sim_transport.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "transport/internal/through_codec.h"

namespace huddle::transport {

using internal::ThroughCodec;

namespace {

// A virtual duration past any job's (about 31 years): keeps the sums of durations far from
// int64's limit whatever a callback returns.
constexpr int64_t kMaxDurationUs = int64_t{1} << 50;
// A real-time wait on one peer's OnMessage longer than this is logged (once per wait).
constexpr absl::Duration kSlowPeerLog = absl::Seconds(60);

}  // namespace

int64_t VirtualClock::WallMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

SimulatedServerTransport::SimulatedServerTransport(std::vector<InProcPeer*> peers,
                                                   SimulatedTransportOptions options)
    : peers_(std::move(peers)), options_(std::move(options)), mailboxes_(peers_.size()) {
  options_.threads = std::max(1, options_.threads);
}

SimulatedServerTransport::~SimulatedServerTransport() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  work_cv_.SignalAll();
  ran_cv_.SignalAll();
  for (std::thread& t : pool_) t.join();
}

int64_t SimulatedServerTransport::Micros(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return 0;
  return std::min<int64_t>(kMaxDurationUs, std::llround(seconds * 1e6));
}

int64_t SimulatedServerTransport::TransferUs(size_t bytes) const {
  if (!(options_.bandwidth_bytes_per_s > 0)) return 0;
  return Micros(static_cast<double>(bytes) / options_.bandwidth_bytes_per_s);
}

bool SimulatedServerTransport::DropsFit(size_t index, uint64_t count) const {
  const double p = index < options_.dropout.size() ? options_.dropout[index] : 0.0;
  if (!(p > 0)) return false;
  Rng rng(DeriveSeed(options_.seed, index, count));
  return rng.Uniform() < p;
}

void SimulatedServerTransport::Start() {
  for (int i = 0; i < options_.threads; ++i) pool_.emplace_back([this] { Worker(); });
  for (size_t i = 0; i < peers_.size(); ++i) {
    std::vector<wire::Message> joins = peers_[i]->OnStart();
    Event event;
    event.peer = i;
    event.ran = true;
    for (const wire::Message& m : joins) {
      Inbound& in = event.replies.emplace_back();
      in.peer = std::to_string(i);
      in.message = ThroughCodec(m, &in.wire_bytes);
    }
    absl::MutexLock lock(&mu_);
    events_.emplace(EventKey{0, next_seq_++}, std::move(event));
  }
}

Status SimulatedServerTransport::Send(const PeerId& peer, const wire::Message& msg) {
  size_t index;
  if (!absl::SimpleAtoi(peer, &index) || index >= peers_.size() || std::to_string(index) != peer) {
    return absl::NotFoundError(absl::StrCat("no simulated client '", peer, "'"));
  }
  size_t wire_bytes = 0;
  StatusOr<wire::Message> decoded = ThroughCodec(msg, &wire_bytes);
  if (!decoded.ok()) return decoded.status();  // our own message failed validation: a bug
  const bool fit = decoded->type() == wire::MessageType::kFitInstruction;
  const int64_t compute_us = options_.compute ? Micros(options_.compute(index, *decoded)) : 0;

  absl::MutexLock lock(&mu_);
  Mailbox& box = mailboxes_[index];
  if (box.gone) return absl::NotFoundError(absl::StrCat("simulated client ", peer, " stopped"));
  bytes_out_ += wire_bytes;
  if (fit) {
    model_bytes_ = decoded->PayloadBytes();
    if (DropsFit(index, box.fit_instructions++)) {
      ++dropouts_;
      return absl::OkStatus();  // lost: never handled, never answered
    }
  }
  const size_t reply_bytes =
      decoded->type() == wire::MessageType::kUploadGrant ? model_bytes_ : size_t{0};
  // 1. (the header's model): the link there, the queue behind the peer's earlier work, the work,
  // the link back.
  const int64_t latency_us = Micros(options_.latency_s);
  const int64_t start_us =
      std::max(clock_.NowUs() + latency_us + TransferUs(wire_bytes), box.busy_until_us);
  const int64_t done_us = start_us + compute_us;
  const int64_t due_us = done_us + latency_us + TransferUs(reply_bytes);
  box.busy_until_us = done_us;
  const EventKey key{due_us, next_seq_++};
  Event& event = events_[key];
  event.peer = index;
  if (box.stopped) {
    event.ran = true;  // the peer stopped (its failure not yet due): no answer
    return absl::OkStatus();
  }
  box.queue.emplace_back(key, std::move(decoded).value());
  if (!box.scheduled) {
    box.scheduled = true;
    ready_.push_back(index);
    work_cv_.Signal();
  }
  return absl::OkStatus();
}

void SimulatedServerTransport::Worker() {
  while (true) {
    size_t index;
    EventKey key;
    wire::Message msg;
    {
      absl::MutexLock lock(&mu_);
      while (!shutting_down_ && ready_.empty()) work_cv_.Wait(&mu_);
      if (shutting_down_) return;
      index = ready_.front();
      ready_.pop_front();
      key = mailboxes_[index].queue.front().first;
      msg = std::move(mailboxes_[index].queue.front().second);
      mailboxes_[index].queue.pop_front();
    }
    StatusOr<std::vector<wire::Message>> replies = peers_[index]->OnMessage(msg);
    std::vector<Inbound> inbound;
    if (!replies.ok()) {
      spdlog::warn("simulated client {} stopped: {}", index, replies.status().message());
    } else {
      for (const wire::Message& m : *replies) {
        Inbound& in = inbound.emplace_back();
        in.peer = std::to_string(index);
        in.message = ThroughCodec(m, &in.wire_bytes);
      }
    }
    absl::MutexLock lock(&mu_);
    Event& event = events_.at(key);
    event.ran = true;
    event.failed = !replies.ok();
    event.replies = std::move(inbound);
    Mailbox& box = mailboxes_[index];
    if (!replies.ok()) {
      box.stopped = true;
      for (const auto& queued : box.queue) events_.at(queued.first).ran = true;
      box.queue.clear();
    }
    if (!box.queue.empty()) {
      ready_.push_back(index);
      work_cv_.Signal();
    } else {
      box.scheduled = false;
    }
    ran_cv_.SignalAll();
  }
}

StatusOr<std::optional<Inbound>> SimulatedServerTransport::Receive(int64_t timeout_ms) {
  absl::MutexLock lock(&mu_);
  const int64_t deadline_us = clock_.NowUs() + std::max<int64_t>(0, timeout_ms) * 1000;
  // 3. The earliest pending message's replies, once it is due within the timeout.
  while (due_.empty()) {
    if (events_.empty() || events_.begin()->first.first > deadline_us) {
      clock_.AdvanceToUs(deadline_us);
      return std::optional<Inbound>();
    }
    auto next = events_.begin();  // only this thread erases or inserts events: `next` stays valid
    const absl::Time waiting_since = absl::Now();
    bool logged = false;
    while (!next->second.ran && !shutting_down_) {
      if (ran_cv_.WaitWithTimeout(&mu_, kSlowPeerLog) && !logged) {
        logged = true;
        spdlog::warn(
            "simulation: waiting {:.0f} s (real time) for simulated client {} to handle a "
            "message; virtual time stands still meanwhile",
            absl::ToDoubleSeconds(absl::Now() - waiting_since), next->second.peer);
      }
    }
    if (!next->second.ran) return absl::CancelledError("the simulation is shutting down");
    clock_.AdvanceToUs(next->first.first);
    Event event = std::move(next->second);
    events_.erase(next);
    if (event.failed) mailboxes_[event.peer].gone = true;
    for (Inbound& in : event.replies) due_.push_back(std::move(in));
  }
  Inbound in = std::move(due_.front());
  due_.pop_front();
  bytes_in_ += in.wire_bytes;
  return std::optional<Inbound>(std::move(in));
}

uint64_t SimulatedServerTransport::bytes_in() const {
  absl::MutexLock lock(&mu_);
  return bytes_in_;
}

uint64_t SimulatedServerTransport::bytes_out() const {
  absl::MutexLock lock(&mu_);
  return bytes_out_;
}

uint64_t SimulatedServerTransport::dropouts() const {
  absl::MutexLock lock(&mu_);
  return dropouts_;
}

}  // namespace huddle::transport
