#include "privacy/ledger.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/file_util.h"

namespace huddle::privacy {
namespace {

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::path(::testing::TempDir()) /
        ("ledger_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / kLedgerFile).string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static LedgerEntry Entry(uint64_t round, double z = 1.1) {
    LedgerEntry e;
    e.round = round;
    e.sampling_rate = 0.1;
    e.noise_multiplier = z;
    e.clip_norm = 0.5;
    e.mode = "central";
    e.noise = "os-csprng";
    return e;
  }
  void WriteRaw(const std::string& text) {
    std::ofstream(path_, std::ios::binary | std::ios::app) << text;
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(LedgerTest, AppendsDurablyAndReplays) {
  {
    auto ledger = PrivacyLedger::Open(path_);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    EXPECT_TRUE(ledger->entries().empty());
    for (uint64_t r = 1; r <= 3; ++r) ASSERT_TRUE(ledger->Append(Entry(r)).ok());
    ASSERT_TRUE(ledger->Append(Entry(4, 2.0)).ok());
  }
  auto replayed = PrivacyLedger::Open(path_);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  ASSERT_EQ(replayed->entries().size(), 4u);
  EXPECT_EQ(replayed->entries()[3].round, 4u);
  EXPECT_EQ(replayed->entries()[3].noise_multiplier, 2.0);
  EXPECT_EQ(replayed->entries()[0].clip_norm, 0.5);
  EXPECT_EQ(replayed->entries()[0].noise, "os-csprng");
  // Identical consecutive events merge; composition is what the accountant sees.
  const std::vector<DpEvent> events = replayed->Events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].steps, 3);
  EXPECT_EQ(events[1].steps, 1);
  EXPECT_EQ(events[1].noise_multiplier, 2.0);
}

TEST_F(LedgerTest, LineRoundTripsExactly) {
  LedgerEntry e = Entry(7, 0.1 + 0.2);  // a double that needs all 17 digits
  auto back = ParseLedgerLine(LedgerLine(e));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->noise_multiplier, e.noise_multiplier);
  EXPECT_EQ(back->round, 7u);
}

TEST_F(LedgerTest, TornLastLineIsDroppedAndTruncated) {
  {
    auto ledger = PrivacyLedger::Open(path_);
    ASSERT_TRUE(ledger.ok());
    ASSERT_TRUE(ledger->Append(Entry(1)).ok());
  }
  const std::string full = LedgerLine(Entry(2));
  WriteRaw(full.substr(0, full.size() / 2));  // a crash mid-write
  {
    auto ledger = PrivacyLedger::Open(path_);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    EXPECT_EQ(ledger->entries().size(), 1u);
    ASSERT_TRUE(ledger->Append(Entry(2)).ok());  // lands on a line of its own
  }
  auto ledger = PrivacyLedger::Open(path_);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  ASSERT_EQ(ledger->entries().size(), 2u);
  EXPECT_EQ(ledger->entries()[1].round, 2u);
}

TEST_F(LedgerTest, CorruptCompleteLineIsDataLoss) {
  {
    auto ledger = PrivacyLedger::Open(path_);
    ASSERT_TRUE(ledger.ok());
    ASSERT_TRUE(ledger->Append(Entry(1)).ok());
  }
  WriteRaw("{\"round\":2,\"mechanism\":\"poisson_gaussian\"}\n");
  auto ledger = PrivacyLedger::Open(path_);
  ASSERT_FALSE(ledger.ok());
  EXPECT_TRUE(absl::IsDataLoss(ledger.status()));
  EXPECT_NE(ledger.status().message().find("line 2"), absl::string_view::npos) << ledger.status();
}

TEST_F(LedgerTest, RejectsOutOfRangeFields) {
  for (
      const char* bad : {
          R"({"round":1,"mechanism":"poisson_gaussian","sampling_rate":1.5,"noise_multiplier":1,"clip_norm":1,"mode":"central","steps":1,"noise":"x"})",
          R"({"round":1,"mechanism":"laplace","sampling_rate":0.5,"noise_multiplier":1,"clip_norm":1,"mode":"central","steps":1,"noise":"x"})",
          R"({"round":-1,"mechanism":"poisson_gaussian","sampling_rate":0.5,"noise_multiplier":1,"clip_norm":1,"mode":"central","steps":1,"noise":"x"})",
          R"({"round":1,"mechanism":"poisson_gaussian","sampling_rate":0.5,"noise_multiplier":-1,"clip_norm":1,"mode":"central","steps":1,"noise":"x"})",
          R"({"round":1,"mechanism":"poisson_gaussian","sampling_rate":0.5,"noise_multiplier":1,"clip_norm":1,"mode":"central","steps":-2,"noise":"x"})",
          "not json",
      }) {
    EXPECT_FALSE(ParseLedgerLine(bad).ok()) << bad;
  }
}

TEST_F(LedgerTest, OlderLinesReadAsClientLevelAddRemove) {
  // A line written before `unit` and `adjacency` existed.
  auto e = ParseLedgerLine(
      R"({"round":1,"mechanism":"poisson_gaussian","sampling_rate":0.5,"noise_multiplier":1,"clip_norm":1,"mode":"central","steps":1,"noise":"x"})");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->unit, kUnitClient);
  EXPECT_EQ(e->adjacency, kAddRemove);
  EXPECT_EQ(e->event().noise_multiplier, 1.0);
}

TEST_F(LedgerTest, ReplaceOneHalvesTheAccountedMultiplierAndNeedsQOne) {
  LedgerEntry local = Entry(1, 3.0);
  local.sampling_rate = 1;
  local.adjacency = kReplaceOne;
  local.job = "job";
  local.release = "abc";
  auto back = ParseLedgerLine(LedgerLine(local));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->event().noise_multiplier, 1.5);
  EXPECT_EQ(back->job, "job");
  EXPECT_EQ(back->release, "abc");
  local.sampling_rate = 0.5;
  auto sampled = ParseLedgerLine(LedgerLine(local));
  ASSERT_FALSE(sampled.ok());
  EXPECT_NE(sampled.status().message().find("replace_one"), absl::string_view::npos);
  for (
      const char* bad :
      {R"({"round":1,"mechanism":"poisson_gaussian","sampling_rate":1,"noise_multiplier":1,"clip_norm":1,"mode":"local","steps":1,"noise":"x","unit":"person"})",
       R"({"round":1,"mechanism":"poisson_gaussian","sampling_rate":1,"noise_multiplier":1,"clip_norm":1,"mode":"local","steps":1,"noise":"x","adjacency":"swap"})"}) {
    EXPECT_FALSE(ParseLedgerLine(bad).ok()) << bad;
  }
}

TEST_F(LedgerTest, EventsOfOneUnitAndReleasesById) {
  auto ledger = PrivacyLedger::Open(path_);
  ASSERT_TRUE(ledger.ok());
  LedgerEntry client = Entry(1);
  client.release = "r1";
  LedgerEntry example = Entry(1);
  example.unit = kUnitExample;
  example.steps = 30;
  ASSERT_TRUE(ledger->Append(client).ok());
  ASSERT_TRUE(ledger->Append(example).ok());
  EXPECT_EQ(ledger->Events(kUnitClient).size(), 1u);
  ASSERT_EQ(ledger->Events(kUnitExample).size(), 1u);
  EXPECT_EQ(ledger->Events(kUnitExample)[0].steps, 30);
  EXPECT_EQ(ledger->Events()[0].steps, 31);  // all units: merged as one (q, z)
  ASSERT_NE(ledger->FindRelease("r1"), nullptr);
  EXPECT_EQ(ledger->FindRelease("r2"), nullptr);
  EXPECT_EQ(ledger->FindRelease(""), nullptr);
}

}  // namespace
}  // namespace huddle::privacy
