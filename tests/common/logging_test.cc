#include "common/logging.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <regex>

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

  std::smatch m;
  ASSERT_TRUE(std::regex_match(
      out, m,
      std::regex(R"((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) \[logging-test\] info hello 42\n)")))
      << out;
  auto at = ParseIso8601Utc(m[1].str());
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
