#include "report/job_outputs.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>

#include "common/file_util.h"
#include "common/tensor_io.h"

namespace huddle::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxString = 200;

std::string Join(const std::string& dir, const std::string& file) {
  return (fs::path(dir) / file).string();
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string ParseMessage(const std::exception& e) {
  std::string what = e.what();
  if (const size_t end = what.find("] ");
      what.rfind("[json.exception", 0) == 0 && end != what.npos) {
    what = what.substr(end + 2);
  }
  return what;
}

void Put(Row* row, const std::string& key, const json& v) {
  if (v.is_number()) {
    const double d = v.get<double>();
    if (std::isfinite(d)) row->numbers[key] = d;
  } else if (v.is_boolean()) {
    row->numbers[key] = v.get<bool>() ? 1 : 0;
  } else if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s.size() > kMaxString) s.resize(kMaxString);
    row->strings[key] = std::move(s);
  }
}

void Flatten(const json& object, Row* row) {
  for (const auto& [key, v] : object.items()) {
    if (v.is_object()) {
      for (const auto& [inner, w] : v.items()) Put(row, key + "." + inner, w);
    } else {
      Put(row, key, v);
    }
  }
}

// participation.jsonl: {"round", "time", "sampled": [ids], "contributed": [ids],
// "left": {id: {"outcome", "why"}}} as counts; the ids themselves are never kept.
void Participation(const json& object, Row* row) {
  for (const char* outcome : {"dropped", "declined", "failed", "refused"}) {
    row->numbers[outcome] = 0;
  }
  for (const char* list : {"sampled", "contributed"}) {
    auto it = object.find(list);
    if (it != object.end() && it->is_array()) row->numbers[list] = static_cast<double>(it->size());
  }
  auto left = object.find("left");
  if (left == object.end() || !left->is_object()) return;
  for (const auto& [id, why] : left->items()) {
    std::string outcome = "dropped";
    if (auto it = why.find("outcome"); it != why.end() && it->is_string()) outcome = *it;
    if (!row->numbers.count(outcome)) outcome = "dropped";
    row->numbers[outcome] += 1;
  }
}

// The service's record and job.yaml of the job whose OUT this is: STATE/jobs/NAME/{state.json,
// job.yaml} beside OUT = STATE/jobs/NAME/out, or OUT/service/jobs/NAME/ (`huddle run`).
std::optional<fs::path> JobDirOf(const std::string& out_dir) {
  std::error_code ec;
  fs::path out = fs::path(out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  if (out.filename() == "out" && fs::is_regular_file(out.parent_path() / "state.json", ec)) {
    return out.parent_path();
  }
  const fs::path jobs = out / "service" / "jobs";
  if (!fs::is_directory(jobs, ec)) return std::nullopt;
  std::optional<fs::path> found;
  int seen = 0;
  for (fs::directory_iterator it(jobs, ec), end; !ec && it != end && seen < 16; it.increment(ec)) {
    ++seen;
    if (fs::is_regular_file(it->path() / "state.json", ec)) {
      if (found) return std::nullopt;  // more than one job: none is this directory's
      found = it->path();
    }
  }
  return found;
}

StatusOr<std::string> ModelConfig(const std::string& path, uint64_t max_bytes) {
  StatusOr<std::string> text = ReadFile(path, max_bytes);
  if (absl::IsNotFound(text.status())) return std::string();
  if (!text.ok()) return text.status();
  try {
    const YAML::Node job = YAML::Load(*text);
    if (!job.IsMap() || !job["model"]) return std::string();
    YAML::Emitter e;
    e.SetMapFormat(YAML::Flow);
    e.SetSeqFormat(YAML::Flow);
    e << job["model"];
    std::string line = e.c_str();
    if (line.size() > 300) line = line.substr(0, 300) + "...";
    return line;
  } catch (const YAML::Exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": not valid YAML (", e.what(), ")"));
  }
}

}  // namespace

std::optional<double> Row::Get(const std::string& key) const {
  auto it = numbers.find(key);
  if (it == numbers.end()) return std::nullopt;
  return it->second;
}

StatusOr<RowsFile> ReadRows(const std::string& path, const std::string& x_key, uint64_t max_bytes,
                            bool participation) {
  RowsFile file;
  StatusOr<std::string> text = ReadFile(path, max_bytes);
  if (absl::IsNotFound(text.status())) return file;
  if (!text.ok()) return text.status();
  file.present = true;
  std::string key = x_key;
  size_t pos = 0;
  for (size_t line_no = 1; pos < text->size(); ++line_no) {
    const size_t nl = text->find('\n', pos);
    if (nl == std::string::npos) {
      // A row being appended: its writer has not reached the newline yet.
      file.partial_last_line = text->find_first_not_of(" \t\r", pos) != std::string::npos;
      break;
    }
    const std::string_view line(text->data() + pos, nl - pos);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json object;
    try {
      object = json::parse(line);
    } catch (const json::exception& e) {
      return absl::DataLossError(
          absl::StrCat(path, ":", line_no, ": not valid JSON (", ParseMessage(e), ")"));
    }
    if (!object.is_object()) {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": not a JSON object"));
    }
    if (key.empty())
      key = object.contains("epoch") && !object.contains("round") ? "epoch" : "round";
    auto x = object.find(key);
    if (x == object.end() || !x->is_number() || !(x->get<double>() >= 0) ||
        !std::isfinite(x->get<double>())) {
      return absl::DataLossError(
          absl::StrCat(path, ":", line_no, ": the row has no \"", key, "\" (a number >= 0)"));
    }
    Row row;
    row.x = x->get<double>();
    if (participation) {
      Participation(object, &row);
    } else {
      Flatten(object, &row);
    }
    file.rows.push_back(std::move(row));
  }
  return file;
}

StatusOr<std::optional<json>> ReadJsonObject(const std::string& path, uint64_t max_bytes) {
  StatusOr<std::string> text = ReadFile(path, max_bytes);
  if (absl::IsNotFound(text.status())) return std::optional<json>();
  if (!text.ok()) return text.status();
  json object;
  try {
    object = json::parse(*text);
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": not valid JSON (", ParseMessage(e), ")"));
  }
  if (!object.is_object()) return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  return std::optional<json>(std::move(object));
}

StatusOr<std::optional<ModelFileInfo>> ReadModelHeader(const std::string& path) {
  StatusOr<std::vector<TensorSpec>> layout = ReadModelFileLayout(path);
  if (absl::IsNotFound(layout.status())) return std::optional<ModelFileInfo>();
  if (!layout.ok()) return layout.status();
  ModelFileInfo info;
  for (const TensorSpec& t : *layout) {
    ++info.tensors;
    info.parameters += t.NumElements();
  }
  return std::optional<ModelFileInfo>(info);
}

StatusOr<JobOutputs> ReadJobOutputs(const std::string& out_dir, bool operator_view,
                                    const ReadLimits& limits) {
  std::error_code ec;
  if (!fs::exists(out_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(out_dir, ": no such directory"));
  }
  if (!fs::is_directory(out_dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(out_dir, ": not a directory"));
  }
  JobOutputs o;
  o.dir = out_dir;
  HUDDLE_ASSIGN_OR_RETURN(
      o.summary, ReadJsonObject(Join(out_dir, "summary.json"), limits.max_json_file_bytes));
  HUDDLE_ASSIGN_OR_RETURN(
      o.privacy, ReadJsonObject(Join(out_dir, "privacy.json"), limits.max_json_file_bytes));
  HUDDLE_ASSIGN_OR_RETURN(o.metrics,
                          ReadRows(Join(out_dir, "metrics.jsonl"), "", limits.max_rows_file_bytes));
  const json none = json::object();
  const json& summary = o.summary ? *o.summary : none;
  const json& privacy = o.privacy ? *o.privacy : none;
  const auto scope = privacy.find("scope");
  o.datacenter =
      summary.contains("world_size") || (scope != privacy.end() && *scope == "datacenter");
  for (const Row& r : o.metrics.rows) {
    o.datacenter = o.datacenter || r.numbers.count("epoch") > 0;
    o.dp = o.dp || r.numbers.count("epsilon") || r.numbers.count("private") ||
           r.numbers.count("privacy.private") || r.strings.count("privacy.mode");
  }
  if (const auto t = summary.find("training"); t != summary.end() && t->is_object()) {
    o.async = t->value("mode", "") == "async";
    o.virtual_clock = t->value("clock", "") == "virtual";
  }
  for (const Row& r : o.metrics.rows) o.async = o.async || r.numbers.count("async.buffer") > 0;
  o.dp = o.dp || o.privacy.has_value() || summary.contains("privacy") ||
         summary.contains("operator") || fs::exists(Join(out_dir, "operator_metrics.jsonl"), ec);
  const std::string x_key = o.datacenter ? "epoch" : "round";
  if (!o.dp) {
    o.operator_metrics = o.metrics;
  } else if (operator_view) {
    HUDDLE_ASSIGN_OR_RETURN(o.operator_metrics, ReadRows(Join(out_dir, "operator_metrics.jsonl"),
                                                         x_key, limits.max_rows_file_bytes));
  }
  if (!o.dp || operator_view) {
    o.operator_files_read = true;
    bool counted = false;  // the rows count the cohort: participation.jsonl is not needed
    for (const Row& r : o.operator_metrics.rows)
      counted = counted || r.numbers.count("clients_sampled");
    if (!o.datacenter && !counted) {
      HUDDLE_ASSIGN_OR_RETURN(o.participation, ReadRows(Join(out_dir, "participation.jsonl"),
                                                        "round", limits.max_rows_file_bytes,
                                                        /*participation=*/true));
    }
  }
  if (std::optional<fs::path> job_dir = JobDirOf(out_dir)) {
    HUDDLE_ASSIGN_OR_RETURN(
        o.record, ReadJsonObject((*job_dir / "state.json").string(), limits.max_json_file_bytes));
    HUDDLE_ASSIGN_OR_RETURN(
        o.model_config, ModelConfig((*job_dir / "job.yaml").string(), limits.max_json_file_bytes));
  }
  HUDDLE_ASSIGN_OR_RETURN(o.model, ReadModelHeader(Join(out_dir, "model.bin")));
  return o;
}

}  // namespace huddle::report
