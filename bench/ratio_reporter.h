// Console output plus, after the run, one ratio per group of benchmarks measured in the same run:
// numerator bytes/s over denominator bytes/s (medians when --benchmark_repetitions is given). The
// benchmarks report ratios against a baseline, never absolute timings alone.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"

namespace huddle::bench {

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  // Maps a run to {group, variant}; runs whose variant is neither `numerator` nor `denominator`
  // are not part of a ratio.
  using Classify = std::function<std::pair<std::string, std::string>(const Run&)>;

  RatioReporter(Classify classify, std::string numerator, std::string denominator,
                std::string ratio_name)
      : classify_(std::move(classify)),
        numerator_(std::move(numerator)),
        denominator_(std::move(denominator)),
        ratio_name_(std::move(ratio_name)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool median = run.aggregate_name == "median";
      if (!median && !run.aggregate_name.empty()) continue;
      auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      auto [group, variant] = classify_(run);
      Measurement& m = rates_[group][variant];
      if (median || !m.median) m = {it->second.value, median};
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    for (const auto& [group, by_variant] : rates_) {
      auto num = by_variant.find(numerator_);
      auto den = by_variant.find(denominator_);
      if (num == by_variant.end() || den == by_variant.end()) continue;
      GetOutputStream() << group << ": " << numerator_ << " " << num->second.bytes_per_second / 1e9
                        << " GB/s, " << denominator_ << " " << den->second.bytes_per_second / 1e9
                        << " GB/s, " << ratio_name_ << " = "
                        << num->second.bytes_per_second / den->second.bytes_per_second << "\n";
    }
  }

 private:
  struct Measurement {
    double bytes_per_second = 0;
    bool median = false;
  };
  Classify classify_;
  std::string numerator_;
  std::string denominator_;
  std::string ratio_name_;
  std::map<std::string, std::map<std::string, Measurement>> rates_;
};

}  // namespace huddle::bench
