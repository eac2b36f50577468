#include "common/time_format.h"

#include "common/clock.h"
#include "gtest/gtest.h"

namespace huddle {
namespace {

TEST(TimeFormatTest, WritesIso8601UtcWithMilliseconds) {
  EXPECT_EQ(Iso8601Utc(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(Iso8601Utc(1'795'906'263'123), "2026-11-28T22:51:03.123Z");
  EXPECT_EQ(Iso8601Utc(951'782'400'000), "2000-02-29T00:00:00.000Z");  // a leap day
  EXPECT_EQ(Iso8601Utc(253'402'300'799'999), "9999-12-31T23:59:59.999Z");
  EXPECT_EQ(Iso8601Utc(-1), "1969-12-31T23:59:59.999Z");  // floor, not truncation
}

TEST(TimeFormatTest, ParsesWhatItWrites) {
  for (int64_t ms : {int64_t{0}, int64_t{1'795'906'263'123}, int64_t{951'782'400'000},
                     int64_t{253'402'300'799'999}, int64_t{-1}, int64_t{1'234'567}}) {
    auto back = ParseIso8601Utc(Iso8601Utc(ms));
    ASSERT_TRUE(back.ok()) << ms << ": " << back.status();
    EXPECT_EQ(*back, ms);
  }
}

TEST(TimeFormatTest, RefusesAnythingElse) {
  for (const char* bad : {
           "",
           "2026-11-28T22:51:03Z",           // no milliseconds
           "2026-11-28T22:51:03.123",        // no zone
           "2026-11-28T22:51:03.123+01:00",  // another zone
           "2026-11-28 22:51:03.123Z",       // no T
           "2026-02-29T00:00:00.000Z",       // not a leap year
           "2026-13-01T00:00:00.000Z",
           "2026-11-28T24:00:00.000Z",
           "2026-11-28T22:60:00.000Z",
           "2026-11-28T22:51:60.000Z",
           "2026-11-2xT22:51:03.123Z",
       }) {
    auto parsed = ParseIso8601Utc(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << bad;
  }
  EXPECT_NE(ParseIso8601Utc("yesterday").status().message().find("'yesterday'"),
            absl::string_view::npos);
}

TEST(TimeFormatTest, SteadyClockWallTimeIsNow) {
  // After this was written, before the year 2100.
  const int64_t wall_ms = SteadyClock::Get()->WallMs();
  EXPECT_GT(wall_ms, *ParseIso8601Utc("2025-01-01T00:00:00.000Z"));
  EXPECT_LT(wall_ms, *ParseIso8601Utc("2100-01-01T00:00:00.000Z"));
}

}  // namespace
}  // namespace huddle
