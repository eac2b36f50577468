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
  logger->set_pattern(absl::StrCat("%H:%M:%S.%e [", component, "] %^%l%$ %v"));
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace huddle
