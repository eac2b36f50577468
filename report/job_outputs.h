// A job's output directory, read for the report (report/report.h): the files a federated job
// (`huddle coordinator`, `huddle run`, a service's job) or a `huddle datacenter` job writes, in
// the formats README's "Outputs" gives, reduced to what the page plots.
//
// A directory being written is read as it stands: a missing file is "no data yet", and the last
// line of a JSON-lines file that has no newline yet (a row being appended) is left out. Every
// other line must be one JSON object with its round (or epoch) number, else DataLoss naming the
// file and the line; summary.json and privacy.json (written atomically) must be whole JSON
// objects. No file is read past its size limit (FailedPrecondition naming both sizes).
//
// Under DP (privacy.json, operator_metrics.jsonl, or DP fields in the rows or the summary) the
// operator-only files (operator_metrics.jsonl, participation.jsonl) are read only when asked
// for: a report that will not show them does not read them.
//
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace huddle::report {

// One row of a JSON-lines file, flattened: a number or a boolean (1 or 0) under its key, a nested
// object's fields as "outer.inner" (one level deep), strings alike (cut at 200 bytes); nulls and
// arrays left out.
struct Row {
  double x = 0;  // its round or epoch
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> strings;
  std::optional<double> Get(const std::string& key) const;
};

struct RowsFile {
  bool present = false;  // the file exists
  std::vector<Row> rows;
  bool partial_last_line = false;  // its last line was being written and was left out
};

// The rows of a JSON-lines file whose rows are numbered by `x_key` ("round" or "epoch"): a missing
// file gives present = false. `participation`: participation.jsonl's rows, whose lists become
// counts (sampled, contributed, and each outcome of "left": dropped, declined, failed, refused).
StatusOr<RowsFile> ReadRows(const std::string& path, const std::string& x_key, uint64_t max_bytes,
                            bool participation = false);

// A whole JSON object file, nullopt when missing.
StatusOr<std::optional<nlohmann::json>> ReadJsonObject(const std::string& path, uint64_t max_bytes);

// model.bin's tensors as its headers give them (common/tensor_io.h), the values skipped.
struct ModelFileInfo {
  int64_t tensors = 0;
  int64_t parameters = 0;
};
StatusOr<std::optional<ModelFileInfo>> ReadModelHeader(const std::string& path);

struct JobOutputs {
  std::string dir;
  bool datacenter = false;                // rows by epoch (huddle datacenter), not by round
  bool dp = false;                        // the outputs are split into public and operator-only
  // Buffered asynchronous training: the rows are server steps (summary.json's training.mode, or
  // while the job runs, its rows' `async` objects).
  bool async = false;
  bool virtual_clock = false;  // summary.json's training.clock: the times are simulated
  // What a row is: "epoch" (datacenter), "step" (asynchronous) or "round".
  const char* unit() const { return datacenter ? "epoch" : async ? "step" : "round"; }
  std::optional<nlohmann::json> summary;  // summary.json (written at the end)
  std::optional<nlohmann::json> privacy;  // privacy.json
  RowsFile metrics;                       // metrics.jsonl
  RowsFile operator_metrics;              // operator_metrics.jsonl; without DP a copy of `metrics`
  RowsFile participation;  // participation.jsonl, read only where the rows count no cohort
  bool operator_files_read = false;
  // The service's record of the job (STATE/jobs/NAME/state.json beside OUT, or the one `huddle
  // run` keeps in OUT/service): its state and reason; nullopt where there is none.
  std::optional<nlohmann::json> record;
  std::string model_config;  // the job.yaml's `model:` as one line of YAML ("" where none)
  std::optional<ModelFileInfo> model;
};

struct ReadLimits {
  uint64_t max_rows_file_bytes = uint64_t{256} << 20;  // each JSON-lines file
  uint64_t max_json_file_bytes = uint64_t{16} << 20;   // summary, privacy, state, job.yaml
};

// Reads `out_dir` (NotFound when it does not exist, InvalidArgument when it is not a directory).
// `operator_view`: also the operator-only files under DP (without DP every file is read).
StatusOr<JobOutputs> ReadJobOutputs(const std::string& out_dir, bool operator_view,
                                    const ReadLimits& limits = {});

}  // namespace huddle::report
