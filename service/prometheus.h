// A writer of the Prometheus text exposition format, version 0.0.4, the body `huddle serve`
// answers on /metrics (service/http_endpoint.h serves it; Content-Type kPrometheusContentType).
// https://prometheus.io/docs/instrumenting/exposition_formats/
//
// The caller builds a snapshot, a list of MetricFamily values, and Render() turns it into text or
// refuses it: an invalid snapshot is an error Status naming the family and the rule it breaks,
// never an exposition a scraper would reject. Render() enforces the format's rules:
//   - metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* and do not
//     start with "__" (reserved for Prometheus itself);
//   - no two families share a name, nor a line name (a histogram `x` writes x_bucket, x_sum and
//     x_count, so a gauge `x_count` beside it is refused);
//   - within a family no label name appears twice in one sample and no two samples have the same
//     label set (compared as sets: order does not matter);
//   - HELP text and label values are valid UTF-8; histogram bucket bounds are finite and strictly
//     increasing;
// and the structural rules of `promtool check metrics` (its lint fails the check otherwise):
//   - HELP is not empty; metric names hold no ':' (kept for recording rules);
//   - a counter's name ends in "_total" and no other family's does; counter values are >= 0;
//   - an info family's name ends in "_info" and its values are 1;
//   - only a histogram's lines end in "_bucket", "_sum" or "_count" (a histogram's own name may
//     end in none of them); no sample carries the label "le" (the writer adds it to buckets) or
//     "quantile" (summaries').
// Naming style (snake_case, base units such as _seconds and _bytes) is left to promtool's lint.
// It escapes HELP text (\ and newline) and label values (\, " and newline), writes each family's
// HELP and TYPE lines once, then its samples in the order they were added, labels in the order
// given. A family without samples writes nothing (its name is still checked).
//
// Values are written so that Prometheus (Go's strconv.ParseFloat) reads back the very double:
// "NaN", "+Inf", "-Inf"; an integral value below 2^53 in magnitude as plain digits ("1234567",
// where Go's own writer says "1.234567e+06"); any other value as the shortest text that reads back
// to the same double (std::to_chars), e.g. "0.1", "1.5e-07", "1e+20".
//
// Thread-safety: MetricFamily and Histogram are plain values without internal locking; a value
// being modified must not be read concurrently. The usual shape: the owner keeps its counters and
// Histograms under its own mutex and builds the families from a copy when /metrics is scraped.
// Render() is a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace huddle::service {

// The Content-Type of an exposition rendered by Render().
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// A sample's labels, (name, value) pairs, written in this order.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A histogram with fixed bucket upper bounds (inclusive: an observation v falls in the first
// bucket whose bound b has v <= b; above the last bound it counts only in the implicit "+Inf"
// bucket). Keeps per-bucket counts, the count and the sum of observations; units are the caller's
// (name the metric after them: `_seconds`, `_bytes`). A NaN observation counts in "+Inf" and
// makes the sum NaN, as Prometheus's Go client does. Not thread-safe (see the file comment).
class Histogram {
 public:
  // `upper_bounds`: finite and strictly increasing (may be empty: only "+Inf"). InvalidArgument
  // naming the offending bound otherwise.
  static StatusOr<Histogram> Create(std::vector<double> upper_bounds);

  // Bounds start, start*factor, ..., n of them (start > 0, factor > 1, n >= 1).
  static StatusOr<Histogram> Exponential(double start, double factor, int n);

  void Observe(double value);

  const std::vector<double>& upper_bounds() const { return upper_bounds_; }
  // Cumulative counts: element i counts observations <= upper_bounds()[i]; one more element, the
  // last, counts every observation ("+Inf", equal to count()).
  std::vector<uint64_t> CumulativeCounts() const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  explicit Histogram(std::vector<double> upper_bounds);

  std::vector<double> upper_bounds_;
  std::vector<uint64_t> bucket_counts_;  // per bucket, not cumulative; last is (bound, +Inf]
  uint64_t count_ = 0;
  double sum_ = 0;
};

// The kinds of family the service exposes. kInfo is written as TYPE gauge (0.0.4 has no info
// type): a family `<name>_info` whose samples carry labels and the value 1, e.g.
// huddle_build_info{version="0.1.0",revision="abc"} 1.
enum class MetricType { kCounter, kGauge, kHistogram, kInfo };

// One metric family: a name, its HELP text, its type and its samples, each a label set with a
// value (counter, gauge, info) or a Histogram (histogram). Build one with the factory of its type
// and Add(); the checks happen in Render(), so building never fails. Copyable value.
class MetricFamily {
 public:
  static MetricFamily Counter(std::string name, std::string help);
  static MetricFamily Gauge(std::string name, std::string help);
  static MetricFamily HistogramFamily(std::string name, std::string help);
  // An info family with its one sample (`labels`, value 1); Add(labels, 1.0) adds more.
  static MetricFamily Info(std::string name, std::string help, Labels labels);

  // Adds a sample with a value (counter, gauge, info) ...
  MetricFamily& Add(Labels labels, double value);
  MetricFamily& Add(double value) { return Add(Labels{}, value); }
  // ... or with a histogram (histogram families). The wrong kind of sample for the family's type
  // is refused by Render().
  MetricFamily& Add(Labels labels, Histogram histogram);

  struct Sample {
    Labels labels;
    std::variant<double, Histogram> value;
  };

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<Sample>& samples() const { return samples_; }

 private:
  MetricFamily(std::string name, std::string help, MetricType type);

  std::string name_;
  std::string help_;
  MetricType type_;
  std::vector<Sample> samples_;
};

// The exposition of `families`, in the order given; InvalidArgument naming the family and the
// rule when the snapshot breaks one of the rules in the file comment (nothing is written then).
StatusOr<std::string> Render(const std::vector<MetricFamily>& families);

// A float64 as the exposition writes it (see the file comment), e.g. "0.25", "+Inf", "42".
std::string FormatPrometheusValue(double value);

// Whether `name` is a valid metric name / label name (label names: "__" prefix refused too).
bool IsValidMetricName(std::string_view name);
bool IsValidLabelName(std::string_view name);

}  // namespace huddle::service
