#include "service/service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "service/job_log.h"

namespace huddle::service {
namespace {

constexpr size_t kMaxAgents = 100'000;  // sessions without authentication (--insecure) included

// The last line of `path` (at most its last 64 KiB are read), "" when there is none.
std::string LastLine(const std::string& path) {
  StatusOr<ReadableFile> f = ReadableFile::Open(path);
  if (!f.ok() || f->size() == 0) return {};
  const uint64_t n = std::min<uint64_t>(f->size(), 64 * 1024);
  std::string tail(n, '\0');
  if (!f->ReadAt(f->size() - n, n, tail.data()).ok()) return {};
  while (!tail.empty() && tail.back() == '\n') tail.pop_back();
  const size_t nl = tail.rfind('\n');
  return nl == std::string::npos ? (n == f->size() ? tail : std::string()) : tail.substr(nl + 1);
}

// The agent id of a connection: its key's enrolled id where the transport authenticates, else the
// Join's (taken on trust, as `huddle coordinator --insecure` does).
StatusOr<std::string> AgentId(const transport::Inbound& in, const wire::Join& join,
                              bool authenticates) {
  if (!wire::IsValidClientId(join.client_id)) {
    return absl::InvalidArgumentError("client id must be 1-128 characters of [A-Za-z0-9._-]");
  }
  if (authenticates && join.client_id != in.auth_id) {
    return absl::PermissionDeniedError(absl::StrCat("this connection's key is enrolled as '",
                                                    in.auth_id, "'; it cannot join as '",
                                                    join.client_id, "'"));
  }
  return join.client_id;
}

}  // namespace

Service::Service(ServiceOptions options, JobStore store, transport::ServerTransport* transport,
                 const Clock* clock, JobPreparer preparer, std::function<std::string()> now_iso,
                 ServiceMetrics* metrics)
    : options_(options),
      transport_(transport),
      clock_(clock),
      preparer_(std::move(preparer)),
      now_iso_(std::move(now_iso)),
      state_dir_(store.state_dir()),
      outbox_([transport] { transport->Wake(); }),
      metrics_(metrics),
      store_(std::move(store)) {}

Service::~Service() {
  // Only when Run() ended early (an error): its jobs never wait on mu_, so they can be joined
  // under it once their sends fail (the outbox is closed) and their inboxes are closed.
  outbox_.Close();
  absl::MutexLock lock(&mu_);
  for (auto& [name, job] : running_) {
    job->stop.store(true);
    job->channel->Close();
  }
  for (auto& [name, job] : running_) {
    if (job->thread.joinable()) job->thread.join();
  }
}

void Service::Send(const transport::PeerId& peer, const wire::Message& msg) {
  Status st = transport_->Send(peer, msg);
  if (!st.ok())
    spdlog::debug("to {}: {} not sent: {}", transport::PeerName(peer),
                  wire::MessageTypeName(msg.type()), st.message());
}

void Service::DrainOutbox() {
  outbox_.Drain([this](Outbox::Request& r) {
    if (!r.message) {
      transport_->SetUploadAllowance(r.peer, r.allowance_bytes);
      return;
    }
    const uint64_t before = transport_->bytes_out();
    r.status = transport_->Send(r.peer, *r.message);
    r.bytes_out = transport_->bytes_out() - before;
  });
}

Status Service::Run(const std::atomic<bool>* stop) {
  {
    absl::MutexLock lock(&mu_);
    for (const JobRecord& r : store_.List()) {
      if (r.state == JobState::kRunning) {
        spdlog::info("job '{}' was running when the service stopped: it resumes", r.name);
      }
    }
  }
  ready_.store(true);
  int64_t next_schedule = 0;
  while (stop == nullptr || !stop->load()) {
    DrainOutbox();
    const int64_t now = clock_->NowMs();
    last_loop_ms_.store(now);
    bytes_in_.store(transport_->bytes_in());
    bytes_out_.store(transport_->bytes_out());
    refused_.store(transport_->auth_rejections());
    rate_limited_.store(transport_->rate_limited());
    cut_.store(transport_->connections_cut());
    if (now >= next_schedule) {
      absl::MutexLock lock(&mu_);
      Schedule(/*stopping=*/false);
      next_schedule = now + options_.schedule_interval_ms;
    }
    HUDDLE_ASSIGN_OR_RETURN(std::optional<transport::Inbound> in,
                            transport_->Receive(std::max<int64_t>(1, next_schedule - now)));
    if (in) {
      absl::MutexLock lock(&mu_);
      Route(*std::move(in));
    }
  }
  // Stopping: every running job stops where it is and stays `running` on disk, so that the next
  // start resumes it. Their last sends are still carried while they wind down.
  ready_.store(false);
  {
    absl::MutexLock lock(&mu_);
    spdlog::info("stopping: {} running jobs stop and resume at the next start", running_.size());
    for (auto& [name, job] : running_) {
      job->stop.store(true);
      job->channel->Wake();
    }
  }
  // A job stops between rounds (its checkpoint is then the state the next start resumes): its
  // messages are still routed until then.
  while (true) {
    DrainOutbox();
    {
      absl::MutexLock lock(&mu_);
      Schedule(/*stopping=*/true);
      if (running_.empty()) break;
    }
    HUDDLE_ASSIGN_OR_RETURN(std::optional<transport::Inbound> in, transport_->Receive(20));
    if (in) {
      absl::MutexLock lock(&mu_);
      Route(*std::move(in));
    }
  }
  outbox_.Close();
  return absl::OkStatus();
}

void Service::Route(transport::Inbound in) {
  auto job_peer = job_of_peer_.find(in.peer);
  if (job_peer != job_of_peer_.end()) {
    auto job = running_.find(job_peer->second);
    if (job != running_.end()) {
      job->second->channel->Deliver(std::move(in));
    } else {
      // The job ended (its Shutdown may not have reached this connection).
      Send(in.peer,
           wire::MakeMessage(wire::Shutdown{absl::StrCat("job '", job_peer->second, "' has ended")},
                             0, "service"));
      agent_of_peer_.erase(in.peer);
      job_of_peer_.erase(job_peer);
    }
    return;
  }
  if (!in.message.ok()) {
    spdlog::debug("dropping an undecodable message from {}: {}", transport::PeerName(in.peer),
                  in.message.status().message());
    return;
  }
  const wire::Message& msg = *in.message;
  if (msg.type() == wire::MessageType::kJoin) {
    const auto& join = std::get<wire::Join>(msg.body);
    if (join.job.empty()) {
      OnSessionJoin(in, join);
    } else {
      wire::Join copy = join;  // `in` moves on to the job
      OnJobJoin(std::move(in), copy);
    }
    return;
  }
  // A session's heartbeat keeps its agent live.
  if (auto session = agent_of_session_.find(in.peer); session != agent_of_session_.end()) {
    agents_[session->second].last_seen_ms = clock_->NowMs();
    if (msg.type() == wire::MessageType::kHeartbeat) {
      Send(in.peer, wire::MakeMessage(wire::Heartbeat{}, 0, "service"));
    }
    return;
  }
  Send(in.peer, wire::MakeError(wire::ErrorCode::kUnknownClient,
                                "this connection has not joined (send Join first)"));
}

void Service::OnSessionJoin(const transport::Inbound& in, const wire::Join& join) {
  StatusOr<std::string> id = AgentId(in, join, transport_->authenticates());
  if (!id.ok()) {
    Send(in.peer,
         wire::MakeError(absl::IsPermissionDenied(id.status()) ? wire::ErrorCode::kAuthRefused
                                                               : wire::ErrorCode::kRejected,
                         std::string(id.status().message())));
    return;
  }
  if (agents_.size() >= kMaxAgents && agents_.count(*id) == 0) {
    Send(in.peer, wire::MakeError(wire::ErrorCode::kRejected, "the service holds too many agents"));
    return;
  }
  std::vector<std::string> datasets;
  for (const std::string& d : join.datasets) {
    if (wire::IsValidClientId(d)) datasets.push_back(d);
  }
  Agent& agent = agents_[*id];
  const bool first = agent.session.empty();
  const bool same = agent.session == in.peer;
  if (!same) agent_of_session_.erase(agent.session);
  agent_of_session_[in.peer] = *id;
  agent.session = in.peer;
  agent.datasets = std::move(datasets);
  agent.version = join.agent_version;
  agent.last_seen_ms = clock_->NowMs();
  if (!same) agent.connected_at = now_iso_();
  if (!same) {
    spdlog::info("agent {} {} (data sets: {})", *id, first ? "connected" : "reconnected",
                 agent.datasets.empty() ? "none" : absl::StrJoin(agent.datasets, ", "));
  }
  wire::Welcome welcome;
  welcome.heartbeat_interval_ms = static_cast<uint32_t>(options_.heartbeat_interval_ms);
  Send(in.peer, wire::MakeMessage(std::move(welcome), 0, "service"));
  agent.offered_at_ms = -1;  // a job it was offered is offered again at once
}

void Service::OnJobJoin(transport::Inbound in, const wire::Join& join) {
  StatusOr<std::string> id = AgentId(in, join, transport_->authenticates());
  auto job = running_.find(join.job);
  if (!id.ok() || job == running_.end()) {
    // Not running (queued, ended, or unknown): the agent's part in it ends; an offer follows when
    // the job runs.
    Send(in.peer,
         wire::MakeMessage(wire::Shutdown{id.ok() ? absl::StrCat("job '", join.job.substr(0, 64),
                                                                 "' is not running")
                                                  : std::string(id.status().message())},
                           0, "service"));
    return;
  }
  if (agents_.size() >= kMaxAgents && agents_.count(*id) == 0) {
    Send(in.peer, wire::MakeError(wire::ErrorCode::kRejected, "the service holds too many agents"));
    return;
  }
  Agent& agent = agents_[*id];
  if (!agent.job.empty() && agent.job != join.job) {
    Send(in.peer, wire::MakeMessage(
                      wire::Shutdown{absl::StrCat("agent ", *id, " is in job '", agent.job,
                                                  "'; an agent takes part in one job at a time")},
                      0, "service"));
    return;
  }
  agent.job = join.job;
  agent.joined = true;
  job_of_peer_[in.peer] = join.job;
  agent_of_peer_[in.peer] = *id;
  job->second->channel->Deliver(std::move(in));
}

void Service::Offer() {
  // Nothing to offer (an agent's job is cleared when its job ends, Reap): an idle service does not
  // walk its agents ten times a second.
  if (running_.empty()) return;
  const int64_t now = clock_->NowMs();
  // The agents each job holds (offered or joined), counted once a pass, not once per agent.
  std::map<std::string, int64_t> assigned;
  for (const auto& [id, agent] : agents_) {
    if (!agent.job.empty()) assigned[agent.job]++;
  }
  for (auto& [id, agent] : agents_) {
    if (agent.session.empty() || now - agent.last_seen_ms > options_.agent_timeout_ms) continue;
    if (agent.joined) continue;
    if (!agent.job.empty() && running_.count(agent.job) == 0) agent.job.clear();
    if (agent.offered_at_ms >= 0 && now - agent.offered_at_ms < options_.offer_interval_ms) {
      continue;
    }
    // The job it was offered before; else, among the running jobs it has the data for, the
    // oldest that has fewer agents than it asks for, or the one with the fewest.
    const Running* pick = nullptr;
    if (!agent.job.empty()) {
      pick = running_.at(agent.job).get();
    } else {
      const Running* fewest = nullptr;
      int64_t oldest_seq = INT64_MAX;
      for (const auto& [name, job] : running_) {
        if (std::find(agent.datasets.begin(), agent.datasets.end(), job->data) ==
            agent.datasets.end()) {
          continue;
        }
        const JobRecord* r = store_.Find(name);
        const int64_t seq = r != nullptr ? static_cast<int64_t>(r->seq) : INT64_MAX;
        if (assigned[name] < job->wanted_agents && seq < oldest_seq) {
          pick = job.get();
          oldest_seq = seq;
        }
        if (fewest == nullptr || assigned[name] < assigned[fewest->name]) fewest = job.get();
      }
      if (pick == nullptr) pick = fewest;
      if (pick != nullptr) assigned[pick->name]++;
    }
    if (pick == nullptr) continue;
    agent.job = pick->name;
    agent.offered_at_ms = now;
    Send(agent.session, wire::MakeMessage(wire::JobOffer{pick->name, pick->data}, 0, "service"));
  }
}

void Service::Schedule(bool stopping) {
  for (auto it = running_.begin(); it != running_.end();) {
    if (it->second->finished.load()) {
      Reap(*it->second, stopping);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  if (stopping) return;
  while (static_cast<int64_t>(running_.size()) < options_.max_concurrent_jobs) {
    std::vector<std::string> names;
    for (const auto& [name, job] : running_) names.push_back(name);
    std::optional<JobRecord> next = store_.Next(names);
    if (!next) break;
    StartJob(*next);
  }
  Offer();
}

void Service::StartJob(const JobRecord& record) {
  JobRecord r = record;
  std::error_code ec;
  const bool resume =
      std::filesystem::exists(store_.OutDir(r.name) + "/checkpoint.bin", ec) && r.starts > 0;
  StatusOr<PreparedJob> prepared =
      preparer_(r.name, store_.ConfigPath(r.name), store_.OutDir(r.name), resume);
  r.starts += 1;
  r.started_at = now_iso_();
  if (!prepared.ok()) {
    r.state = JobState::kFailed;
    r.finished_at = r.started_at;
    r.reason = std::string(prepared.status().message());
    spdlog::error("job '{}' cannot start: {}", r.name, r.reason);
    if (Status st = store_.Update(r); !st.ok()) spdlog::error("job '{}': {}", r.name, st.message());
    return;
  }
  r.state = JobState::kRunning;
  if (Status st = store_.Update(r); !st.ok()) {
    spdlog::error("job '{}': cannot record its start: {}", r.name, st.message());
    return;
  }
  auto job = std::make_unique<Running>();
  job->name = r.name;
  job->data = prepared->data;
  job->rounds = prepared->rounds;
  job->wanted_agents = std::max<int64_t>(1, prepared->wanted_agents);
  job->channel = std::make_unique<JobChannel>(&outbox_);
  job->channel->set_authenticates(transport_->authenticates());
  Running* j = job.get();
  const std::string log_path = store_.LogPath(r.name);
  spdlog::info("job '{}' {} ({} rounds on data set '{}')", r.name,
               resume ? "resumes from its checkpoint" : "starts", j->rounds, j->data);
  j->thread = std::thread([this, j, run = std::move(prepared->run), log_path] {
    JobLogScope scope(j->name, log_path);
    Status st = run(j->channel.get(), &j->stop,
                    [this, j](const std::string& public_row, const std::string& operator_row) {
                      if (metrics_ != nullptr) metrics_->OnRound(j->name, public_row, operator_row);
                      absl::MutexLock lock(&rows_mu_);
                      last_rows_[j->name] = public_row;
                    });
    j->result = st;
    j->finished.store(true);
    transport_->Wake();
  });
  if (metrics_ != nullptr) metrics_->OnJobStart(r.name, j->rounds);
  running_[r.name] = std::move(job);
}

void Service::Reap(Running& job, bool stopping) {
  job.thread.join();
  if (metrics_ != nullptr) metrics_->OnJobEnd(job.name);
  const JobRecord* found = store_.Find(job.name);
  if (found == nullptr) return;
  JobRecord r = *found;
  const Status& st = job.result;
  const bool interrupted = absl::IsCancelled(st) && !r.stop_requested && stopping;
  if (!interrupted) {
    r.finished_at = now_iso_();
    if (st.ok()) {
      r.state = JobState::kCompleted;
      r.reason.clear();
    } else if (absl::IsCancelled(st) && r.stop_requested) {
      r.state = JobState::kStopped;
      r.reason = "stopped by an operator";
    } else {
      r.state = JobState::kFailed;
      r.reason = std::string(st.message());
    }
    spdlog::info("job '{}' {}{}{}", r.name, JobStateName(r.state), r.reason.empty() ? "" : ": ",
                 r.reason);
    if (Status w = store_.Update(r); !w.ok()) spdlog::error("job '{}': {}", r.name, w.message());
  }
  // Its agents are free again; connections still in the job are told it ended (a job that
  // completed told them itself), unless the service is stopping and the job will resume.
  for (auto it = job_of_peer_.begin(); it != job_of_peer_.end();) {
    if (it->second != job.name) {
      ++it;
      continue;
    }
    if (!interrupted && r.state != JobState::kCompleted) {
      Send(it->first, wire::MakeMessage(wire::Shutdown{absl::StrCat("job '", job.name, "' ",
                                                                    JobStateName(r.state))},
                                        0, "service"));
    }
    agent_of_peer_.erase(it->first);
    it = job_of_peer_.erase(it);
  }
  for (auto& [id, agent] : agents_) {
    if (agent.job == job.name) {
      agent.job.clear();
      agent.joined = false;
      agent.offered_at_ms = -1;
    }
  }
}

StatusOr<JobRecord> Service::Submit(const std::string& name, const std::string& submitted,
                                    const std::string& resolved, const std::string& operator_id) {
  absl::MutexLock lock(&mu_);
  HUDDLE_ASSIGN_OR_RETURN(JobRecord r,
                          store_.Create(name, submitted, resolved, operator_id, now_iso_()));
  transport_->Wake();  // the scheduler looks at once
  return r;
}

Status Service::Discard(const std::string& name) {
  absl::MutexLock lock(&mu_);
  return store_.Discard(name);
}

StatusOr<JobRecord> Service::Stop(const std::string& name, const std::string& operator_id) {
  absl::MutexLock lock(&mu_);
  const JobRecord* found = store_.Find(name);
  if (found == nullptr) return absl::NotFoundError(absl::StrCat("no job named '", name, "'"));
  JobRecord r = *found;
  if (IsFinished(r.state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", name, "' has already ", JobStateName(r.state)));
  }
  r.stop_requested = true;
  auto running = running_.find(name);
  if (running == running_.end()) {
    r.state = JobState::kStopped;
    r.finished_at = now_iso_();
    r.reason = absl::StrCat("stopped by operator ", operator_id, " before it started");
  }
  HUDDLE_RETURN_IF_ERROR(store_.Update(r));
  if (running != running_.end()) {
    running->second->stop.store(true);
    running->second->channel->Wake();
  }
  return r;
}

std::vector<JobView> Service::Jobs() const {
  std::vector<JobView> out;
  std::vector<std::pair<size_t, std::string>> to_read;  // rows to read from disk, unlocked
  {
    absl::MutexLock lock(&mu_);
    for (const JobRecord& r : store_.List()) {
      JobView v;
      v.record = r;
      if (auto it = running_.find(r.name); it != running_.end()) {
        v.planned_rounds = it->second->rounds;
      }
      for (const auto& [id, agent] : agents_) {
        if (agent.job == r.name && agent.joined) v.agents.push_back(id);
      }
      {
        absl::MutexLock rows(&rows_mu_);
        if (auto it = last_rows_.find(r.name); it != last_rows_.end()) {
          v.last_round_row = it->second;
        }
      }
      // A job of an earlier run of the service: its last row from its metrics (the public
      // file), read once the lock is released (the dispatcher never waits on a disk read).
      if (v.last_round_row.empty() && r.starts > 0) {
        to_read.emplace_back(out.size(), store_.OutDir(r.name) + "/metrics.jsonl");
      }
      out.push_back(std::move(v));
    }
  }
  for (const auto& [i, path] : to_read) out[i].last_round_row = LastLine(path);
  return out;
}

StatusOr<JobView> Service::Job(const std::string& name) const {
  for (JobView& v : Jobs()) {
    if (v.record.name == name) return std::move(v);
  }
  return absl::NotFoundError(absl::StrCat("no job named '", name, "'"));
}

std::vector<AgentView> Service::Agents() const {
  std::vector<AgentView> out;
  absl::MutexLock lock(&mu_);
  const int64_t now = clock_->NowMs();
  for (const auto& [id, agent] : agents_) {
    AgentView v;
    v.id = id;
    v.last_seen_ms_ago = now - agent.last_seen_ms;
    v.live = !agent.session.empty() && v.last_seen_ms_ago <= options_.agent_timeout_ms;
    v.connected_at = agent.connected_at;
    v.datasets = agent.datasets;
    v.job = agent.joined ? agent.job : "";
    v.version = agent.version;
    out.push_back(std::move(v));
  }
  return out;
}

ServiceCounts Service::Counts() const {
  ServiceCounts c;
  for (JobState st : {JobState::kQueued, JobState::kRunning, JobState::kCompleted,
                      JobState::kFailed, JobState::kStopped}) {
    c.jobs_by_state[JobStateName(st)] = 0;
  }
  {
    absl::MutexLock lock(&mu_);
    for (const JobRecord& r : store_.List()) c.jobs_by_state[JobStateName(r.state)]++;
    const int64_t now = clock_->NowMs();
    for (const auto& [id, agent] : agents_) {
      ++c.agents_known;
      if (!agent.session.empty() && now - agent.last_seen_ms <= options_.agent_timeout_ms) {
        ++c.agents_live;
      }
    }
  }
  c.bytes_in = bytes_in_.load();
  c.bytes_out = bytes_out_.load();
  c.handshakes_refused = refused_.load();
  c.rate_limited = rate_limited_.load();
  c.connections_cut = cut_.load();
  return c;
}

std::string Service::LogPath(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return store_.LogPath(name);
}

std::string Service::OutDir(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return store_.OutDir(name);
}

}  // namespace huddle::service
