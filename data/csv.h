// Loading a classification dataset from a CSV file a user points a client at.
//
// Format: one example per line, `label,f0,f1,...` with an integer label in [0, num_classes) and
// float features. Every row has the same number of fields (at least two). Spaces around fields
// and Windows line endings are accepted; blank lines are skipped. If the first field of the first
// non-blank line is not a number, that line is a header: it is skipped, and its width must match
// the rows'. Non-finite features (nan, inf) are rejected.
//
// Errors are InvalidArgument (NotFound for a missing file) and point at the offending spot as
// `name:line:column: message` (1-based line and column).
//
// Thread-safety: stateless functions; safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "data/dataset.h"

namespace huddle::data {

struct CsvOptions {
  int64_t num_classes = 10;  // labels must lie in [0, num_classes)
  bool scale_255 = false;    // divide every feature by 255 (raw 0..255 pixel values)
};

// Reads the CSV file at `path` line by line.
StatusOr<Dataset> LoadCsvDataset(const std::string& path, const CsvOptions& options = {});

// Parses CSV text held in memory; `name` stands for the file in error messages.
StatusOr<Dataset> ParseCsvDataset(std::string_view text, const std::string& name,
                                  const CsvOptions& options = {});

}  // namespace huddle::data
