#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace huddle {

Status SetupLogging(const std::string& level, const std::string& component) {
  const spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log level '", level,
                     "' (allowed: trace, debug, info, warn, error, critical, off)"));
  }
  std::shared_ptr<spdlog::logger> logger = spdlog::get(component);
  if (!logger) {
    try {
      logger = spdlog::stderr_color_mt(component);
    } catch (const spdlog::spdlog_ex& e) {
      return absl::InternalError(absl::StrCat("cannot create logger: ", e.what()));
    }
  }
  // "2026-11-28T22:51:03.123Z [coordinator] info msg": ISO-8601 in UTC, as the outputs' `time`
  // (common/time_format.h), so lines from machines in other zones sort and compare.
  logger->set_pattern(absl::StrCat(kLogTimePattern, " [", component, "] %^%l%$ %v"),
                      spdlog::pattern_time_type::utc);
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace huddle
