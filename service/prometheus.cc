#include "service/prometheus.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>

namespace huddle::service {
namespace {

constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Go's utf8.ValidString: no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (n == 3 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

void AppendEscaped(std::string_view s, bool quote, std::string* out) {
  for (char c : s) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (quote && c == '"') {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

const char* TypeWord(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kHistogram:
      return "histogram";
    case MetricType::kGauge:
    case MetricType::kInfo:
      break;
  }
  return "gauge";
}

// The names a family's lines carry (a histogram's three, any other's own).
std::vector<std::string> LineNames(const MetricFamily& family) {
  if (family.type() != MetricType::kHistogram) return {family.name()};
  return {family.name() + "_bucket", family.name() + "_sum", family.name() + "_count"};
}

Status Invalid(const MetricFamily& family, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("metric family '", family.name(), "' (", TypeWord(family.type()),
                   family.type() == MetricType::kInfo ? " info" : "", "): ", what));
}

Status ValidateName(const MetricFamily& family) {
  const std::string& name = family.name();
  if (!IsValidMetricName(name)) {
    return Invalid(family, "the name does not match [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  if (name.find(':') != std::string::npos) {
    return Invalid(family, "the name holds ':', which is kept for recording rules");
  }
  if (family.help().empty()) return Invalid(family, "the HELP text is empty");
  if (!IsValidUtf8(family.help())) return Invalid(family, "the HELP text is not valid UTF-8");
  const bool counter = family.type() == MetricType::kCounter;
  if (counter != EndsWith(name, "_total")) {
    return Invalid(family, counter ? "a counter's name must end in '_total'"
                                   : "only a counter's name may end in '_total'");
  }
  if (family.type() == MetricType::kInfo && !EndsWith(name, "_info")) {
    return Invalid(family, "an info family's name must end in '_info'");
  }
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (EndsWith(name, suffix)) {
      return Invalid(family, absl::StrCat("the name ends in '", suffix,
                                          "', which only a histogram's own lines may"));
    }
  }
  return absl::OkStatus();
}

Status ValidateSample(const MetricFamily& family, size_t index, const MetricFamily::Sample& s) {
  const std::string where = absl::StrCat("sample ", index, ": ");
  std::set<std::string> names;
  for (const auto& [name, value] : s.labels) {
    if (!IsValidLabelName(name)) {
      return Invalid(family, absl::StrCat(where, "label name '", name,
                                          "' is not [a-zA-Z_][a-zA-Z0-9_]* or starts with '__'"));
    }
    if (name == "le" || name == "quantile") {
      return Invalid(family, absl::StrCat(where, "label name '", name,
                                          "' is reserved for histogram buckets and summaries"));
    }
    if (!names.insert(name).second) {
      return Invalid(family, absl::StrCat(where, "label '", name, "' appears twice"));
    }
    if (!IsValidUtf8(value)) {
      return Invalid(family, absl::StrCat(where, "label '", name, "' has a non-UTF-8 value"));
    }
  }
  const bool histogram = family.type() == MetricType::kHistogram;
  if (histogram != std::holds_alternative<Histogram>(s.value)) {
    return Invalid(family, absl::StrCat(where, histogram ? "holds a number, not a histogram"
                                                         : "holds a histogram, not a number"));
  }
  if (histogram) return absl::OkStatus();
  const double v = std::get<double>(s.value);
  if (family.type() == MetricType::kCounter && !(v >= 0)) {
    return Invalid(family, absl::StrCat(where, "a counter's value must be >= 0, not ",
                                        FormatPrometheusValue(v)));
  }
  if (family.type() == MetricType::kInfo && v != 1) {
    return Invalid(family, absl::StrCat(where, "an info sample's value must be 1, not ",
                                        FormatPrometheusValue(v)));
  }
  return absl::OkStatus();
}

// name{labels[,le="bound"]} value\n
void AppendLine(std::string_view name, const Labels& labels, const std::string* le,
                std::string_view value, std::string* out) {
  out->append(name);
  if (!labels.empty() || le != nullptr) {
    out->push_back('{');
    bool first = true;
    for (const auto& [label, label_value] : labels) {
      if (!first) out->push_back(',');
      first = false;
      absl::StrAppend(out, label, "=\"");
      AppendEscaped(label_value, /*quote=*/true, out);
      out->push_back('"');
    }
    if (le != nullptr) absl::StrAppend(out, first ? "" : ",", "le=\"", *le, "\"");
    out->push_back('}');
  }
  absl::StrAppend(out, " ", absl::string_view(value.data(), value.size()), "\n");
}

void AppendFamily(const MetricFamily& family, std::string* out) {
  absl::StrAppend(out, "# HELP ", family.name(), " ");
  AppendEscaped(family.help(), /*quote=*/false, out);
  absl::StrAppend(out, "\n# TYPE ", family.name(), " ", TypeWord(family.type()), "\n");
  for (const MetricFamily::Sample& sample : family.samples()) {
    if (const double* v = std::get_if<double>(&sample.value)) {
      AppendLine(family.name(), sample.labels, nullptr, FormatPrometheusValue(*v), out);
      continue;
    }
    const auto& h = std::get<Histogram>(sample.value);
    const std::vector<uint64_t> cumulative = h.CumulativeCounts();
    const std::string bucket = family.name() + "_bucket";
    for (size_t i = 0; i < cumulative.size(); ++i) {
      const std::string le =
          i < h.upper_bounds().size() ? FormatPrometheusValue(h.upper_bounds()[i]) : "+Inf";
      AppendLine(bucket, sample.labels, &le, std::to_string(cumulative[i]), out);
    }
    AppendLine(family.name() + "_sum", sample.labels, nullptr, FormatPrometheusValue(h.sum()), out);
    AppendLine(family.name() + "_count", sample.labels, nullptr, std::to_string(h.count()), out);
  }
}

}  // namespace

bool IsValidMetricName(std::string_view name) {
  if (name.empty() || !(IsNameStart(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return IsNameChar(c) || c == ':'; });
}

bool IsValidLabelName(std::string_view name) {
  if (name.empty() || !IsNameStart(name[0]) || name.starts_with("__")) return false;
  return std::all_of(name.begin(), name.end(), IsNameChar);
}

std::string FormatPrometheusValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::trunc(value) && std::fabs(value) < kMaxExactInteger) {
    return std::to_string(static_cast<int64_t>(value));
  }
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// ---- Histogram ----

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), bucket_counts_(upper_bounds_.size() + 1, 0) {}

StatusOr<Histogram> Histogram::Create(std::vector<double> upper_bounds) {
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat("histogram bound ", i, " is ",
                                                     FormatPrometheusValue(upper_bounds[i]),
                                                     "; bounds must be finite (+Inf is implicit)"));
    }
    if (i > 0 && !(upper_bounds[i] > upper_bounds[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram bound ", i, " (", FormatPrometheusValue(upper_bounds[i]),
          ") is not above bound ", i - 1, " (", FormatPrometheusValue(upper_bounds[i - 1]), ")"));
    }
  }
  return Histogram(std::move(upper_bounds));
}

StatusOr<Histogram> Histogram::Exponential(double start, double factor, int n) {
  if (!(start > 0) || !(factor > 1) || n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("exponential histogram needs start > 0, ",
                                                   "factor > 1 and n >= 1, not start ", start,
                                                   ", factor ", factor, ", n ", n));
  }
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < n; ++i, bound *= factor) bounds.push_back(bound);
  return Create(std::move(bounds));
}

void Histogram::Observe(double value) {
  size_t bucket = upper_bounds_.size();  // +Inf, and NaN
  if (!std::isnan(value)) {
    bucket =
        static_cast<size_t>(std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) -
                            upper_bounds_.begin());
  }
  ++bucket_counts_[bucket];
  ++count_;
  sum_ += value;
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> cumulative(bucket_counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < bucket_counts_.size(); ++i) cumulative[i] = running += bucket_counts_[i];
  return cumulative;
}

// ---- MetricFamily ----

MetricFamily::MetricFamily(std::string name, std::string help, MetricType type)
    : name_(std::move(name)), help_(std::move(help)), type_(type) {}

MetricFamily MetricFamily::Counter(std::string name, std::string help) {
  return MetricFamily(std::move(name), std::move(help), MetricType::kCounter);
}
MetricFamily MetricFamily::Gauge(std::string name, std::string help) {
  return MetricFamily(std::move(name), std::move(help), MetricType::kGauge);
}
MetricFamily MetricFamily::HistogramFamily(std::string name, std::string help) {
  return MetricFamily(std::move(name), std::move(help), MetricType::kHistogram);
}
MetricFamily MetricFamily::Info(std::string name, std::string help, Labels labels) {
  MetricFamily family(std::move(name), std::move(help), MetricType::kInfo);
  family.Add(std::move(labels), 1.0);
  return family;
}

MetricFamily& MetricFamily::Add(Labels labels, double value) {
  samples_.push_back(Sample{std::move(labels), value});
  return *this;
}
MetricFamily& MetricFamily::Add(Labels labels, Histogram histogram) {
  samples_.push_back(Sample{std::move(labels), std::move(histogram)});
  return *this;
}

// ---- Render ----

StatusOr<std::string> Render(const std::vector<MetricFamily>& families) {
  std::map<std::string, std::string> claimed;  // family or line name -> family claiming it
  for (const MetricFamily& family : families) {
    HUDDLE_RETURN_IF_ERROR(ValidateName(family));
    std::vector<std::string> names = LineNames(family);
    if (family.type() == MetricType::kHistogram) names.push_back(family.name());
    for (const std::string& name : names) {
      auto [it, inserted] = claimed.emplace(name, family.name());
      if (!inserted) {
        return Invalid(family, absl::StrCat("the name '", name, "' is already used by family '",
                                            it->second, "'"));
      }
    }
    std::set<Labels> label_sets;
    for (size_t i = 0; i < family.samples().size(); ++i) {
      const MetricFamily::Sample& sample = family.samples()[i];
      HUDDLE_RETURN_IF_ERROR(ValidateSample(family, i, sample));
      Labels sorted = sample.labels;
      std::sort(sorted.begin(), sorted.end());
      if (!label_sets.insert(std::move(sorted)).second) {
        return Invalid(family, absl::StrCat("sample ", i,
                                            " repeats the label set of an earlier "
                                            "sample"));
      }
    }
  }
  std::string out;
  for (const MetricFamily& family : families) {
    if (!family.samples().empty()) AppendFamily(family, &out);
  }
  return out;
}

}  // namespace huddle::service
