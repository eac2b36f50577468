// The rows of metrics.jsonl and operator_metrics.jsonl (coordinator/round_metrics.h): which carry
// the row's `time`.
#include "coordinator/round_metrics.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace huddle::coordinator {
namespace {

nlohmann::ordered_json Row(const std::string& line) { return nlohmann::ordered_json::parse(line); }

TEST(RoundMetricsTest, RowsCarryTheTimeTheyWereWrittenAfterTheRound) {
  RoundMetrics m;
  m.round = 4;
  m.wall_ms = 1'795'906'263'123;
  const nlohmann::ordered_json row = Row(m.ToJson());
  EXPECT_EQ(row["time"], "2026-11-28T22:51:03.123Z");
  auto key = row.begin();
  EXPECT_EQ(key.key(), "round");
  EXPECT_EQ((++key).key(), "time");
  // Without DP PublicJson is ToJson.
  EXPECT_EQ(Row(m.PublicJson())["time"], "2026-11-28T22:51:03.123Z");
  // Unknown: no time rather than a made-up one.
  m.wall_ms = -1;
  EXPECT_FALSE(Row(m.ToJson()).contains("time"));
  EXPECT_FALSE(Row(m.OperatorJson()).contains("time"));
}

TEST(RoundMetricsTest, UnderDpTheTimeIsTheOperators) {
  RoundMetrics m;
  m.round = 2;
  m.wall_ms = 1'795'906'263'123;
  m.privacy = RoundMetrics::Privacy{.mode = "central", .epsilon = 1.5, .delta = 1e-5};
  EXPECT_FALSE(Row(m.PublicJson()).contains("time")) << m.PublicJson();
  EXPECT_FALSE(Row(m.ToJson()).contains("time")) << "ToJson is PublicJson under DP";
  EXPECT_EQ(Row(m.OperatorJson())["time"], "2026-11-28T22:51:03.123Z");
}

}  // namespace
}  // namespace huddle::coordinator
