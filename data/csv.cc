#include "data/csv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

namespace huddle::data {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t'; }

// One comma-separated field, trimmed, with the 1-based column where its text starts.
struct Field {
  std::string_view text;
  int64_t column = 0;
};

void SplitFields(std::string_view line, std::vector<Field>* fields) {
  fields->clear();
  size_t start = 0;
  while (true) {
    size_t end = line.find(',', start);
    if (end == std::string_view::npos) end = line.size();
    size_t first = start, last = end;
    while (first < last && IsBlank(line[first])) ++first;
    while (last > first && IsBlank(line[last - 1])) --last;
    fields->push_back({line.substr(first, last - first), static_cast<int64_t>(first) + 1});
    if (end == line.size()) break;
    start = end + 1;
  }
}

// from_chars rejects a leading '+'; CSV writers sometimes emit one.
std::string_view SkipPlus(std::string_view s) {
  return s.size() > 1 && s[0] == '+' ? s.substr(1) : s;
}

bool IsNumber(std::string_view s) {
  s = SkipPlus(s);
  double value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

// Accumulates rows line by line; Finish() returns the dataset.
class CsvParser {
 public:
  CsvParser(const std::string& name, const CsvOptions& options) : name_(name), options_(options) {}

  Status AddLine(std::string_view line) {
    ++line_number_;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) return absl::OkStatus();
    SplitFields(line, &fields_);
    const auto width = static_cast<int64_t>(fields_.size());
    if (!seen_first_line_) {
      seen_first_line_ = true;
      if (!IsNumber(fields_[0].text)) {
        header_width_ = width;
        return absl::OkStatus();
      }
    }
    if (width_ == 0) {
      if (width < 2) return Error(1, "a row needs a label and at least one feature");
      if (header_width_ != 0 && header_width_ != width) {
        return Error(1,
                     absl::StrCat("row has ", width, " fields but the header has ", header_width_));
      }
      width_ = width;
      dataset_.feature_dim = width - 1;
    } else if (width != width_) {
      return Error(1, absl::StrCat("row has ", width, " fields, expected ", width_, " like line ",
                                   first_row_line_));
    }
    if (first_row_line_ == 0) first_row_line_ = line_number_;
    HUDDLE_RETURN_IF_ERROR(AddLabel(fields_[0]));
    for (size_t i = 1; i < fields_.size(); ++i) HUDDLE_RETURN_IF_ERROR(AddFeature(fields_[i]));
    return absl::OkStatus();
  }

  StatusOr<Dataset> Finish() {
    if (dataset_.labels.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": no examples"));
    }
    return std::move(dataset_);
  }

 private:
  Status Error(int64_t column, const std::string& message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ":", line_number_, ":", column, ": ", message));
  }

  Status AddLabel(const Field& field) {
    const std::string_view s = SkipPlus(field.text);
    int64_t label = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), label);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
      return Error(field.column,
                   absl::StrCat("label '", std::string(field.text), "' is not an integer"));
    }
    if (label < 0 || label >= options_.num_classes) {
      return Error(field.column,
                   absl::StrCat("label ", label, " is outside [0, ", options_.num_classes, ")"));
    }
    dataset_.labels.push_back(static_cast<int32_t>(label));
    return absl::OkStatus();
  }

  Status AddFeature(const Field& field) {
    const std::string_view s = SkipPlus(field.text);
    if (s.empty()) return Error(field.column, "empty feature field");
    float value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec == std::errc::result_out_of_range) {
      return Error(field.column,
                   absl::StrCat("feature '", std::string(field.text), "' is out of float range"));
    }
    if (ec != std::errc() || end != s.data() + s.size()) {
      return Error(field.column,
                   absl::StrCat("feature '", std::string(field.text), "' is not a number"));
    }
    if (!std::isfinite(value)) {
      return Error(field.column,
                   absl::StrCat("feature '", std::string(field.text), "' is not finite"));
    }
    dataset_.features.push_back(options_.scale_255 ? value / 255.0f : value);
    return absl::OkStatus();
  }

  const std::string name_;
  const CsvOptions options_;
  Dataset dataset_;
  std::vector<Field> fields_;  // scratch, reused across lines
  int64_t line_number_ = 0;
  int64_t width_ = 0;           // fields per row, set by the first row
  int64_t header_width_ = 0;    // 0 when there is no header
  int64_t first_row_line_ = 0;  // line of the first data row
  bool seen_first_line_ = false;
};

Status CheckOptions(const std::string& name, const CsvOptions& options) {
  if (options.num_classes < 1 || options.num_classes > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": num_classes ", options.num_classes, " is outside [1, 2^31)"));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<Dataset> ParseCsvDataset(std::string_view text, const std::string& name,
                                  const CsvOptions& options) {
  HUDDLE_RETURN_IF_ERROR(CheckOptions(name, options));
  CsvParser parser(name, options);
  while (!text.empty()) {
    size_t end = text.find('\n');
    if (end == std::string_view::npos) end = text.size();
    HUDDLE_RETURN_IF_ERROR(parser.AddLine(text.substr(0, end)));
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  HUDDLE_ASSIGN_OR_RETURN(Dataset dataset, parser.Finish());
  dataset.num_classes = options.num_classes;
  return dataset;
}

StatusOr<Dataset> LoadCsvDataset(const std::string& path, const CsvOptions& options) {
  HUDDLE_RETURN_IF_ERROR(CheckOptions(path, options));
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a CSV file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open for reading"));
  CsvParser parser(path, options);
  std::string line;
  while (std::getline(in, line)) HUDDLE_RETURN_IF_ERROR(parser.AddLine(line));
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  HUDDLE_ASSIGN_OR_RETURN(Dataset dataset, parser.Finish());
  dataset.num_classes = options.num_classes;
  return dataset;
}

}  // namespace huddle::data
