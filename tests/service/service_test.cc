// The service's dispatcher and scheduler over a fake transport: agents' sessions, offers, jobs
// joined on connections of their own, jobs back to back, stops, and a restart that resumes.
#include "service/service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "tests/testing/temp_dir.h"

namespace huddle::service {
namespace {

using std::chrono::milliseconds;

// A ServerTransport whose inbound messages the test injects and whose sends it reads.
class FakeTransport final : public transport::ServerTransport {
 public:
  void Inject(const transport::PeerId& peer, wire::Message msg, std::string auth_id = "") {
    absl::MutexLock lock(&mu_);
    transport::Inbound in;
    in.peer = peer;
    in.auth_id = std::move(auth_id);
    in.message = std::move(msg);
    in.wire_bytes = 100;
    inbox_.push_back(std::move(in));
  }
  // The first message sent to `peer` of `type` since the last Take, waiting up to 10 s.
  std::optional<wire::Message> Take(const transport::PeerId& peer, wire::MessageType type) {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (true) {
      for (auto it = sent_.begin(); it != sent_.end(); ++it) {
        if (it->first == peer && it->second.type() == type) {
          wire::Message m = std::move(it->second);
          sent_.erase(it);
          return m;
        }
      }
      if (cv_.WaitWithDeadline(&mu_, deadline)) return std::nullopt;
    }
  }

  int Count(const transport::PeerId& peer, wire::MessageType type) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& [p, m] : sent_) n += p == peer && m.type() == type;
    return n;
  }

  Status Send(const transport::PeerId& peer, const wire::Message& msg) override {
    absl::MutexLock lock(&mu_);
    sent_.emplace_back(peer, msg);
    bytes_out_ += 10;
    cv_.SignalAll();
    return absl::OkStatus();
  }
  StatusOr<std::optional<transport::Inbound>> Receive(int64_t timeout_ms) override {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
    while (inbox_.empty() && !woken_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    woken_ = false;
    if (inbox_.empty()) return std::optional<transport::Inbound>();
    transport::Inbound in = std::move(inbox_.front());
    inbox_.pop_front();
    return std::optional<transport::Inbound>(std::move(in));
  }
  void Wake() override {
    absl::MutexLock lock(&mu_);
    woken_ = true;
    cv_.SignalAll();
  }
  uint64_t bytes_in() const override { return 0; }
  uint64_t bytes_out() const override {
    absl::MutexLock lock(&mu_);
    return bytes_out_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<transport::Inbound> inbox_;
  std::deque<std::pair<transport::PeerId, wire::Message>> sent_;
  bool woken_ = false;
  uint64_t bytes_out_ = 0;
};

wire::Message SessionJoin(const std::string& id, std::vector<std::string> datasets) {
  wire::Join j;
  j.client_id = id;
  j.datasets = std::move(datasets);
  return wire::MakeMessage(std::move(j));
}
wire::Message JobJoin(const std::string& id, const std::string& job) {
  wire::Join j;
  j.client_id = id;
  j.job = job;
  j.num_examples = 10;
  return wire::MakeMessage(std::move(j));
}

// A job that welcomes each client that joins it, then (once `clients` joined) shuts them down and
// ends; or, with `until_stopped`, waits for its stop.
struct FakeJob {
  int clients = 1;
  bool until_stopped = false;
};

class ServiceTest : public ::testing::Test {
 protected:
  void Start() {
    auto store = JobStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    ServiceOptions o;
    o.schedule_interval_ms = 10;
    o.offer_interval_ms = 200;
    o.max_concurrent_jobs = max_concurrent_jobs_;
    service_ = std::make_unique<Service>(
        o, *std::move(store), &transport_, SteadyClock::Get(),
        [this](const std::string& name, const std::string&, const std::string&,
               bool resume) -> StatusOr<PreparedJob> {
          {
            absl::MutexLock lock(&mu_);
            resumed_.push_back(resume);
          }
          if (name.rfind("bad", 0) == 0) return absl::InvalidArgumentError("data.name is missing");
          const FakeJob spec = name.rfind("long", 0) == 0 ? FakeJob{1, true} : FakeJob{};
          PreparedJob p;
          p.data = "fm";
          p.rounds = 3;
          p.run = [spec](transport::ServerTransport* t, const std::atomic<bool>* stop,
                         const PreparedJob::RoundRows& on_round) -> Status {
            std::vector<transport::PeerId> joined;
            while (!stop->load()) {
              auto in = t->Receive(20);
              if (!in.ok()) return in.status();
              if (*in && (*in)->message.ok() &&
                  (*in)->message->type() == wire::MessageType::kJoin) {
                joined.push_back((*in)->peer);
                HUDDLE_RETURN_IF_ERROR(t->Send((*in)->peer, wire::MakeMessage(wire::Welcome{})));
                on_round("{\"round\":1}", "{\"round\":1,\"results\":1}");
              }
              if (!spec.until_stopped && static_cast<int>(joined.size()) >= spec.clients) {
                for (const auto& peer : joined) {
                  HUDDLE_RETURN_IF_ERROR(
                      t->Send(peer, wire::MakeMessage(wire::Shutdown{"job complete"})));
                }
                return absl::OkStatus();
              }
            }
            return absl::CancelledError("stopped");
          };
          return p;
        },
        [] { return std::string("2026-11-28T00:00:00.000Z"); });
    thread_ = std::thread([this] { ASSERT_TRUE(service_->Run(&stop_).ok()); });
  }
  void StopService() {
    stop_.store(true);
    transport_.Wake();
    if (thread_.joinable()) thread_.join();
    service_.reset();
    stop_.store(false);
  }
  void TearDown() override { StopService(); }

  JobState WaitForState(const std::string& job, JobState want) {
    JobState st = JobState::kQueued;
    for (int i = 0; i < 500; ++i) {
      auto v = service_->Job(job);
      if (v.ok()) st = v->record.state;
      if (st == want) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return st;
  }
  void Submit(const std::string& name) {
    ASSERT_TRUE(service_->Submit(name, "name: " + name + "\n", "name: " + name + "\n", "op").ok());
  }

  huddle::testing::ScopedTempDir tmp_{"service"};
  std::string dir_ = tmp_.path();
  FakeTransport transport_;
  std::unique_ptr<Service> service_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<bool> resumed_;
  int64_t max_concurrent_jobs_ = 1;
};

TEST_F(ServiceTest, AnAgentTakesPartInTwoJobsBackToBack) {
  Start();
  transport_.Inject("s1", SessionJoin("a1", {"fm", "other"}));
  ASSERT_TRUE(transport_.Take("s1", wire::MessageType::kWelcome));
  for (const std::string job : {"first", "second"}) {
    SCOPED_TRACE(job);
    Submit(job);
    auto offer = transport_.Take("s1", wire::MessageType::kJobOffer);
    ASSERT_TRUE(offer);
    EXPECT_EQ(std::get<wire::JobOffer>(offer->body).job, job);
    EXPECT_EQ(std::get<wire::JobOffer>(offer->body).data, "fm");
    const std::string peer = "j-" + job;
    transport_.Inject(peer, JobJoin("a1", job));
    ASSERT_TRUE(transport_.Take(peer, wire::MessageType::kWelcome)) << "the job's own Welcome";
    ASSERT_TRUE(transport_.Take(peer, wire::MessageType::kShutdown));
    EXPECT_EQ(WaitForState(job, JobState::kCompleted), JobState::kCompleted);
  }
  const auto agents = service_->Agents();
  ASSERT_EQ(agents.size(), 1u);
  EXPECT_TRUE(agents[0].live);
  EXPECT_EQ(agents[0].job, "");
  EXPECT_EQ(service_->Job("first")->last_round_row, "{\"round\":1}");
}

TEST_F(ServiceTest, OffersGoOnlyToAgentsDeclaringTheJobsData) {
  Start();
  transport_.Inject("s1", SessionJoin("a1", {"other"}));
  transport_.Inject("s2", SessionJoin("a2", {"fm"}));
  ASSERT_TRUE(transport_.Take("s2", wire::MessageType::kWelcome));
  Submit("j");
  ASSERT_TRUE(transport_.Take("s2", wire::MessageType::kJobOffer));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(transport_.Count("s1", wire::MessageType::kJobOffer), 0);
  transport_.Inject("p2", JobJoin("a2", "j"));
  ASSERT_TRUE(transport_.Take("p2", wire::MessageType::kShutdown));
  EXPECT_EQ(WaitForState("j", JobState::kCompleted), JobState::kCompleted);
}

TEST_F(ServiceTest, AJoinForAJobThatIsNotRunningIsToldSo) {
  Start();
  transport_.Inject("p", JobJoin("a1", "nope"));
  auto shutdown = transport_.Take("p", wire::MessageType::kShutdown);
  ASSERT_TRUE(shutdown);
  EXPECT_NE(std::get<wire::Shutdown>(shutdown->body).reason.find("is not running"),
            std::string::npos)
      << std::get<wire::Shutdown>(shutdown->body).reason;
  // Messages of connections that never joined are refused with unknown_client.
  transport_.Inject("q", wire::MakeMessage(wire::Heartbeat{}));
  auto err = transport_.Take("q", wire::MessageType::kError);
  ASSERT_TRUE(err);
  EXPECT_EQ(std::get<wire::Error>(err->body).code, wire::ErrorCode::kUnknownClient);
}

TEST_F(ServiceTest, AJobThatCannotBePreparedFailsAndTheQueueGoesOn) {
  Start();
  Submit("bad-job");
  Submit("good");
  EXPECT_EQ(WaitForState("bad-job", JobState::kFailed), JobState::kFailed);
  EXPECT_EQ(service_->Job("bad-job")->record.reason, "data.name is missing");
  transport_.Inject("s1", SessionJoin("a1", {"fm"}));
  ASSERT_TRUE(transport_.Take("s1", wire::MessageType::kJobOffer));
  transport_.Inject("p1", JobJoin("a1", "good"));
  EXPECT_EQ(WaitForState("good", JobState::kCompleted), JobState::kCompleted);
}

TEST_F(ServiceTest, AnOperatorStopEndsAJobForGoodAndItsAgentsAreToldSo) {
  Start();
  transport_.Inject("s1", SessionJoin("a1", {"fm"}));
  Submit("long-1");
  Submit("queued");
  ASSERT_TRUE(transport_.Take("s1", wire::MessageType::kJobOffer));
  transport_.Inject("p1", JobJoin("a1", "long-1"));
  ASSERT_TRUE(transport_.Take("p1", wire::MessageType::kWelcome));
  auto stopped = service_->Stop("queued", "alice");
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->state, JobState::kStopped);
  ASSERT_TRUE(service_->Stop("long-1", "alice").ok());
  EXPECT_EQ(WaitForState("long-1", JobState::kStopped), JobState::kStopped);
  ASSERT_TRUE(transport_.Take("p1", wire::MessageType::kShutdown));
  EXPECT_TRUE(absl::IsFailedPrecondition(service_->Stop("long-1", "alice").status()));
  EXPECT_TRUE(absl::IsNotFound(service_->Stop("none", "alice").status()));
}

TEST_F(ServiceTest, ARestartResumesTheJobThatWasRunningAndKeepsTheQueue) {
  Start();
  transport_.Inject("s1", SessionJoin("a1", {"fm"}));
  Submit("long-job");
  Submit("next");
  ASSERT_TRUE(transport_.Take("s1", wire::MessageType::kJobOffer));
  transport_.Inject("p1", JobJoin("a1", "long-job"));
  ASSERT_TRUE(transport_.Take("p1", wire::MessageType::kWelcome));
  // The job wrote a checkpoint; then the service stops (SIGTERM) and starts again.
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/jobs/long-job/out/checkpoint.bin", "x").ok());
  StopService();
  {
    auto store = JobStore::Open(dir_);
    EXPECT_EQ(store->Find("long-job")->state, JobState::kRunning) << "it resumes at the next start";
    EXPECT_EQ(store->Find("next")->state, JobState::kQueued);
  }
  Start();
  transport_.Inject("s1b", SessionJoin("a1", {"fm"}));
  auto offer = transport_.Take("s1b", wire::MessageType::kJobOffer);
  ASSERT_TRUE(offer);
  EXPECT_EQ(std::get<wire::JobOffer>(offer->body).job, "long-job");
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(resumed_.size(), 2u);
  EXPECT_FALSE(resumed_[0]);
  EXPECT_TRUE(resumed_[1]) << "started again from its checkpoint";
}

TEST_F(ServiceTest, ConcurrentJobsRunAtOnceOnDisjointAgents) {
  max_concurrent_jobs_ = 2;
  Start();
  transport_.Inject("s1", SessionJoin("a1", {"fm"}));
  transport_.Inject("s2", SessionJoin("a2", {"fm"}));
  ASSERT_TRUE(transport_.Take("s1", wire::MessageType::kWelcome));
  ASSERT_TRUE(transport_.Take("s2", wire::MessageType::kWelcome));
  Submit("long-x");
  Submit("long-y");
  auto o1 = transport_.Take("s1", wire::MessageType::kJobOffer);
  auto o2 = transport_.Take("s2", wire::MessageType::kJobOffer);
  ASSERT_TRUE(o1 && o2);
  const std::string j1 = std::get<wire::JobOffer>(o1->body).job;
  const std::string j2 = std::get<wire::JobOffer>(o2->body).job;
  EXPECT_NE(j1, j2) << "each agent is in one job at a time";
  transport_.Inject("p1", JobJoin("a1", j1));
  transport_.Inject("p2", JobJoin("a2", j2));
  ASSERT_TRUE(transport_.Take("p1", wire::MessageType::kWelcome));
  ASSERT_TRUE(transport_.Take("p2", wire::MessageType::kWelcome));
  EXPECT_EQ(WaitForState("long-x", JobState::kRunning), JobState::kRunning);
  EXPECT_EQ(WaitForState("long-y", JobState::kRunning), JobState::kRunning);
  // An agent already in one job cannot join the other.
  transport_.Inject("p3", JobJoin("a1", j2));
  auto refused = transport_.Take("p3", wire::MessageType::kShutdown);
  ASSERT_TRUE(refused);
  EXPECT_NE(std::get<wire::Shutdown>(refused->body).reason.find("one job at a time"),
            std::string::npos);
  ASSERT_TRUE(service_->Stop("long-x", "op").ok());
  ASSERT_TRUE(service_->Stop("long-y", "op").ok());
  EXPECT_EQ(WaitForState("long-x", JobState::kStopped), JobState::kStopped);
  EXPECT_EQ(WaitForState("long-y", JobState::kStopped), JobState::kStopped);
}

}  // namespace
}  // namespace huddle::service
