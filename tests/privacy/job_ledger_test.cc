// A job's privacy session (privacy/job_ledger.h): the fresh-start refusal, resume coverage by
// rounds and by steps, the not-private reasons and privacy.json.
#include "privacy/job_ledger.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "tests/testing/temp_dir.h"

namespace huddle::privacy {
namespace {

using ::huddle::testing::ScopedTempDir;

LedgerEntry Round(uint64_t round, double z = 1.1, std::string noise = "os-csprng") {
  return LedgerEntry::ClientGaussian(kModeCentral, round, 0.1, z, 0.5, kAddRemove,
                                     std::move(noise));
}

LedgerEntry Epoch(uint64_t epoch, int64_t steps, double z = 1.1, std::string noise = "os-csprng") {
  return LedgerEntry::DpSgdSteps(epoch, DpEvent{0.01, z, steps}, 1.0, std::move(noise));
}

// A job's ledger in `dir` with `entries` appended by an earlier run.
void EarlierRun(const std::string& dir, const std::vector<LedgerEntry>& entries) {
  auto job = JobLedger::Open(dir, {});
  ASSERT_TRUE(job.ok()) << job.status();
  for (const LedgerEntry& e : entries) ASSERT_TRUE(job->Append(e).ok());
}

bool Has(const Status& st, std::string_view text) {
  return std::string(st.message()).find(text) != std::string::npos;
}

TEST(JobLedgerTest, AFreshStartOverEntriesIsRefused) {
  ScopedTempDir dir("job_ledger");
  EarlierRun(dir.path(), {Round(1), Round(2)});
  auto fresh = JobLedger::Open(dir.path(), {});
  ASSERT_EQ(fresh.status().code(), absl::StatusCode::kFailedPrecondition) << fresh.status();
  EXPECT_TRUE(Has(fresh.status(), "records 2 DP releases of an earlier run")) << fresh.status();
  EXPECT_TRUE(Has(fresh.status(), "--resume")) << fresh.status();
  EXPECT_TRUE(Has(fresh.status(), "new output directory")) << fresh.status();

  auto resumed = JobLedger::Open(dir.path(), {.resume = true});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->entries().size(), 2u);
  EXPECT_EQ(resumed->path(), dir / kLedgerFile);
}

TEST(JobLedgerTest, DpSgdRefusalsCountTheSteps) {
  ScopedTempDir dir("job_ledger");
  EarlierRun(dir.path(), {Epoch(1, 300), Epoch(2, 300)});
  auto fresh = JobLedger::Open(dir.path(), {.releases = "DP-SGD", .count_steps = true});
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(fresh.status(), "records 2 DP-SGD releases (600 steps) of an earlier run"))
      << fresh.status();
}

TEST(JobLedgerTest, AFreshStartOverAnEmptyLedgerOpens) {
  ScopedTempDir dir("job_ledger");
  auto job = JobLedger::Open(dir.path(), {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->entries().empty());
  EXPECT_TRUE(job->CheckRoundsCovered(0).ok());
  EXPECT_TRUE(job->CheckStepsCovered(0, "ckpt").ok());
}

TEST(JobLedgerTest, AResumeMustBeCoveredRoundByRound) {
  ScopedTempDir dir("job_ledger");
  EarlierRun(dir.path(), {Round(1), Round(3), Round(3)});  // round 3 re-run: counted twice
  auto job = JobLedger::Open(dir.path(), {.resume = true});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->CheckRoundsCovered(1).ok());
  const Status missing = job->CheckRoundsCovered(3);
  EXPECT_EQ(missing.code(), absl::StatusCode::kDataLoss) << missing;
  EXPECT_TRUE(Has(missing, "records no release for round 2 (it holds 3 entries)")) << missing;
  EXPECT_TRUE(Has(job->CheckRoundsCovered(4), "round 2"));
}

TEST(JobLedgerTest, AResumeMustBeCoveredStepByStep) {
  ScopedTempDir dir("job_ledger");
  EarlierRun(dir.path(), {Epoch(1, 300), Epoch(2, 200)});
  auto job = JobLedger::Open(dir.path(), {.resume = true});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->steps(), 500);
  EXPECT_TRUE(job->CheckStepsCovered(500, "OUT/checkpoint.bin").ok());
  const Status short_of = job->CheckStepsCovered(501, "OUT/checkpoint.bin");
  EXPECT_EQ(short_of.code(), absl::StatusCode::kDataLoss) << short_of;
  EXPECT_TRUE(Has(short_of, "counts 500 DP-SGD steps, but OUT/checkpoint.bin is at step 501"))
      << short_of;
}

TEST(JobLedgerTest, NotPrivateReasonsNameEachRun) {
  ScopedTempDir dir("job_ledger");
  EarlierRun(dir.path(), {Epoch(1, 10), Epoch(2, 10, 0), Epoch(3, 10, 0),
                          Epoch(4, 10, 1.1, "seeded (NOT PRIVATE)")});
  auto job = JobLedger::Open(dir.path(), {.resume = true});
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<std::string> why = job->NotPrivateBecause("epoch");
  ASSERT_EQ(why.size(), 2u);
  EXPECT_EQ(why[0], "epochs 2-3 (20 steps): noise_multiplier 0, no noise was added");
  EXPECT_EQ(why[1],
            "epoch 4 (10 steps): the noise came from 'seeded (NOT PRIVATE)', not from the OS "
            "CSPRNG (whoever can reproduce it can remove it)");

  ScopedTempDir clean("job_ledger");
  EarlierRun(clean.path(), {Round(1), Round(2)});
  auto private_job = JobLedger::Open(clean.path(), {.resume = true});
  ASSERT_TRUE(private_job.ok()) << private_job.status();
  EXPECT_TRUE(private_job->NotPrivateBecause().empty());
}

// The session's own noise counts when it adds releases or none are recorded, and only when the
// recorded releases give no reason of their own; the clients' noise labels count as private.
TEST(JobLedgerTest, TheSessionsNoiseCountsWhenItAddsReleasesOrNoneAreRecorded) {
  const SessionNoise seeded{.is_private = false, .why_not = "noise_seed is set"};
  SessionNoise seeded_adding = seeded;
  seeded_adding.adds_releases = true;

  ScopedTempDir fresh("job_ledger");
  auto empty = JobLedger::Open(fresh.path(), {});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->NotPrivateBecause("round", seeded),
            std::vector<std::string>{"noise_seed is set"});
  EXPECT_TRUE(empty->NotPrivateBecause("round", {}).empty());

  ScopedTempDir clients("job_ledger");
  EarlierRun(clients.path(), {Round(1, 1.1, kNoiseClientSide), Round(2, 1.1, kNoiseSecAggShares)});
  auto resumed = JobLedger::Open(clients.path(), {.resume = true});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE(resumed->NotPrivateBecause().empty());
  EXPECT_TRUE(resumed->NotPrivateBecause("round", seeded).empty()) << "adds nothing";
  EXPECT_EQ(resumed->NotPrivateBecause("round", seeded_adding),
            std::vector<std::string>{"noise_seed is set"});

  ScopedTempDir earlier("job_ledger");
  EarlierRun(earlier.path(), {Round(1, 1.1, "seeded (NOT PRIVATE)")});
  auto over = JobLedger::Open(earlier.path(), {.resume = true});
  ASSERT_TRUE(over.ok()) << over.status();
  const std::vector<std::string> why = over->NotPrivateBecause("round", seeded_adding);
  ASSERT_EQ(why.size(), 1u) << "the recorded reason, not the session's again";
  EXPECT_NE(why[0].find("round 1 (1 steps)"), std::string::npos) << why[0];

  // IsPrivate agrees with the reasons, without listing them.
  EXPECT_FALSE(empty->IsPrivate(seeded));
  EXPECT_TRUE(empty->IsPrivate());
  EXPECT_TRUE(resumed->IsPrivate(seeded));
  EXPECT_FALSE(resumed->IsPrivate(seeded_adding));
  EXPECT_FALSE(over->IsPrivate());
  ASSERT_TRUE(resumed->Append(Round(3, 0.0, kNoiseClientSide)).ok());
  EXPECT_FALSE(resumed->IsPrivate()) << "an appended release with noise multiplier 0";
}

TEST(JobLedgerTest, TheReportListsTheLedgersReleases) {
  ScopedTempDir dir("job_ledger");
  EarlierRun(dir.path(), {Round(1), Round(2), Round(3, 2.0)});
  auto job = JobLedger::Open(dir.path(), {.resume = true});
  ASSERT_TRUE(job.ok()) << job.status();
  PrivacyReport report;
  report.job = "mnist";
  report.scope = "federated";
  ASSERT_TRUE(job->WriteReport(report).ok());
  std::ifstream in(dir / kPrivacyReportFile);
  const nlohmann::json j =
      nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  report.ledger = kLedgerFile;
  report.releases = GroupReleases(job->entries());
  EXPECT_EQ(j, nlohmann::json::parse(PrivacyReportJson(report)));
  EXPECT_EQ(report.releases.size(), 2u);
}

// The job's clock stamps every line it appends; the replay reads the times back.
TEST(JobLedgerTest, EveryLineHasTheTimeOfItsRelease) {
  class Wall final : public Clock {
   public:
    int64_t NowMs() const override { return 0; }
    int64_t WallMs() const override { return 1'795'906'263'123; }
  } wall;
  ScopedTempDir dir("job_ledger");
  {
    auto job = JobLedger::Open(dir.path(), {.clock = &wall});
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(job->Append(Round(1)).ok());
    ASSERT_TRUE(job->Append(Epoch(1, 300)).ok());
  }
  auto resumed = JobLedger::Open(dir.path(), {.resume = true});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->entries().size(), 2u);
  for (const LedgerEntry& e : resumed->entries()) {
    EXPECT_EQ(e.time, "2026-11-28T22:51:03.123Z");
  }
}

}  // namespace
}  // namespace huddle::privacy
