#include "report/format.h"

#include <cmath>
#include <cstdio>

namespace huddle::report {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed UTF-8 sequence at text[i], or 0 when it is not one.
size_t Utf8Length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  uint32_t code = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    code = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    code = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    code = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not characters.
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kMin[n] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return 0;
  return n;
}

std::string Printf(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

// "%.Nf" with N the decimals that `step` needs (at most 6).
int DecimalsFor(double step) {
  for (int d = 0; d < 6; ++d) {
    const double scaled = step * std::pow(10.0, d);
    if (std::fabs(scaled - std::round(scaled)) <= 1e-6 * scaled) return d;
  }
  return 6;
}

std::string Fixed(double value, double step) {
  char format[16];
  std::snprintf(format, sizeof(format), "%%.%df", DecimalsFor(step));
  return Printf(format, value);
}

// 1,234,567 (the integer part of `value`, rounded).
std::string Grouped(double value) {
  std::string digits = Printf("%.0f", std::fabs(value));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (value < 0 && digits != "0" ? "-" : "") + out;
}

struct SiScale {
  const char* suffix;
  double size;
};
SiScale SiScaleFor(double max_abs) {
  if (max_abs >= 1e9) return {"G", 1e9};
  if (max_abs >= 1e6) return {"M", 1e6};
  if (max_abs >= 1e4) return {"k", 1e3};
  return {"", 1};
}

}  // namespace

std::string EscapeText(std::string_view text, size_t max_chars) {
  std::string out;
  out.reserve(std::min(text.size(), max_chars) + 16);
  size_t i = 0;
  while (i < text.size()) {
    if (i >= max_chars) {
      out += "\xE2\x80\xA6";  // U+2026, the cut
      break;
    }
    const char c = text[i];
    const size_t n = Utf8Length(text, i);
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      // Never needed, but escaped so that no text of a job's files can spell a reference a
      // scanner looks for ("src=", "url(", "@import"), even as harmless text.
      case '=':
        out += "&#61;";
        break;
      case '(':
        out += "&#40;";
        break;
      case ')':
        out += "&#41;";
        break;
      case '@':
        out += "&#64;";
        break;
      case '\t':
      case '\n':
        out += c;
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          out += kReplacement;
        } else {
          out += c;
        }
    }
    ++i;
  }
  return out;
}

ByteUnit ByteUnitFor(double max_bytes) {
  static constexpr ByteUnit kUnits[] = {{"B", 1},
                                        {"KiB", 1024.0},
                                        {"MiB", 1024.0 * 1024},
                                        {"GiB", 1024.0 * 1024 * 1024},
                                        {"TiB", 1024.0 * 1024 * 1024 * 1024}};
  ByteUnit unit = kUnits[0];
  for (const ByteUnit& u : kUnits) {
    if (std::fabs(max_bytes) >= u.size) unit = u;
  }
  return unit;
}

std::string FormatValue(double value, ValueFormat format) {
  if (std::isnan(value)) return "n/a";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  switch (format) {
    case ValueFormat::kInteger:
      return Grouped(value);
    case ValueFormat::kPercent:
      return Printf("%.4g", value * 100) + "%";
    case ValueFormat::kSeconds:
      if (value != 0 && std::fabs(value) < 1) return Printf("%.4g", value * 1000) + " ms";
      if (std::fabs(value) < 1000) return Printf("%.4g", value) + " s";
      return Grouped(value) + " s";
    case ValueFormat::kBytes: {
      const ByteUnit unit = ByteUnitFor(value);
      if (unit.size == 1) return Grouped(value) + " B";
      return Printf("%.4g", value / unit.size) + " " + unit.name;
    }
    case ValueFormat::kNumber:
      break;
  }
  const SiScale si = SiScaleFor(std::fabs(value));
  return Printf("%.4g", value / si.size) + si.suffix;
}

std::string FormatTick(double value, double step, double scale_max, ValueFormat format) {
  if (step <= 0 || !std::isfinite(step)) return FormatValue(value, format);
  if (std::fabs(value) < step * 1e-9) value = 0;  // never "-0"
  scale_max = std::fabs(scale_max);
  switch (format) {
    case ValueFormat::kPercent:
      return Fixed(value * 100, step * 100) + "%";
    case ValueFormat::kSeconds:
      if (scale_max < 1) return Fixed(value * 1000, step * 1000) + " ms";
      return Fixed(value, step) + " s";
    case ValueFormat::kBytes: {
      const ByteUnit unit = ByteUnitFor(scale_max);
      return Fixed(value / unit.size, step / unit.size) + " " + unit.name;
    }
    case ValueFormat::kInteger:
    case ValueFormat::kNumber:
      break;
  }
  const SiScale si = SiScaleFor(scale_max);
  return Fixed(value / si.size, step / si.size) + si.suffix;
}

}  // namespace huddle::report
