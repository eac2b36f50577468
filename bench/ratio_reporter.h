// Console output plus, after the run, one ratio per group of benchmarks measured in the same run
// and per rate counter (bytes_per_second unless told otherwise): the numerator's rate over the
// denominator's (medians when --benchmark_repetitions is given). The benchmarks report ratios
// against a baseline, never absolute timings alone.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"

namespace huddle::bench {

// Calls f(run, counter, rate, median) for every rate counter named in `counters` of every run
// that is a plain measurement or the median of repetitions (failed runs and other aggregates are
// skipped). A median should replace a plain measurement of the same benchmark.
template <typename F>
void ForEachRate(const std::vector<benchmark::BenchmarkReporter::Run>& runs,
                 const std::vector<std::string>& counters, F&& f) {
  for (const auto& run : runs) {
    if (run.error_occurred) continue;
    const bool median = run.aggregate_name == "median";
    if (!median && !run.aggregate_name.empty()) continue;
    for (const std::string& counter : counters) {
      auto it = run.counters.find(counter);
      if (it != run.counters.end()) f(run, counter, it->second.value, median);
    }
  }
}

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  // Maps a run to {group, variant}; runs whose variant is neither `numerator` nor `denominator`
  // are not part of a ratio.
  using Classify = std::function<std::pair<std::string, std::string>(const Run&)>;

  // `counters`: the rate counters (in units per second, printed as G/s) to take ratios of.
  RatioReporter(Classify classify, std::string numerator, std::string denominator,
                std::string ratio_name, std::vector<std::string> counters = {"bytes_per_second"})
      : classify_(std::move(classify)),
        denominator_(std::move(denominator)),
        counters_(std::move(counters)) {
    ratios_.emplace_back(std::move(numerator), std::move(ratio_name));
  }

  // Also reports `ratio_name` = `numerator`'s rate over the same denominator's, per group.
  void AddRatio(std::string numerator, std::string ratio_name) {
    ratios_.emplace_back(std::move(numerator), std::move(ratio_name));
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    ForEachRate(runs, counters_,
                [&](const Run& run, const std::string& counter, double rate, bool median) {
                  auto [group, variant] = classify_(run);
                  Measurement& m = rates_[counter][group][variant];
                  if (median || !m.median) m = {rate, median};
                });
    ConsoleReporter::ReportRuns(runs);
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    for (const std::string& counter : counters_) {
      for (const auto& [group, by_variant] : rates_[counter]) {
        for (const auto& [numerator, ratio_name] : ratios_) {
          auto num = by_variant.find(numerator);
          auto den = by_variant.find(denominator_);
          if (num == by_variant.end() || den == by_variant.end()) continue;
          GetOutputStream() << group << " " << counter << ": " << numerator << " "
                            << num->second.rate / 1e9 << " G/s, " << denominator_ << " "
                            << den->second.rate / 1e9 << " G/s, " << ratio_name << " = "
                            << num->second.rate / den->second.rate << "\n";
        }
      }
    }
  }

 private:
  struct Measurement {
    double rate = 0;
    bool median = false;
  };
  Classify classify_;
  std::string denominator_;
  std::vector<std::string> counters_;
  std::vector<std::pair<std::string, std::string>> ratios_;  // {numerator, ratio name}
  // counter -> group -> variant -> rate
  std::map<std::string, std::map<std::string, std::map<std::string, Measurement>>> rates_;
};

}  // namespace huddle::bench
