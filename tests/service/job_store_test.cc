#include "service/job_store.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/file_util.h"
#include "tests/testing/temp_dir.h"

namespace huddle::service {
namespace {

huddle::testing::TempDirs dirs;

TEST(JobStoreTest, NamesStayInsideTheStateDirectory) {
  for (const char* ok : {"a", "job-1", "Fashion.MNIST_2", "9"})
    EXPECT_TRUE(IsValidJobName(ok)) << ok;
  for (const char* bad :
       {"", ".", "..", "../x", "a/b", "-x", ".hidden", "a b", "é", "x\n", "a\\b"}) {
    EXPECT_FALSE(IsValidJobName(bad)) << bad;
  }
  EXPECT_FALSE(IsValidJobName(std::string(65, 'a')));
  EXPECT_TRUE(IsValidJobName(std::string(64, 'a')));
}

TEST(JobStoreTest, CreatesQueuesAndReloadsJobsInSubmissionOrder) {
  const std::string dir = dirs.Make("store");
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE(store->Create("b", "name: b\n", "name: b\n", "alice", "t1").ok());
    ASSERT_TRUE(store->Create("a", "name: a\n", "name: a\n", "bob", "t2").ok());
    EXPECT_TRUE(absl::IsAlreadyExists(store->Create("a", "", "", "bob", "t3").status()));
    EXPECT_TRUE(absl::IsInvalidArgument(store->Create("../a", "", "", "bob", "t3").status()));
    EXPECT_EQ(store->Next({})->name, "b");
    EXPECT_EQ(store->Next({"b"})->name, "a");
    JobRecord a = *store->Find("a");
    a.state = JobState::kRunning;
    a.starts = 1;
    ASSERT_TRUE(store->Update(a).ok());
    EXPECT_EQ(store->Next({})->name, "a") << "an interrupted job goes first";
    EXPECT_EQ(*ReadFile(dir + "/jobs/b/submitted.yaml"), "name: b\n");
  }
  auto again = JobStore::Open(dir);
  ASSERT_TRUE(again.ok());
  const std::vector<JobRecord> jobs = again->List();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].name, "b");
  EXPECT_EQ(jobs[0].submitted_by, "alice");
  EXPECT_EQ(jobs[1].state, JobState::kRunning);
  // A name once used is never reused, even after a restart.
  EXPECT_TRUE(absl::IsAlreadyExists(again->Create("b", "", "", "x", "t").status()));
  ASSERT_TRUE(again->Create("c", "", "", "x", "t").ok());
  EXPECT_EQ(again->Find("c")->seq, 3u);
}

TEST(JobStoreTest, ABadRecordFailsItsJobAndNoOther) {
  const std::string dir = dirs.Make("store_bad");
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store->Create("good", "", "", "a", "t").ok());
    ASSERT_TRUE(store->Create("torn", "", "", "a", "t").ok());
    ASSERT_TRUE(store->Create("liar", "", "", "a", "t").ok());
  }
  ASSERT_TRUE(WriteFileAtomic(dir + "/jobs/torn/state.json", "{\"name\": \"to").ok());
  ASSERT_TRUE(
      WriteFileAtomic(dir + "/jobs/liar/state.json", R"({"name":"good","seq":1,"state":"queued"})")
          .ok());
  std::filesystem::create_directories(dir + "/jobs/.tmp");  // not a job: left alone
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store->Find("good")->state, JobState::kQueued);
  EXPECT_EQ(store->Find("torn")->state, JobState::kFailed);
  EXPECT_NE(store->Find("torn")->reason.find("does not load"), std::string::npos);
  EXPECT_EQ(store->Find("liar")->state, JobState::kFailed);
  EXPECT_NE(store->Find("liar")->reason.find("names job 'good'"), std::string::npos);
  EXPECT_EQ(store->Find(".tmp"), nullptr);
  EXPECT_EQ(store->Next({})->name, "good");
}

TEST(JobStoreTest, DiscardRemovesOnlyAJobThatNeverRan) {
  const std::string dir = dirs.Make("store_discard");
  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store->Create("x", "", "", "a", "t").ok());
  ASSERT_TRUE(store->Discard("x").ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/jobs/x"));
  ASSERT_TRUE(store->Create("y", "", "", "a", "t").ok());
  JobRecord y = *store->Find("y");
  y.starts = 1;
  ASSERT_TRUE(store->Update(y).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store->Discard("y")));
}

}  // namespace
}  // namespace huddle::service
