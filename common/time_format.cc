#include "common/time_format.h"

#include <fmt/format.h>

#include <chrono>

namespace huddle {

namespace chr = std::chrono;

std::string Iso8601Utc(int64_t unix_ms) {
  const chr::sys_time<chr::milliseconds> t{chr::milliseconds(unix_ms)};
  const chr::sys_days day = chr::floor<chr::days>(t);  // floor: before 1970 too
  const chr::year_month_day ymd{day};
  const chr::hh_mm_ss<chr::milliseconds> hms{t - day};
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                     hms.hours().count(), hms.minutes().count(), hms.seconds().count(),
                     hms.subseconds().count());
}

StatusOr<int64_t> ParseIso8601Utc(std::string_view text) {
  // "YYYY-MM-DDTHH:MM:SS.mmmZ": digits everywhere but these positions.
  constexpr std::string_view kShape = "dddd-dd-ddTdd:dd:dd.dddZ";
  auto invalid = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("'", absl::string_view(text.data(), text.size()),
                     "' is not an ISO-8601 UTC time of the form YYYY-MM-DDTHH:MM:SS.mmmZ"));
  };
  if (text.size() != kShape.size()) return invalid();
  for (size_t i = 0; i < kShape.size(); ++i) {
    const bool digit = text[i] >= '0' && text[i] <= '9';
    if (kShape[i] == 'd' ? !digit : text[i] != kShape[i]) return invalid();
  }
  auto field = [&](size_t at, size_t len) {
    int v = 0;
    for (size_t i = at; i < at + len; ++i) v = v * 10 + (text[i] - '0');
    return v;
  };
  const chr::year_month_day ymd{chr::year(field(0, 4)),
                                chr::month(static_cast<unsigned>(field(5, 2))),
                                chr::day(static_cast<unsigned>(field(8, 2)))};
  const int hours = field(11, 2), minutes = field(14, 2), seconds = field(17, 2);
  if (!ymd.ok() || hours > 23 || minutes > 59 || seconds > 59) return invalid();
  const chr::milliseconds since_day = chr::hours(hours) + chr::minutes(minutes) +
                                      chr::seconds(seconds) + chr::milliseconds(field(20, 3));
  return (chr::sys_days(ymd).time_since_epoch() + since_day).count();
}

}  // namespace huddle
