// Logging goes through spdlog. The `huddle` binary configures the default logger once at start-up
// (`SetupLogging`); library code only calls spdlog::info/warn/error.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>
#include <unordered_set>
#include <utility>

#include "common/status.h"

namespace huddle {

// The spdlog pattern of a log line's time: ISO-8601 in UTC with milliseconds, the form of
// common/time_format.h's Iso8601Utc ("2026-11-28T22:51:03.123Z"). Use it with
// spdlog::pattern_time_type::utc.
inline constexpr char kLogTimePattern[] = "%Y-%m-%dT%H:%M:%S.%eZ";

// Sets the default logger's level ("trace".."critical", "off") and the pattern
// "<time> [<component>] <level> <message>", the time as kLogTimePattern in UTC and `component`
// e.g. "coordinator", "client 3". Returns InvalidArgument for an unknown level.
Status SetupLogging(const std::string& level, const std::string& component);

// Turns a flood of one kind of event (refused handshakes, rate-limited or malformed messages, cut
// connections, rejoins) into at most one log line per period, whatever the number of sources (a
// peer, an identity, a key). The first event after a quiet period is logged at once with its
// detail; later ones are only counted, and Flush() (called by every Add, and by the owner's loop)
// logs them as one summary line once the period has passed since the last line:
//   "<n> <what> in the last <s> s from <k> sources (first: <detail>)".
// Counters that metrics report are kept elsewhere and stay exact; this only decides what reaches
// the log. Memory is bounded (at most max_sources distinct sources are remembered per period).
// Not thread-safe: one per owning thread.
class LogSummary {
 public:
  // `what` names the events in a summary line, plural ("refused handshakes").
  explicit LogSummary(std::string what, int64_t period_ms = 10'000, size_t max_sources = 4096)
      : what_(std::move(what)), period_ms_(period_ms), max_sources_(max_sources) {}

  // Records one event from `source` (a key fingerprint, an identity, an address). `detail()`
  // returns the full line for it, and is called only when that line is needed: at once when no
  // line of this kind was logged within the period, or as the summary's first example.
  template <typename DetailFn>
  void Add(int64_t now_ms, const std::string& source, DetailFn&& detail) {
    if (pending_ == 0 && (!logged_once_ || now_ms - last_line_ms_ >= period_ms_)) {
      spdlog::warn("{}", detail());
      logged_once_ = true;
      last_line_ms_ = now_ms;
      return;
    }
    if (pending_ == 0) first_ = detail();
    ++pending_;
    if (sources_.size() < max_sources_) sources_.insert(source);
    Flush(now_ms);
  }

  // Logs the summary of the events counted since the last line, once the period has passed.
  void Flush(int64_t now_ms) {
    if (pending_ == 0 || now_ms - last_line_ms_ < period_ms_) return;
    const std::string sources = sources_.size() >= max_sources_
                                    ? "at least " + std::to_string(max_sources_)
                                    : std::to_string(sources_.size());
    spdlog::warn("{} {} in the last {:.1f} s from {} sources (first: {})", pending_, what_,
                 (now_ms - last_line_ms_) / 1000.0, sources, first_);
    pending_ = 0;
    sources_.clear();
    first_.clear();
    last_line_ms_ = now_ms;
  }

 private:
  std::string what_;
  int64_t period_ms_;
  size_t max_sources_;
  bool logged_once_ = false;
  int64_t last_line_ms_ = 0;
  uint64_t pending_ = 0;
  std::string first_;
  std::unordered_set<std::string> sources_;
};

}  // namespace huddle
