#include "common/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "common/log_context.h"

namespace huddle {
namespace {

thread_local const std::string* tls_context = nullptr;

// `%*` in the pattern: the thread's context and ": ", or nothing.
class ContextFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    if (tls_context == nullptr || tls_context->empty()) return;
    dest.append(tls_context->data(), tls_context->data() + tls_context->size());
    dest.append(std::string_view(": "));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<ContextFlag>();
  }
};

}  // namespace

void SetThreadLogContext(const std::string* context) { tls_context = context; }

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
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  formatter->add_flag<ContextFlag>('*').set_pattern(
      absl::StrCat(kLogTimePattern, " [", component, "] %^%l%$ %*%v"));
  logger->set_formatter(std::move(formatter));
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace huddle
