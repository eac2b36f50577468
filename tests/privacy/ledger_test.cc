#include "privacy/ledger.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/clock.h"
#include "common/file_util.h"
#include "common/time_format.h"

namespace huddle::privacy {
namespace {

// A wall clock that reads what the test sets: appended lines are then the same bytes every run.
class FixedClock final : public Clock {
 public:
  int64_t NowMs() const override { return 0; }
  int64_t WallMs() const override { return wall_ms; }
  int64_t wall_ms = 1'795'906'263'123;  // 2026-11-28T22:51:03.123Z
};

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
  std::string ReadRaw() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void Overwrite(const std::string& text) const {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << text;
  }
  // The ledger with `entries` appended through the ledger itself (at clock_'s time), and its
  // bytes after each.
  std::vector<std::string> Appended(int entries) {
    std::vector<std::string> states;
    auto ledger = PrivacyLedger::Open(path_, {.clock = &clock_});
    EXPECT_TRUE(ledger.ok()) << ledger.status();
    if (!ledger.ok()) return states;
    for (int r = 1; r <= entries; ++r) {
      EXPECT_TRUE(ledger->Append(Entry(static_cast<uint64_t>(r))).ok());
      states.push_back(ReadRaw());
    }
    return states;
  }
  // Opening is refused, saying the spend is not known and how to recover.
  void ExpectRefused(const std::string& what) const {
    auto ledger = PrivacyLedger::Open(path_);
    ASSERT_FALSE(ledger.ok()) << what << ": opened with " << ledger->entries().size();
    EXPECT_TRUE(absl::IsDataLoss(ledger.status())) << what << ": " << ledger.status();
    EXPECT_NE(ledger.status().message().find("restore"), absl::string_view::npos)
        << what << ": " << ledger.status();
  }

  std::filesystem::path dir_;
  std::string path_;
  FixedClock clock_;
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

// A ledger that lost entries must never open as if they had not been released: an under-count.
TEST_F(LedgerTest, ADroppedLastLineIsRefused) {
  const std::vector<std::string> states = Appended(3);
  ASSERT_EQ(states.size(), 3u);
  Overwrite(states[1]);  // the last whole line gone
  ExpectRefused("last line dropped");
  Overwrite(states[0]);  // two of them
  ExpectRefused("two lines dropped");
}

TEST_F(LedgerTest, ATruncatedLedgerIsRefused) {
  const std::vector<std::string> states = Appended(3);
  ASSERT_EQ(states.size(), 3u);
  Overwrite("");
  ExpectRefused("truncated to nothing");
  // One entry cut out of the middle: the count alone would not show it.
  const std::string& all = states[2];
  const size_t first_end = all.find('\n') + 1;
  const size_t second_end = all.find('\n', first_end) + 1;
  Overwrite(all.substr(0, first_end) + all.substr(second_end) +
            all.substr(first_end, second_end - first_end));
  ExpectRefused("a middle line moved");
  Overwrite(all.substr(0, first_end) + all.substr(second_end));
  ExpectRefused("a middle line removed");
}

TEST_F(LedgerTest, ATornLineThatWasDurableIsRefused) {
  // The last entry's fsync returned (the mark counts it): tearing it is not a crash mid-write.
  const std::vector<std::string> states = Appended(2);
  ASSERT_EQ(states.size(), 2u);
  Overwrite(states[1].substr(0, states[0].size() + 10));
  ExpectRefused("last line torn");
  Overwrite(states[1].substr(0, states[1].size() - 1));  // only its newline gone
  ExpectRefused("last newline torn");
}

TEST_F(LedgerTest, ADeletedLedgerIsRefusedWhileItsMarkRemains) {
  Appended(2);
  std::filesystem::remove(path_);
  ExpectRefused("ledger deleted");
  EXPECT_FALSE(std::filesystem::exists(path_)) << "a refused open must not create a new ledger";
}

TEST_F(LedgerTest, AMissingMarkOfAChainedLedgerIsRefused) {
  Appended(2);
  std::filesystem::remove(path_ + ".mark");
  ExpectRefused("mark deleted");
}

TEST_F(LedgerTest, ACrashBeforeTheMarkIsAnOverCountAndOpens) {
  const std::vector<std::string> states = Appended(2);
  ASSERT_EQ(states.size(), 2u);
  std::string mark_after_one;
  {
    // The mark as it stood after the first append: the second append's line is durable and its
    // mark update never happened.
    std::filesystem::remove(path_);
    std::filesystem::remove(path_ + ".mark");
    Appended(1);
    std::ifstream in(path_ + ".mark", std::ios::binary);
    mark_after_one = std::string(std::istreambuf_iterator<char>(in), {});
  }
  Overwrite(states[1]);
  std::ofstream(path_ + ".mark", std::ios::binary | std::ios::trunc) << mark_after_one;
  {
    auto ledger = PrivacyLedger::Open(path_);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    EXPECT_EQ(ledger->entries().size(), 2u);
  }
  // The mark caught up at that open: losing the second line now is refused.
  Overwrite(states[0]);
  ExpectRefused("after the mark caught up");
}

TEST_F(LedgerTest, ALedgerWithoutChainFieldsOpensAndIsSealedFromThen) {
  const std::string legacy =
      R"({"round":1,"mechanism":"poisson_gaussian","sampling_rate":0.5,"noise_multiplier":1,"clip_norm":1,"mode":"central","steps":1,"noise":"x"})";
  WriteRaw(legacy + "\n" + legacy + "\n");
  {
    auto ledger = PrivacyLedger::Open(path_);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    EXPECT_EQ(ledger->entries().size(), 2u);
    ASSERT_TRUE(ledger->Append(Entry(2)).ok());
  }
  const std::string text = ReadRaw();
  EXPECT_EQ(text.substr(0, 2 * (legacy.size() + 1)), legacy + "\n" + legacy + "\n");
  EXPECT_NE(text.find("\"prev\":\"", 2 * (legacy.size() + 1)), std::string::npos) << text;
  auto ledger = PrivacyLedger::Open(path_);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_EQ(ledger->entries().size(), 3u);
  Overwrite(legacy + "\n");
  ExpectRefused("the old part truncated after the migration");
}

TEST_F(LedgerTest, ADamagedMarkIsRefused) {
  Appended(1);
  std::ofstream(path_ + kMarkSuffix, std::ios::trunc) << "{\"entries\":1}";
  ExpectRefused("mark without its head");
}

TEST_F(LedgerTest, AnAcknowledgedLossOpensCountingItUnbounded) {
  const std::vector<std::string> states = Appended(3);
  ASSERT_EQ(states.size(), 3u);
  Overwrite(states[0]);
  LedgerOpenOptions acknowledge;
  acknowledge.acknowledge_loss = true;
  acknowledge.how_to_acknowledge = "or say so";
  auto refused = PrivacyLedger::Open(path_, {.how_to_acknowledge = "or say so"});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("or say so"), absl::string_view::npos);
  {
    auto ledger = PrivacyLedger::Open(path_, acknowledge);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    ASSERT_EQ(ledger->entries().size(), 3u);  // the one kept, a lost entry per unit
    EXPECT_EQ(ledger->entries()[1].mode, kModeLost);
    EXPECT_EQ(ledger->entries()[1].steps, 2);  // the mark counted 3
    auto spent = ComputeSpend(ledger->Events(kUnitClient), 1e-5, AccountantKind::kRdp);
    ASSERT_TRUE(spent.ok()) << spent.status();
    EXPECT_TRUE(std::isinf(spent->epsilon));
    spent = ComputeSpend(ledger->Events(kUnitExample), 1e-5, AccountantKind::kRdp);
    ASSERT_TRUE(spent.ok()) << spent.status();
    EXPECT_TRUE(std::isinf(spent->epsilon));
    ASSERT_TRUE(ledger->Append(Entry(4)).ok());
  }
  // The damaged bytes are kept; the recovered ledger opens without the acknowledgement.
  std::ifstream damaged(path_ + kDamagedSuffix, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(damaged), {}), states[0]);
  auto ledger = PrivacyLedger::Open(path_);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_EQ(ledger->entries().size(), 4u);
}

// Every appended line carries the time its release was recorded, from the ledger's clock; the
// replay reads it back.
TEST_F(LedgerTest, EveryAppendedLineHasItsTime) {
  {
    auto ledger = PrivacyLedger::Open(path_, {.clock = &clock_});
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    ASSERT_TRUE(ledger->Append(Entry(1)).ok());
    clock_.wall_ms += 61'000;
    LedgerEntry stale = Entry(2);
    stale.time = "1999-01-01T00:00:00.000Z";  // the ledger's clock decides, not the caller
    ASSERT_TRUE(ledger->Append(stale).ok());
    ASSERT_TRUE(ledger->AppendLost(1).ok());
    EXPECT_EQ(ledger->entries()[0].time, "2026-11-28T22:51:03.123Z");
    EXPECT_EQ(ledger->entries()[1].time, "2026-11-28T22:52:04.123Z");
  }
  const std::string text = ReadRaw();
  EXPECT_EQ(text.rfind(R"({"round":1,"time":"2026-11-28T22:51:03.123Z","mechanism":)", 0), 0u)
      << text;
  auto replayed = PrivacyLedger::Open(path_);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  ASSERT_EQ(replayed->entries().size(), 4u);
  for (const LedgerEntry& e : replayed->entries()) {
    auto at = ParseIso8601Utc(e.time);
    ASSERT_TRUE(at.ok()) << "round " << e.round << ": " << at.status();
    EXPECT_GE(*at, 1'795'906'263'123);
  }
  EXPECT_EQ(replayed->entries()[1].time, "2026-11-28T22:52:04.123Z");
  // A line per entry, each with its time.
  size_t lines = 0;
  for (size_t at = text.find("\"time\":\""); at != std::string::npos;
       at = text.find("\"time\":\"", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 4u) << text;
}

// Lines written before `time` existed read and open as they are; the times are only labels, so
// entries that differ in time alone are one event to the accountant.
TEST_F(LedgerTest, LinesWithoutTimeStillReadAndTimeIsNotSpend) {
  const std::string legacy =
      R"({"round":1,"mechanism":"poisson_gaussian","sampling_rate":0.1,"noise_multiplier":1.1,"clip_norm":0.5,"mode":"central","steps":1,"noise":"os-csprng","unit":"client","adjacency":"add_remove"})";
  auto e = ParseLedgerLine(legacy);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->time, "");
  EXPECT_EQ(LedgerLine(*e), legacy) << "no time is made up for an old line";
  WriteRaw(legacy + "\n");
  auto ledger = PrivacyLedger::Open(path_, {.clock = &clock_});
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  ASSERT_TRUE(ledger->Append(Entry(2)).ok());
  ASSERT_EQ(ledger->entries().size(), 2u);
  EXPECT_EQ(ledger->entries()[0].time, "");
  EXPECT_EQ(ledger->entries()[1].time, "2026-11-28T22:51:03.123Z");
  const std::vector<DpEvent> events = ledger->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].steps, 2);
  // A time must be text; any text reads (a label never makes the spend unknown).
  std::string odd = legacy;
  odd.insert(odd.size() - 1, R"(,"time":"last Tuesday")");
  auto read = ParseLedgerLine(odd);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->time, "last Tuesday");
  std::string number = legacy;
  number.insert(number.size() - 1, R"(,"time":5)");
  EXPECT_TRUE(absl::IsDataLoss(ParseLedgerLine(number).status()));
}

// The chain covers the time as it covers every byte of a line: an edited time is an edited line.
TEST_F(LedgerTest, AnEditedTimeIsRefused) {
  const std::vector<std::string> states = Appended(2);
  ASSERT_EQ(states.size(), 2u);
  std::string edited = states[1];
  const size_t at = edited.find("2026-11-28");
  ASSERT_NE(at, std::string::npos) << edited;
  edited.replace(at, 4, "2025");
  Overwrite(edited);
  ExpectRefused("a time edited");
}

// An acknowledged loss rewrites the entries that still parse as a fresh chain: with their times.
TEST_F(LedgerTest, AnAcknowledgedLossKeepsTheTimesItRewrites) {
  const std::vector<std::string> states = Appended(3);
  ASSERT_EQ(states.size(), 3u);
  Overwrite(states[0]);
  clock_.wall_ms += 3'600'000;
  auto ledger = PrivacyLedger::Open(path_, {.acknowledge_loss = true, .clock = &clock_});
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  ASSERT_EQ(ledger->entries().size(), 3u);
  EXPECT_EQ(ledger->entries()[0].time, "2026-11-28T22:51:03.123Z");  // when it was recorded
  EXPECT_EQ(ledger->entries()[1].time, "2026-11-28T23:51:03.123Z");  // the loss: now
  EXPECT_NE(ReadRaw().find("\"time\":\"2026-11-28T22:51:03.123Z\""), std::string::npos);
}

// Each kind of release has one constructor; its line is the one the sites that filled entries by
// hand wrote (the file format does not change).
TEST(LedgerEntryTest, EachKindOfReleaseHasItsLine) {
  LedgerEntry central =
      LedgerEntry::ClientGaussian(kModeCentral, 3, 0.1, 1.1, 0.5, kAddRemove, "os-csprng");
  central.job = "mnist";
  EXPECT_EQ(LedgerLine(central),
            R"j({"round":3,"mechanism":"poisson_gaussian","sampling_rate":0.1,)j"
            R"j("noise_multiplier":1.1,"clip_norm":0.5,"mode":"central","steps":1,)j"
            R"j("noise":"os-csprng","unit":"client","adjacency":"add_remove","job":"mnist"})j");
  LedgerEntry local =
      LedgerEntry::ClientGaussian(kModeLocal, 4, 1, 2.0, 1.0, kReplaceOne, "os-csprng");
  local.release = "r1";
  EXPECT_EQ(LedgerLine(local),
            R"j({"round":4,"mechanism":"poisson_gaussian","sampling_rate":1.0,)j"
            R"j("noise_multiplier":2.0,"clip_norm":1.0,"mode":"local","steps":1,)j"
            R"j("noise":"os-csprng","unit":"client","adjacency":"replace_one","release":"r1"})j");
  EXPECT_EQ(local.event().noise_multiplier, 1.0);  // replace-one halves it
  const LedgerEntry sgd =
      LedgerEntry::DpSgdSteps(2, DpEvent{0.01, 1.5, 300}, 0.25, "none (NOT PRIVATE)");
  EXPECT_EQ(LedgerLine(sgd),
            R"j({"round":2,"mechanism":"poisson_gaussian","sampling_rate":0.01,)j"
            R"j("noise_multiplier":1.5,"clip_norm":0.25,"mode":"dp_sgd","steps":300,)j"
            R"j("noise":"none (NOT PRIVATE)","unit":"example","adjacency":"add_remove"})j");
  const DpEvent steps = sgd.event();
  EXPECT_EQ(steps.sampling_rate, 0.01);
  EXPECT_EQ(steps.noise_multiplier, 1.5);
  EXPECT_EQ(steps.steps, 300);
  DpEvent sum;
  sum.noise_multiplier = 8.0;
  sum.tau = 0.5;
  sum.dimension = 10;
  const LedgerEntry distributed = LedgerEntry::DistributedSum(5, sum, 1.0, kNoiseClientSide);
  EXPECT_EQ(LedgerLine(distributed),
            R"j({"round":5,"mechanism":"distributed_discrete_gaussian","sampling_rate":1.0,)j"
            R"j("noise_multiplier":8.0,"clip_norm":1.0,"mode":"distributed","steps":1,)j"
            R"j("noise":"client-side","unit":"client","adjacency":"replace_one","tau":0.5,)j"
            R"j("dimension":10})j");
}

}  // namespace
}  // namespace huddle::privacy
