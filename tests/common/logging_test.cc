#include "common/logging.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>

#include "common/clock.h"
#include "common/time_format.h"

namespace huddle {
namespace {

// A log line starts with its time, ISO-8601 in UTC whatever the machine's zone, then the
// component and the level.
TEST(LoggingTest, LinesStartWithAnIso8601UtcTime) {
  const std::shared_ptr<spdlog::logger> before = spdlog::default_logger();
  const char* tz = std::getenv("TZ");
  const std::string saved_tz = tz != nullptr ? tz : "";
  ::setenv("TZ", "HUD-05:30", 1);  // POSIX: 5 h 30 ahead of UTC; local time would show it
  ::tzset();
  ASSERT_TRUE(SetupLogging("info", "logging-test").ok());
  ::testing::internal::CaptureStderr();
  const int64_t from_ms = SteadyClock::Get()->WallMs();
  spdlog::info("hello {}", 42);
  spdlog::default_logger()->flush();
  const int64_t to_ms = SteadyClock::Get()->WallMs();
  const std::string out = ::testing::internal::GetCapturedStderr();
  spdlog::set_default_logger(before);
  if (tz != nullptr) {
    ::setenv("TZ", saved_tz.c_str(), 1);
  } else {
    ::unsetenv("TZ");
  }
  ::tzset();

  // "2026-11-28T22:51:03.123Z [logging-test] info hello 42\n" (no std::regex: GCC 12 warns
  // falsely inside it under ASan, and warnings are errors).
  const std::string suffix = " [logging-test] info hello 42\n";
  constexpr size_t kStamp = 24;  // YYYY-MM-DDTHH:MM:SS.mmmZ
  ASSERT_EQ(out.size(), kStamp + suffix.size()) << out;
  ASSERT_EQ(out.substr(kStamp), suffix) << out;
  ASSERT_EQ(out[kStamp - 1], 'Z') << out;
  auto at = ParseIso8601Utc(out.substr(0, kStamp));
  ASSERT_TRUE(at.ok()) << at.status();
  // Milliseconds are truncated in the line, so allow the one before `from_ms`.
  EXPECT_GE(*at, from_ms - 1) << out;
  EXPECT_LE(*at, to_ms) << out;
}

TEST(LoggingTest, UnknownLevelIsRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(SetupLogging("loud", "logging-test")));
}

}  // namespace
}  // namespace huddle
