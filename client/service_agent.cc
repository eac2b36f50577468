#include "client/service_agent.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/runner.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/version.h"

namespace huddle::client {
namespace {

// One job the agent takes part in, on its own thread and connection.
class JobRun {
 public:
  JobRun(std::string job, std::unique_ptr<ClientAgent> agent, const ClientConfig& config,
         const transport::ZmqOptions& zopts, PrivacyGuard* guard, absl::Mutex* guard_mu)
      : job_(std::move(job)), agent_(std::move(agent)) {
    thread_ = std::thread([this, &config, zopts, guard, guard_mu] {
      {
        absl::MutexLock lock(guard_mu);
        agent_->set_privacy_guard(std::move(*guard));
      }
      RunnerOptions runner = config.runner;
      // A job that cannot be reached for a minute is over for this agent (the service offers it
      // again if it still runs).
      runner.give_up_after_ms = 60'000;
      Status st;
      auto transport = transport::ConnectZmqClient(config.coordinator, zopts);
      if (transport.ok()) {
        st = RunClient(*agent_, **transport, runner, *SteadyClock::Get(), &stop_);
      } else {
        st = transport.status();
      }
      {
        absl::MutexLock lock(guard_mu);
        *guard = agent_->TakePrivacyGuard();
      }
      if (st.ok()) {
        spdlog::info("job '{}': done after training {} rounds", job_, agent_->rounds_trained());
      } else {
        spdlog::warn("job '{}': this agent's part ended: {}", job_, st.message());
      }
      done_.store(true);
    });
  }
  ~JobRun() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  bool done() const { return done_.load(); }
  const std::string& job() const { return job_; }

 private:
  std::string job_;
  std::unique_ptr<ClientAgent> agent_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::thread thread_;  // last: starts after the fields it uses exist
};

}  // namespace

Status RunServiceAgent(const ClientConfig& config, const transport::ZmqOptions& zopts,
                       JobAgentFactory factory, PrivacyGuard guard, const std::atomic<bool>* stop) {
  const Clock& clock = *SteadyClock::Get();
  const RunnerOptions& options = config.runner;
  Rng jitter(DeriveSeed(StableHash(config.client_id), static_cast<uint64_t>(::getpid())));
  absl::Mutex guard_mu;
  std::unique_ptr<JobRun> job;

  wire::Join hello;
  hello.client_id = config.client_id;
  hello.agent_version = std::string("huddle-") + Version();
  for (const auto& [name, spec] : config.datasets) hello.datasets.push_back(name);
  const wire::Message join = wire::MakeMessage(hello, 0, config.client_id);

  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<transport::ClientTransport> session,
                          transport::ConnectZmqClient(config.coordinator, zopts));
  int64_t heartbeat_ms = options.heartbeat_interval_ms;
  int64_t backoff_ms = options.backoff_initial_ms;
  int64_t last_heard = clock.NowMs();
  int64_t next_join = last_heard;
  int64_t next_heartbeat = last_heard;
  int64_t unreachable_since = last_heard;
  bool joined = false;
  bool warned = false;
  constexpr int64_t kUnreachableGraceMs = 5000;
  spdlog::info("agent {}: connecting to the service at {} (data sets: {})", config.client_id,
               config.coordinator, absl::StrJoin(hello.datasets, ", "));

  while (stop == nullptr || !stop->load()) {
    const int64_t now = clock.NowMs();
    if (job && job->done()) job.reset();
    if (!joined && now >= next_join) {
      Status sent = session->Send(join);
      if (!sent.ok() && !warned && now - unreachable_since >= kUnreachableGraceMs) {
        const std::string problem = session->ConnectionProblem();
        spdlog::info("service not reachable for {} s{}; retrying with backoff",
                     (now - unreachable_since) / 1000, problem.empty() ? "" : ": " + problem);
        warned = true;
      }
      next_join =
          now + backoff_ms / 2 +
          static_cast<int64_t>(jitter.UniformInt(static_cast<uint64_t>(backoff_ms / 2 + 1)));
      backoff_ms = std::min(options.backoff_max_ms, backoff_ms * 2);
    }
    if (joined && now >= next_heartbeat) {
      (void)session->Send(wire::MakeMessage(wire::Heartbeat{}, 0, config.client_id));
      next_heartbeat = now + heartbeat_ms;
    }
    // The service answers each heartbeat: silence past three of its intervals (or the configured
    // timeout, when longer) means it is gone, whatever interval its Welcome set.
    const int64_t silence_ms = std::max(options.coordinator_timeout_ms, 3 * heartbeat_ms);
    if (joined && now - last_heard > silence_ms) {
      spdlog::warn("no word from the service for {} ms; reconnecting", silence_ms);
      HUDDLE_RETURN_IF_ERROR(session->Reconnect());
      joined = false;
      backoff_ms = options.backoff_initial_ms;
      next_join = now;
      last_heard = now;
      unreachable_since = now;
      warned = false;
    }
    HUDDLE_ASSIGN_OR_RETURN(auto received, session->Receive(50));
    if (!received) continue;
    if (!received->ok()) {
      spdlog::warn("dropping a malformed message from the service: {}",
                   received->status().message());
      continue;
    }
    const wire::Message& msg = received->value();
    last_heard = clock.NowMs();
    switch (msg.type()) {
      case wire::MessageType::kWelcome: {
        if (!joined) spdlog::info("agent {}: connected to the service", config.client_id);
        joined = true;
        warned = false;
        backoff_ms = options.backoff_initial_ms;
        const uint32_t hb = std::get<wire::Welcome>(msg.body).heartbeat_interval_ms;
        if (hb > 0) heartbeat_ms = hb;
        next_heartbeat = last_heard + heartbeat_ms;
        break;
      }
      case wire::MessageType::kJobOffer: {
        const auto& offer = std::get<wire::JobOffer>(msg.body);
        if (job) {
          spdlog::debug("offer of job '{}' while in job '{}': declined", offer.job, job->job());
          break;
        }
        if (config.datasets.count(offer.data) == 0) {
          spdlog::warn(
              "offer of job '{}' on data set '{}', which this agent does not declare: "
              "declined",
              offer.job, offer.data);
          break;
        }
        StatusOr<std::unique_ptr<ClientAgent>> agent = factory(offer.job, offer.data);
        if (!agent.ok()) {
          spdlog::error("job '{}': cannot take part: {}", offer.job, agent.status().message());
          break;
        }
        (*agent)->set_job(offer.job);
        spdlog::info("job '{}': taking part, on data set '{}'", offer.job, offer.data);
        job = std::make_unique<JobRun>(offer.job, *std::move(agent), config, zopts, &guard,
                                       &guard_mu);
        break;
      }
      case wire::MessageType::kError: {
        const auto& err = std::get<wire::Error>(msg.body);
        if (err.code == wire::ErrorCode::kUnknownClient) {
          joined = false;
          next_join = last_heard;
        } else {
          spdlog::warn("the service refused: {} ({})", err.message, wire::ErrorCodeName(err.code));
          joined = false;
          next_join = last_heard + options.backoff_max_ms;
        }
        break;
      }
      case wire::MessageType::kShutdown:
        spdlog::info("the service closed this agent's session: {}",
                     std::get<wire::Shutdown>(msg.body).reason);
        joined = false;
        next_join = last_heard + options.backoff_initial_ms;
        break;
      default:
        break;
    }
  }
  job.reset();  // stops and joins the job's part
  return absl::OkStatus();
}

}  // namespace huddle::client
