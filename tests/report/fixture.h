// Output directories for the report's tests, written file by file: a job's rows, its summary,
// its privacy statement, a row being appended, a damaged line.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/testing/temp_dir.h"

namespace huddle::report::testing {

using nlohmann::json;

class JobDir {
 public:
  JobDir() : dir_("report") {}
  const std::string& path() const { return dir_.path(); }
  std::string operator/(const std::string& file) const { return dir_ / file; }

  // Appends `row` as one complete line of `file`.
  void AppendRow(const std::string& file, const json& row) { Append(file, row.dump() + "\n"); }
  // Appends `text` as it is (no newline: a row being written).
  void Append(const std::string& file, const std::string& text) {
    std::ofstream out(dir_ / file, std::ios::app | std::ios::binary);
    out << text;
  }
  void Write(const std::string& file, const std::string& text) {
    std::ofstream out(dir_ / file, std::ios::trunc | std::ios::binary);
    out << text;
  }
  void WriteJson(const std::string& file, const json& object) { Write(file, object.dump(2)); }

  // A plain (non-DP) federated round as metrics.jsonl holds it.
  static json PlainRound(int round) {
    return {{"round", round},
            {"time", "2026-11-29T05:44:44.523Z"},
            {"clients_sampled", 48},
            {"results", 47},
            {"dropped", 1},
            {"rejected", 0},
            {"stale", 0},
            {"malformed", 0},
            {"declined", 0},
            {"failed", 0},
            {"updated", true},
            {"examples", 2880},
            {"train_loss", 1.3},
            {"test_accuracy", 0.6 + 0.01 * round},
            {"test_loss", 0.9 - 0.01 * round},
            {"duration_s", 0.09},
            {"upload_s", {{"count", 47}, {"sum", 0.5}, {"max", 0.07}}},
            {"upload_seconds", {0.07, 0.01}},
            {"bytes_in", 19549104},
            {"bytes_out", 19548768},
            {"elapsed_s", 0.1 * round}};
  }

 private:
  huddle::testing::ScopedTempDir dir_;
};

}  // namespace huddle::report::testing
