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

// Each contributing member's upload duration: a summary and the raw list (the service's histogram)
// for the operator, nothing in the public row under DP.
TEST(RoundMetricsTest, UploadDurationsAreTheOperatorsAndSummarised) {
  RoundMetrics m;
  m.round = 3;
  m.clients_sampled = 5;
  m.upload_seconds = {0.2, 1.5, 0.1, 0.4};
  m.privacy = RoundMetrics::Privacy{.mode = "central", .epsilon = 1.5, .delta = 1e-5};
  const nlohmann::ordered_json op = Row(m.OperatorJson());
  ASSERT_TRUE(op.contains("upload_s")) << m.OperatorJson();
  EXPECT_EQ(op["upload_s"]["count"], 4);
  EXPECT_DOUBLE_EQ(op["upload_s"]["sum"].get<double>(), 2.2);
  EXPECT_DOUBLE_EQ(op["upload_s"]["p50"].get<double>(), 0.3);  // the two middle values' mean
  EXPECT_DOUBLE_EQ(op["upload_s"]["max"].get<double>(), 1.5);
  EXPECT_EQ(op["upload_seconds"], nlohmann::json({0.2, 1.5, 0.1, 0.4}));
  EXPECT_NE(m.OperatorJson().find("\"sum\":2.2,"), std::string::npos)
      << "no float noise in the sum: " << m.OperatorJson();
  for (const std::string& row : {m.PublicJson(), m.ToJson()}) {
    EXPECT_EQ(row.find("upload"), std::string::npos) << "under DP, public: " << row;
  }
  // Without DP metrics.jsonl holds everything, the uploads too.
  m.privacy.reset();
  m.upload_seconds = {0.25, 0.5, 2.0};
  const nlohmann::ordered_json all = Row(m.ToJson());
  EXPECT_EQ(all["upload_s"]["count"], 3);
  EXPECT_DOUBLE_EQ(all["upload_s"]["p50"].get<double>(), 0.5);
  EXPECT_EQ(all["upload_seconds"].size(), 3u);
  // None: a count of 0, no median or maximum.
  m.upload_seconds.clear();
  const nlohmann::ordered_json none = Row(m.OperatorJson());
  EXPECT_EQ(none["upload_s"]["count"], 0);
  EXPECT_TRUE(none["upload_s"]["p50"].is_null());
  EXPECT_TRUE(none["upload_s"]["max"].is_null());
  EXPECT_TRUE(none["upload_seconds"].empty());
}

}  // namespace
}  // namespace huddle::coordinator
