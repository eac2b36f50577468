// Client-level DP with buffered asynchronous training (coordinator/async_round.h,
// coordinator/contributions.h, privacy/budget.h's max_participations): the participation bound,
// its durable record across a resume, the accounting of the worst client, what the report says,
// and the options that cannot hold.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/contributions.h"
#include "coordinator/coordinator.h"
#include "privacy/accountant.h"
#include "tests/coordinator/fake_federation.h"
#include "tests/coordinator/run_job.h"
#include "tests/testing/temp_dir.h"

namespace huddle::coordinator {
namespace {

using testing::Behaviour;
using testing::SyntheticClient;

constexpr double kZ = 2;
constexpr double kDelta = 1e-5;

CoordinatorOptions AsyncDpJob(const std::string& out, int64_t steps, int64_t most,
                              int64_t separation) {
  CoordinatorOptions o;
  o.job_name = "async-dp";
  o.seed = 5;
  o.rounds = steps;
  o.model = models::MlpSpec{6, {5}, 3};
  o.min_clients = 1;
  o.upload_slots = 2;
  o.round_deadline_ms = 60'000;
  o.client_timeout_ms = 0;
  o.eval_every = 0;
  o.async.enabled = true;
  o.async.concurrency = 3;
  o.async.buffer = 2;
  o.privacy.mode = privacy::PrivacyMode::kCentral;
  o.privacy.clip_norm = 1.0;
  o.privacy.delta = kDelta;
  privacy::ScheduleRange all;
  all.first_round = 1;
  all.last_round = steps;
  all.noise_multiplier = kZ;
  o.privacy.schedule = {all};
  o.privacy.max_participations = most;
  o.privacy.min_separation = separation;
  o.privacy.noise_seed = 9;  // reproducible (not private: the test reads the releases)
  o.out_dir = out;
  return o;
}

std::vector<SyntheticClient> Honest(int n) {
  std::vector<SyntheticClient> out;
  for (int i = 0; i < n; ++i) out.push_back({"c" + std::to_string(i), Behaviour::kHonest, 100});
  return out;
}

// OUT/contributions.jsonl: each client's steps, in order.
std::map<std::string, std::vector<uint64_t>> ReadContributions(const std::string& out) {
  std::map<std::string, std::vector<uint64_t>> steps;
  std::ifstream in(std::filesystem::path(out) / kContributionsFile);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    for (const auto& id : j["clients"]) steps[id].push_back(j["step"]);
  }
  return steps;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(AsyncPrivacyTest, NoClientContributesMoreThanTheBoundOrCloserThanTheSeparation) {
  testing::TempDirs dirs;
  const std::string out = dirs.Make("async_dp", false);
  // 6 clients x 3 contributions = 18 updates = 9 steps of 2; the job asks for 30.
  const testing::JobRun job = testing::RunJob(AsyncDpJob(out, 30, 3, 2), {.clients = Honest(6)});
  ASSERT_TRUE(job.status.ok()) << job.status;
  EXPECT_TRUE(job.summary.failure.empty()) << job.summary.failure;
  // It stops when no client may contribute again: not a failure.
  EXPECT_NE(job.summary.stop_reason.find("max_participations (3)"), std::string::npos)
      << job.summary.stop_reason;
  const auto steps = ReadContributions(out);
  ASSERT_EQ(steps.size(), 6u);
  for (const auto& [id, s] : steps) {
    EXPECT_LE(s.size(), 3u) << id;
    for (size_t i = 1; i < s.size(); ++i) EXPECT_GE(s[i], s[i - 1] + 2) << id;
  }
  for (const RoundMetrics& m : job.metrics) {
    EXPECT_LE(m.results, 2) << m.round;
    ASSERT_TRUE(m.privacy.has_value());
    // The public row says what ran (the settings); what the step saw is operator-only.
    const nlohmann::json pub = nlohmann::json::parse(m.PublicJson());
    EXPECT_EQ(pub["async"]["buffer"], 2);
    EXPECT_FALSE(pub["async"].contains("staleness_mean"));
    EXPECT_TRUE(nlohmann::json::parse(m.OperatorJson())["async"].contains("staleness_mean"));
  }
  // The ledger: one unsampled replace-one release per step.
  std::ifstream ledger(std::filesystem::path(out) / "privacy_ledger.jsonl");
  int entries = 0;
  for (std::string line; std::getline(ledger, line); ++entries) {
    const nlohmann::json e = nlohmann::json::parse(line);
    EXPECT_EQ(e["sampling_rate"], 1.0);
    EXPECT_EQ(e["adjacency"], "replace_one");
    EXPECT_EQ(e["noise_multiplier"], kZ);
  }
  EXPECT_EQ(entries, static_cast<int>(job.metrics.size()));
  // The job's epsilon is the worst client's: 3 releases of the Gaussian mechanism with
  // multiplier z / 2 (replace-one), i.e. mu = sqrt(3) * 2 / z, exactly.
  ASSERT_TRUE(job.summary.epsilon.has_value());
  const privacy::DpEvent three{1.0, kZ / 2, 3};
  const auto expected =
      privacy::ComputeEpsilon(std::vector{three}, kDelta, privacy::AccountantKind::kAnalytic);
  ASSERT_TRUE(expected.ok());
  EXPECT_NEAR(*job.summary.epsilon, expected->epsilon, 1e-9);
  const nlohmann::json report = ReadJson(out + "/privacy.json");
  EXPECT_EQ(report["adjacency"], "replace_one");
  EXPECT_EQ(report["participation"]["max_participations"], 3);
  EXPECT_EQ(report["participation"]["min_separation"], 2);
  EXPECT_NE(report["mechanism"].get<std::string>().find("asynchronous"), std::string::npos);
  EXPECT_NE(report["sampling"].get<std::string>().find("no amplification"), std::string::npos);
}

TEST(AsyncPrivacyTest, AResumeCountsTheContributionsOfTheRunBefore) {
  testing::TempDirs dirs;
  const std::string out = dirs.Make("async_dp_resume", false);
  CoordinatorOptions o = AsyncDpJob(out, 4, 2, 1);
  const testing::JobRun first = testing::RunJob(o, {.clients = Honest(4)});
  ASSERT_TRUE(first.status.ok()) << first.status;
  ASSERT_EQ(first.metrics.size(), 4u);  // 4 clients x 2 = 8 updates = 4 steps: all spent
  o.rounds = 10;
  o.resume = true;
  o.privacy.schedule[0].last_round = 10;
  const testing::JobRun second = testing::RunJob(o, {.clients = Honest(4)});
  ASSERT_TRUE(second.status.ok()) << second.status;
  // Every client already contributed twice: nothing more may run.
  EXPECT_TRUE(second.metrics.empty());
  EXPECT_NE(second.summary.stop_reason.find("max_participations"), std::string::npos);
  for (const auto& [id, s] : ReadContributions(out)) EXPECT_LE(s.size(), 2u) << id;
}

TEST(AsyncPrivacyTest, AResumeWhoseContributionsWereLostIsRefused) {
  testing::TempDirs dirs;
  const std::string out = dirs.Make("async_dp_lost", false);
  CoordinatorOptions o = AsyncDpJob(out, 2, 5, 1);
  ASSERT_TRUE(testing::RunJob(o, {.clients = Honest(4)}).status.ok());
  std::filesystem::remove(std::filesystem::path(out) / kContributionsFile);
  o.rounds = 4;
  o.resume = true;
  o.privacy.schedule[0].last_round = 4;
  const testing::JobRun again = testing::RunJob(o, {.clients = Honest(4)});
  EXPECT_TRUE(absl::IsDataLoss(again.status)) << again.status;
  EXPECT_NE(again.status.message().find("contributions.jsonl"), std::string_view::npos);
}

TEST(AsyncPrivacyTest, TheRecordDropsATornLineAndRefusesAForeignOne) {
  testing::TempDirs dirs;
  const std::string out = dirs.Make("contributions");
  {
    auto c = Contributions::Open(out, false, 2, 3, 0);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->MaySend("a", 1));
    c->Contributed("a", 1);
    EXPECT_FALSE(c->MaySend("a", 3));  // within 3 steps of its last
    EXPECT_TRUE(c->MaySend("a", 4));
    c->Contributed("a", 4);
    EXPECT_FALSE(c->MaySend("a", 100));  // twice: its bound
    ASSERT_TRUE(c->Record(1, {"a", "b"}).ok());
    ASSERT_TRUE(c->Record(4, {"a"}).ok());
  }
  const std::string path = out + "/" + kContributionsFile;
  {
    std::ofstream torn(path, std::ios::app);
    torn << R"({"step":5,"clients":["b")";  // a crash cut the append
  }
  {
    auto c = Contributions::Open(out, true, 2, 1, 2);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_FALSE(c->MaySend("a", 100));
    EXPECT_TRUE(c->MaySend("b", 2));
    EXPECT_EQ(c->most(), 2);
    ASSERT_TRUE(c->Record(6, {"b"}).ok());  // starts on a line of its own
  }
  {
    auto c = Contributions::Open(out, true, 2, 1, 3);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_FALSE(c->MaySend("b", 100));
  }
  // More releases in the ledger than lines here: lost lines.
  EXPECT_TRUE(absl::IsDataLoss(Contributions::Open(out, true, 2, 1, 4).status()));
  {
    std::ofstream bad(path, std::ios::app);
    bad << "{\"step\":7,\"clients\":[3]}\n";
  }
  const auto refused = Contributions::Open(out, true, 2, 1, 0);
  EXPECT_TRUE(absl::IsDataLoss(refused.status()));
  EXPECT_NE(refused.status().message().find(":4:"), std::string_view::npos) << refused.status();
}

TEST(AsyncPrivacyTest, OptionsThatCannotHoldAreRefused) {
  const auto refused = [](const CoordinatorOptions& o, const char* key) {
    const Status st = ValidateOptions(o);
    EXPECT_FALSE(st.ok()) << key;
    EXPECT_NE(st.message().find(key), std::string_view::npos) << st.message();
  };
  CoordinatorOptions o = AsyncDpJob("", 3, 2, 1);
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
  o.privacy.max_participations.reset();
  refused(o, "privacy.max_participations");
  o = AsyncDpJob("", 3, 2, 1);
  o.privacy.expected_cohort_size = 10;
  refused(o, "privacy.expected_cohort_size");
  o = AsyncDpJob("", 3, 2, 1);
  o.privacy.mode = privacy::PrivacyMode::kDistributed;
  refused(o, "distributed");
  o = AsyncDpJob("", 3, 2, 1);
  o.privacy.schedule[0].clip_norm = 2.0;
  refused(o, "clip_norm");
  o = AsyncDpJob("", 3, 2, 1);
  o.async.enabled = false;
  refused(o, "privacy.max_participations");
  // The plan: a bounded one needs central or local, and no adaptive clipping.
  o = AsyncDpJob("", 3, 2, 1);
  o.privacy.adaptive.enabled = true;
  EXPECT_FALSE(privacy::PrivacyPlan::Create(o.privacy, 1, 3).ok());
  o = AsyncDpJob("", 3, 0, 1);
  EXPECT_FALSE(privacy::PrivacyPlan::Create(o.privacy, 1, 3).ok());
}

}  // namespace
}  // namespace huddle::coordinator
