#include "client/runner.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/rng.h"
#include "transport/zmq_transport.h"

namespace huddle::client {
namespace {

// Runs agent.Handle() on its own thread, in arrival order; replies come back through Poll().
class AgentWorker {
 public:
  explicit AgentWorker(ClientAgent& agent) : agent_(agent), thread_([this] { Loop(); }) {}
  ~AgentWorker() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }

  void Post(wire::Message msg) {
    {
      absl::MutexLock lock(&mu_);
      inbox_.push_back(std::move(msg));
    }
    cv_.SignalAll();
  }

  // Replies produced so far; the agent's fatal error, if any.
  std::vector<wire::Message> TakeReplies(Status* fatal, bool* done) {
    absl::MutexLock lock(&mu_);
    std::vector<wire::Message> out(std::make_move_iterator(outbox_.begin()),
                                   std::make_move_iterator(outbox_.end()));
    outbox_.clear();
    *fatal = fatal_;
    *done = done_ && inbox_.empty() && !busy_;
    return out;
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (true) {
      while (!stopping_ && inbox_.empty()) cv_.Wait(&mu_);
      if (stopping_) return;
      wire::Message msg = std::move(inbox_.front());
      inbox_.pop_front();
      busy_ = true;
      mu_.Unlock();
      StatusOr<std::vector<wire::Message>> replies = agent_.Handle(msg);
      mu_.Lock();
      busy_ = false;
      if (!replies.ok()) {
        fatal_ = replies.status();
      } else {
        for (auto& r : *replies) outbox_.push_back(std::move(r));
      }
      done_ = agent_.done();
    }
  }

  ClientAgent& agent_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<wire::Message> inbox_ ABSL_GUARDED_BY(mu_);
  std::deque<wire::Message> outbox_ ABSL_GUARDED_BY(mu_);
  Status fatal_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields it uses exist
};

}  // namespace

Status RunClient(ClientAgent& agent, transport::ClientTransport& transport,
                 const RunnerOptions& options, const Clock& clock, const std::atomic<bool>* stop) {
  Rng jitter(DeriveSeed(StableHash(agent.client_id()), static_cast<uint64_t>(::getpid())));
  AgentWorker worker(agent);

  int64_t heartbeat_ms = options.heartbeat_interval_ms;
  int64_t backoff_ms = options.backoff_initial_ms;
  const int64_t started = clock.NowMs();
  int64_t last_heard = started;
  int64_t last_contact = started;  // last time we were joined (for give_up_after_ms)
  int64_t next_join = started;
  int64_t next_heartbeat = started;
  bool joined = false;
  bool warned_unreachable = false;
  int64_t unreachable_since = started;  // the start of this attempt to (re)connect
  constexpr int64_t kUnreachableGraceMs = 5000;

  auto next_backoff = [&] {
    const int64_t wait =
        backoff_ms / 2 +
        static_cast<int64_t>(jitter.UniformInt(static_cast<uint64_t>(backoff_ms / 2 + 1)));
    backoff_ms = std::min(options.backoff_max_ms, backoff_ms * 2);
    return wait;
  };

  while (stop == nullptr || !stop->load()) {
    const int64_t now = clock.NowMs();

    Status fatal;
    bool done = false;
    for (wire::Message& reply : worker.TakeReplies(&fatal, &done)) {
      if (reply.type() == wire::MessageType::kJoin) {
        joined = false;  // the agent wants to (re)join: go through the join path
        next_join = now;
        continue;
      }
      Status sent = transport.Send(reply);
      if (!sent.ok()) {
        spdlog::warn("could not send {} for round {}: {}", wire::MessageTypeName(reply.type()),
                     reply.round, sent.message());
      }
    }
    if (!fatal.ok()) return fatal;
    if (done) return absl::OkStatus();

    if (!joined && now >= next_join) {
      Status sent = transport.Send(agent.MakeJoin());
      // A connection takes a moment (TCP, then the CurveZMQ handshake): only a coordinator that
      // stays out of reach past the grace period is reported, once.
      if (!sent.ok() && !warned_unreachable && now - unreachable_since >= kUnreachableGraceMs) {
        const std::string problem = transport.ConnectionProblem();
        spdlog::info("coordinator not reachable for {} s{}; retrying with backoff",
                     (now - unreachable_since) / 1000, problem.empty() ? "" : ": " + problem);
        warned_unreachable = true;
      }
      next_join = now + next_backoff();
    }
    if (joined && now >= next_heartbeat) {
      (void)transport.Send(wire::MakeMessage(wire::Heartbeat{}, 0, agent.client_id()));
      next_heartbeat = now + heartbeat_ms;
    }
    if (joined && now - last_heard > options.coordinator_timeout_ms) {
      spdlog::warn("no word from the coordinator for {} ms; reconnecting",
                   options.coordinator_timeout_ms);
      HUDDLE_RETURN_IF_ERROR(transport.Reconnect());
      joined = false;
      backoff_ms = options.backoff_initial_ms;
      next_join = now;
      last_heard = now;
      unreachable_since = now;
      warned_unreachable = false;
    }
    if (!joined && options.give_up_after_ms > 0 && now - last_contact > options.give_up_after_ms) {
      const std::string problem = transport.ConnectionProblem();
      return absl::UnavailableError(absl::StrCat("no coordinator answered for ",
                                                 options.give_up_after_ms / 1000, " s",
                                                 problem.empty() ? "" : ": " + problem,
                                                 "; giving up"));
    }

    HUDDLE_ASSIGN_OR_RETURN(auto received, transport.Receive(20));
    if (!received) continue;
    if (!received->ok()) {
      spdlog::warn("dropping a malformed message from the coordinator: {}",
                   received->status().message());
      continue;
    }
    wire::Message msg = std::move(received->value());
    last_heard = clock.NowMs();
    if (msg.type() == wire::MessageType::kWelcome) {
      joined = true;
      warned_unreachable = false;
      backoff_ms = options.backoff_initial_ms;
      const uint32_t hb = std::get<wire::Welcome>(msg.body).heartbeat_interval_ms;
      if (hb > 0) heartbeat_ms = hb;
      next_heartbeat = last_heard + heartbeat_ms;
    }
    if (joined) last_contact = last_heard;
    worker.Post(std::move(msg));
  }
  return absl::OkStatus();
}

StatusOr<PrivacyGuard> OpenPrivacyGuard(const ClientConfig& config) {
  HUDDLE_ASSIGN_OR_RETURN(PrivacyGuard guard, PrivacyGuard::Open(config.privacy));
  if (config.privacy.any()) {
    auto local = guard.LocalSpent();
    auto examples = guard.DpSgdSpent();
    spdlog::info(
        "privacy policy: {}{}; ledger {} ({} releases; local DP epsilon {:.4g}, DP-SGD epsilon "
        "{:.4g} so far)",
        config.privacy.local ? (config.privacy.local->require ? "local DP required" : "local DP")
                             : "no local DP policy",
        config.privacy.dp_sgd ? ", DP-SGD" : "", config.privacy.ledger_path, guard.entries().size(),
        local.ok() ? local->epsilon : -1.0, examples.ok() ? examples->epsilon : -1.0);
  } else if (!config.privacy.ledger_path.empty()) {
    spdlog::info("privacy ledger {} ({} releases)", config.privacy.ledger_path,
                 guard.entries().size());
  }
  return guard;
}

Status RunConfiguredClient(const ClientConfig& config, const transport::ZmqOptions& zopts,
                           ClientAgent& agent, const std::atomic<bool>* stop) {
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<transport::ClientTransport> transport,
                          transport::ConnectZmqClient(config.coordinator, zopts));
  return RunClient(agent, *transport, config.runner, *SteadyClock::Get(), stop);
}

}  // namespace huddle::client
