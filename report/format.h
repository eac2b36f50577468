// Text for the report page: escaping and number formatting.
//
// Every string that reaches the page from a job's files (a job name, a reason, a mechanism's
// description) goes through EscapeText first: it is safe in HTML text, in a quoted HTML or SVG
// attribute and in SVG <text>. Numbers are formatted here only, so the page and its tests agree
// on how a value looks ("941.9 MiB", "85.2%", "250 ms").
//
// Thread-safety: stateless functions.
#pragma once

#include <string>
#include <string_view>

namespace huddle::report {

// `text` with & < > " ' (and = ( ) @, so that no text spells "src=", "url(" or "@import")
// replaced by character references, control characters (other than tab
// and newline) by U+FFFD, invalid UTF-8 likewise, and cut to `max_chars` bytes (an ellipsis
// marks the cut), so that one hostile value cannot make the page unbounded.
std::string EscapeText(std::string_view text, size_t max_chars = 2000);

// How the values of an axis or a fact are written.
enum class ValueFormat {
  kNumber,   // 0.5077, 1234, 1.2M
  kInteger,  // 48
  kPercent,  // a fraction in [0, 1] as 85.2%
  kSeconds,  // 250 ms, 1.25 s, 312 s
  kBytes,    // 941.9 MiB (binary units)
};

// One value, about four significant digits ("1.561", "0.0001", "120.5 MiB", "85.23%").
std::string FormatValue(double value, ValueFormat format);

// A tick label: `value` on an axis whose ticks are `step` apart, with just the decimals the step
// needs ("0.25", "85%", "1.5 s"). `scale_max` is the axis' largest magnitude: bytes and seconds
// choose their unit from it, so that every tick of one axis uses the same unit.
std::string FormatTick(double value, double step, double scale_max, ValueFormat format);

// The unit (and its size) bytes are written in for values up to `max_bytes`: B, KiB, MiB, GiB, TiB.
struct ByteUnit {
  const char* name;
  double size;
};
ByteUnit ByteUnitFor(double max_bytes);

}  // namespace huddle::report
