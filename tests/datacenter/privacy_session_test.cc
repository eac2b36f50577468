// The datacenter job's privacy bookkeeping (datacenter/privacy_session.h): the ledger's start
// rules, what each epoch records, the budget over all sessions, and how a run that is not private
// is reported.
#include "datacenter/privacy_session.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "privacy/ledger.h"

namespace huddle::datacenter {
namespace {

constexpr double kQ = 0.05;  // 60 of 1200
constexpr int64_t kN = 1200;

double Epsilon(int64_t steps, double z = 1.0) {
  const privacy::DpEvent event{kQ, z, steps};
  return privacy::ComputeEpsilon(std::span(&event, 1), 1e-5, privacy::AccountantKind::kRdp)
      ->epsilon;
}

class DatacenterPrivacyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::path(::testing::TempDir()) /
            ("huddle_dcp_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    c_.job_name = "dc";
    c_.out_dir = dir_;
    c_.train.epochs = 3;
    DatacenterDpSgd dp;
    dp.dp.noise_multiplier = 1.0;
    dp.dp.clip_norm = 1.0;
    dp.dp.expected_batch_size = 60;
    c_.dp_sgd = dp;
  }

  // A ledger of `steps` per entry, one entry per element, written as an earlier session would.
  void WriteLedger(const std::vector<int64_t>& steps, const std::string& noise = "os-csprng",
                   const std::string& unit = privacy::kUnitExample) {
    auto ledger = privacy::PrivacyLedger::Open(dir_ + "/privacy_ledger.jsonl");
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    for (size_t i = 0; i < steps.size(); ++i) {
      privacy::LedgerEntry e;
      e.round = i + 1;
      e.sampling_rate = kQ;
      e.noise_multiplier = 1.0;
      e.clip_norm = 1.0;
      e.mode = unit == privacy::kUnitExample ? "dp_sgd" : "central";
      e.steps = steps[i];
      e.noise = noise;
      e.unit = unit;
      ASSERT_TRUE(ledger->Append(e).ok());
    }
  }

  StatusOr<PrivacySession> Open(bool resume, std::string noise = "os-csprng",
                                bool is_private = true) {
    auto plan = PlanDpSgd(c_, kN);
    if (!plan.ok()) return plan.status();
    return PrivacySession::Open(c_, 2, kN, resume, *plan, SessionNoise{noise, is_private});
  }

  std::string dir_;
  DatacenterConfig c_;
};

TEST_F(DatacenterPrivacyTest, EachEpochRecordsTheStepsSinceTheLastEntry) {
  auto p = Open(/*resume=*/false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->plan().steps, 60);
  ASSERT_TRUE(p->CheckStart(0, false).ok());
  ASSERT_TRUE(p->Record(1, 20).ok());
  ASSERT_TRUE(p->Record(2, 40).ok());
  const auto& entries = p->ledger().entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[1].round, 2u);
  EXPECT_EQ(entries[1].steps, 20);
  EXPECT_EQ(entries[1].mode, "dp_sgd");
  EXPECT_EQ(entries[1].unit, privacy::kUnitExample);
  EXPECT_EQ(entries[1].adjacency, privacy::kAddRemove);
  EXPECT_EQ(entries[1].noise, "os-csprng");
  EXPECT_EQ(entries[1].job, "dc");
  EXPECT_DOUBLE_EQ(entries[1].sampling_rate, kQ);
  auto spent = p->Spent();
  ASSERT_TRUE(spent.ok());
  EXPECT_TRUE(spent->is_private);
  EXPECT_EQ(spent->ledger_steps, 40);
  EXPECT_EQ(spent->nominal_epsilon, Epsilon(40));
  EXPECT_EQ(p->SpentWhenDone()->nominal_epsilon, Epsilon(60));
  // Durable: a new session reads them back.
  auto again = Open(/*resume=*/true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ledger_steps(), 40);
}

TEST_F(DatacenterPrivacyTest, ALedgerWithEntriesNeedsResume) {
  WriteLedger({20});
  auto p = Open(/*resume=*/false);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(p.status()));
  EXPECT_NE(p.status().message().find(dir_ + "/privacy_ledger.jsonl records 1 DP-SGD releases"),
            std::string::npos)
      << p.status();
  EXPECT_NE(p.status().message().find("--resume"), std::string::npos);
  EXPECT_NE(p.status().message().find("new output directory"), std::string::npos);
  EXPECT_TRUE(Open(/*resume=*/true).ok());
  // Nor may a run without DP-SGD take the directory over.
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckNoLedgerForNonDpRun(dir_)));
  EXPECT_TRUE(CheckNoLedgerForNonDpRun(dir_ + "/elsewhere").ok());
}

TEST_F(DatacenterPrivacyTest, AnotherKindOfLedgerIsRefused) {
  WriteLedger({1}, "os-csprng", privacy::kUnitClient);
  auto p = Open(/*resume=*/true);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("not a datacenter DP-SGD job's ledger"), std::string::npos)
      << p.status();
}

TEST_F(DatacenterPrivacyTest, ACheckpointTheLedgerDoesNotCoverIsDataLoss) {
  WriteLedger({20});
  auto p = Open(/*resume=*/true);
  ASSERT_TRUE(p.ok());
  const Status st = p->CheckStart(40, /*from_checkpoint=*/true);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_NE(st.message().find("counts 20 DP-SGD steps"), std::string::npos) << st;
  EXPECT_NE(st.message().find("checkpoint.bin is at step 40"), std::string::npos) << st;
  EXPECT_TRUE(p->CheckStart(20, true).ok());
  // Starting over (no checkpoint) keeps the ledger's 20 steps and records from step 0.
  ASSERT_TRUE(p->CheckStart(0, false).ok());
  ASSERT_TRUE(p->Record(1, 20).ok());
  EXPECT_EQ(p->ledger_steps(), 40);
}

// Epoch 2 recorded (and its model possibly released) and then a crash before its checkpoint: the
// checkpoint is at epoch 1's step 60. Losing epoch 2's line would pass the checkpoint's check; the
// ledger's mark (privacy/ledger.h) refuses it, and a deleted ledger, resumed or started afresh.
TEST_F(DatacenterPrivacyTest, ALedgerThatLostEpochsIsRefused) {
  WriteLedger({60, 60});
  const std::string path = dir_ + "/privacy_ledger.jsonl";
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text.substr(0, text.find('\n') + 1);
  auto p = Open(/*resume=*/true);
  ASSERT_FALSE(p.ok()) << "opened with " << p->ledger_steps() << " of 120 steps";
  EXPECT_TRUE(absl::IsDataLoss(p.status())) << p.status();
  EXPECT_NE(p.status().message().find("new output directory"), std::string::npos) << p.status();
  std::filesystem::remove(path);
  for (bool resume : {true, false}) {
    auto again = Open(resume);
    ASSERT_FALSE(again.ok()) << "resume " << resume;
    EXPECT_TRUE(absl::IsDataLoss(again.status())) << again.status();
  }
}

TEST_F(DatacenterPrivacyTest, TheBudgetCountsTheLedgerAndTheStepsLeft) {
  c_.dp_sgd->epsilon_budget = (Epsilon(60) + Epsilon(80)) / 2;
  WriteLedger({20, 20});  // epoch 2 released, its checkpoint lost: resumed at step 20
  auto p = Open(/*resume=*/true);
  ASSERT_TRUE(p.ok()) << p.status();  // the plan alone (60 steps) fits
  const Status st = p->CheckStart(20, true);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("records 40 steps"), std::string::npos) << st;
  EXPECT_NE(st.message().find("40 of its 60 steps left"), std::string::npos) << st;
  EXPECT_NE(st.message().find("over the budget"), std::string::npos) << st;
  EXPECT_TRUE(p->CheckStart(40, true).ok()) << "40 recorded + 20 left = 60 steps fit";
}

TEST_F(DatacenterPrivacyTest, ZeroNoiseIsNotPrivate) {
  c_.dp_sgd->dp.noise_multiplier = 0;
  auto p = Open(/*resume=*/false, kNoNoise, /*is_private=*/false);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->CheckStart(0, false).ok());
  auto before = p->Spent();
  ASSERT_TRUE(before.ok());
  EXPECT_FALSE(before->is_private);
  ASSERT_TRUE(p->Record(1, 20).ok());
  auto spent = p->Spent();
  ASSERT_TRUE(spent.ok());
  EXPECT_FALSE(spent->is_private);
  EXPECT_TRUE(std::isinf(spent->nominal_epsilon));
  EXPECT_NE(spent->Text().find("epsilon: NOT PRIVATE (epoch 1 (20 steps): noise_multiplier 0"),
            std::string::npos)
      << spent->Text();
  nlohmann::json j;
  spent->AddTo(&j);
  EXPECT_TRUE(j["epsilon"].is_null());
  EXPECT_EQ(j["private"], false);
  EXPECT_TRUE(j.contains("nominal_epsilon"));
  EXPECT_EQ(p->ledger().entries()[0].noise, kNoNoise);
}

TEST_F(DatacenterPrivacyTest, ReproducibleNoiseInAnEarlierSessionMakesTheJobNotPrivate) {
  WriteLedger({20}, "seeded (NOT PRIVATE)");
  auto p = Open(/*resume=*/true);
  ASSERT_TRUE(p.ok());
  auto spent = p->Spent();
  ASSERT_TRUE(spent.ok());
  EXPECT_FALSE(spent->is_private);
  EXPECT_EQ(spent->nominal_epsilon, Epsilon(20));  // kept, as the nominal value only
  ASSERT_EQ(spent->not_private_because.size(), 1u);
  EXPECT_NE(spent->not_private_because[0].find("seeded (NOT PRIVATE)"), std::string::npos);
  nlohmann::json j;
  spent->AddTo(&j);
  EXPECT_TRUE(j["epsilon"].is_null());
  EXPECT_EQ(j["nominal_epsilon"].get<double>(), Epsilon(20));
}

TEST_F(DatacenterPrivacyTest, TheReportIsTheLedgersAndSaysWhyItIsNotPrivate) {
  WriteLedger({20, 20});
  auto p = Open(/*resume=*/true);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->WriteReport("stopped by a signal").ok());
  std::ifstream in(dir_ + "/privacy.json");
  const auto report = nlohmann::json::parse(in);
  EXPECT_EQ(report["scope"], "datacenter");
  EXPECT_EQ(report["epsilon"].get<double>(), Epsilon(40));
  EXPECT_EQ(report["releases"][0]["steps"], 40);
  EXPECT_EQ(report["stopped_early"], "stopped by a signal");
  EXPECT_NE(report["sampling"].get<std::string>().find("60 / 1200"), std::string::npos);
}

}  // namespace
}  // namespace huddle::datacenter
