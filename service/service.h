// `huddle serve`: a long-running coordinator that hosts jobs for agents that stay.
//
// The service owns one endpoint (the agents' transport), the jobs' state directory (JobStore) and
// the queue. Agents hold a session with the service itself (a Join whose `job` is empty, listing
// their data sets by name; heartbeats keep it live); the service offers each running job to the
// live agents that declare the job's data set and are in no other job (JobOffer), and an agent
// that takes the offer joins the job on a connection of its own (a Join naming the job). From
// then on every message of that connection goes to the job's Coordinator, which runs unchanged
// on its own thread over a JobChannel (job_channel.h): the synchronous round, its privacy session
// and secure aggregation are the same code as in `huddle coordinator`.
//
// Scheduling: jobs start in submission order, at most max_concurrent_jobs at a time (each agent
// in one job at a time, so concurrent jobs draw from disjoint agents: each running job is offered
// agents until it has the number it asks for, oldest job first; agents beyond that go to the job
// with the fewest). A job interrupted by the
// service's own stop (or crash) stays `running` on disk and is started again first, resumed from
// its checkpoint and ledger; an operator's stop ends it for good (`stopped`).
//
// Thread-safety: Run() on one thread (the dispatcher, which owns the transport); the operator
// methods (Submit, Stop, Jobs, Job, Agents) from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/status.h"
#include "service/job_channel.h"
#include "service/job_store.h"
#include "service/service_metrics.h"
#include "transport/transport.h"

namespace huddle::service {

// A job made ready to run from its stored configuration (by the service's owner: the CLI knows
// how a job YAML becomes a Coordinator, the service does not).
struct PreparedJob {
  std::string data;    // the data set the job trains on, by the name agents declare
  int64_t rounds = 0;  // planned
  // The agents the job asks for (its coordinator.min_clients, or a fixed cohort's size when
  // larger): with several jobs at once, each gets this many before any gets more.
  int64_t wanted_agents = 1;
  // Runs the job to its end over `transport`; stops (Cancelled) when *stop turns true. `on_round`
  // gets each round's public metrics row (JSON; under DP only DP-protected values) and its
  // operator row (the counts, traffic and timings; the same full row without DP).
  using RoundRows =
      std::function<void(const std::string& public_row, const std::string& operator_row)>;
  std::function<Status(transport::ServerTransport* transport, const std::atomic<bool>* stop,
                       const RoundRows& on_round)>
      run;
};
// Loads job `name` from `config_path` with its outputs in `out_dir`; `resume`: continue from the
// checkpoint there. Errors are the job's configuration errors (the job fails with them).
using JobPreparer =
    std::function<StatusOr<PreparedJob>(const std::string& name, const std::string& config_path,
                                        const std::string& out_dir, bool resume)>;

struct ServiceOptions {
  int64_t max_concurrent_jobs = 1;
  int64_t heartbeat_interval_ms = 5000;  // told to agents in the session's Welcome
  int64_t agent_timeout_ms = 30000;      // an agent's session silent this long is not live
  int64_t offer_interval_ms = 5000;      // an offer not taken up is repeated after this
  int64_t schedule_interval_ms = 100;    // how often the queue, offers and liveness are checked
};

// What `huddle jobs` and `huddle status` show of a job.
struct JobView {
  JobRecord record;
  int64_t planned_rounds = 0;       // 0 until the job was prepared
  std::string last_round_row;       // the latest round's public metrics row (JSON), "" before any
  std::vector<std::string> agents;  // agents in the job now
};
// What `huddle clients` shows of an agent.
struct AgentView {
  std::string id;
  bool live = false;
  int64_t last_seen_ms_ago = 0;
  std::string connected_at;  // ISO-8601 UTC of its session's Join
  std::vector<std::string> datasets;
  std::string job;  // the job it is in, "" when idle
  std::string version;
};

class Service {
 public:
  // `transport` (the agents' endpoint), `clock` and `metrics` (may be null) must outlive the
  // service; `now_iso` gives the wall-clock time for records (ISO-8601 UTC).
  Service(ServiceOptions options, JobStore store, transport::ServerTransport* transport,
          const Clock* clock, JobPreparer preparer, std::function<std::string()> now_iso,
          ServiceMetrics* metrics = nullptr);
  ~Service();

  // Dispatches until *stop: routes messages, runs the queue, offers jobs. On stop, running jobs
  // are stopped so that the next start resumes them, and their threads are joined.
  Status Run(const std::atomic<bool>* stop);

  // Operator API (thread-safe). Submit stores a validated job (`resolved`: its YAML as it runs)
  // and queues it; the caller has validated it (service_job.h).
  StatusOr<JobRecord> Submit(const std::string& name, const std::string& submitted,
                             const std::string& resolved, const std::string& operator_id);
  // Discards a job Submit stored whose validation then failed (never ran).
  Status Discard(const std::string& name);
  // Stops a queued or running job for good; FailedPrecondition if it already ended.
  StatusOr<JobRecord> Stop(const std::string& name, const std::string& operator_id);
  std::vector<JobView> Jobs() const;
  StatusOr<JobView> Job(const std::string& name) const;
  std::vector<AgentView> Agents() const;
  const std::string& state_dir() const { return state_dir_; }
  std::string LogPath(const std::string& name) const;
  std::string OutDir(const std::string& name) const;  // the job's outputs (STATE/jobs/NAME/out)
  bool ready() const { return ready_.load(); }
  // The dispatcher went round its loop within `within_ms` (liveness: /healthz).
  bool healthy(int64_t within_ms) const {
    return ready_.load() && clock_->NowMs() - last_loop_ms_.load() <= within_ms;
  }
  // What /metrics shows of the service itself (thread-safe).
  ServiceCounts Counts() const;

 private:
  struct Agent {
    transport::PeerId session;  // its session with the service
    std::vector<std::string> datasets;
    std::string version;
    int64_t last_seen_ms = 0;
    std::string connected_at;
    std::string job;             // "" when idle
    int64_t offered_at_ms = -1;  // the last offer of `job` (taken once it joins)
    bool joined = false;         // joined `job` on a connection of its own
  };
  struct Running {
    std::string name;
    std::string data;
    int64_t rounds = 0;
    int64_t wanted_agents = 1;
    std::unique_ptr<JobChannel> channel;
    std::atomic<bool> stop{false};
    std::atomic<bool> finished{false};
    Status result;  // set by the job's thread before `finished`
    std::thread thread;
  };

  void Route(transport::Inbound in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnSessionJoin(const transport::Inbound& in, const wire::Join& join)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnJobJoin(transport::Inbound in, const wire::Join& join) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Schedule(bool stopping) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartJob(const JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reap(Running& job, bool stopping) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Offer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(const transport::PeerId& peer, const wire::Message& msg);
  void DrainOutbox();

  ServiceOptions options_;
  transport::ServerTransport* transport_;
  const Clock* clock_;
  JobPreparer preparer_;
  std::function<std::string()> now_iso_;
  std::string state_dir_;
  Outbox outbox_;
  std::atomic<bool> ready_{false};
  ServiceMetrics* metrics_;
  std::atomic<int64_t> last_loop_ms_{0};
  // The transport's counters, copied by the dispatcher (which owns it) after each message.
  std::atomic<uint64_t> bytes_in_{0}, bytes_out_{0}, refused_{0}, rate_limited_{0}, cut_{0};

  mutable absl::Mutex mu_;
  JobStore store_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Agent> agents_ ABSL_GUARDED_BY(mu_);
  std::map<transport::PeerId, std::string> job_of_peer_ ABSL_GUARDED_BY(mu_);
  std::map<transport::PeerId, std::string> agent_of_peer_ ABSL_GUARDED_BY(mu_);  // job peers
  std::map<transport::PeerId, std::string> agent_of_session_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Running>> running_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> last_rows_ ABSL_GUARDED_BY(rows_mu_);
  mutable absl::Mutex rows_mu_;
};

}  // namespace huddle::service
