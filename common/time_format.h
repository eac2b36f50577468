// Timestamps as written in outputs: ISO-8601 in UTC with milliseconds, "2026-11-28T22:51:03.123Z"
// (the `time` of metrics rows and ledger entries, and the log lines' prefix, common/logging.h).
// The value comes from Clock::WallMs (common/clock.h), so tests can fix it.
//
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace huddle {

// `unix_ms` (milliseconds since the Unix epoch) as "YYYY-MM-DDTHH:MM:SS.mmmZ". Exact (no time
// zone database, no locale) for years 0000-9999; outside them the year is written as it is.
std::string Iso8601Utc(int64_t unix_ms);

// The inverse of Iso8601Utc: exactly "YYYY-MM-DDTHH:MM:SS.mmmZ" (24 characters, a real calendar
// date, hours < 24, minutes and seconds < 60), else InvalidArgument naming the text.
StatusOr<int64_t> ParseIso8601Utc(std::string_view text);

}  // namespace huddle
