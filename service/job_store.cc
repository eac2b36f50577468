#include "service/job_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "common/file_util.h"

namespace huddle::service {
namespace {

constexpr uint64_t kMaxStateBytes = 64 * 1024;

StatusOr<JobState> ParseState(const std::string& s) {
  for (JobState st : {JobState::kQueued, JobState::kRunning, JobState::kCompleted,
                      JobState::kFailed, JobState::kStopped}) {
    if (s == JobStateName(st)) return st;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown state '", s, "'"));
}

nlohmann::json ToJson(const JobRecord& r) {
  return {{"name", r.name},
          {"seq", r.seq},
          {"state", JobStateName(r.state)},
          {"submitted_by", r.submitted_by},
          {"submitted_at", r.submitted_at},
          {"started_at", r.started_at},
          {"finished_at", r.finished_at},
          {"reason", r.reason},
          {"starts", r.starts},
          {"stop_requested", r.stop_requested}};
}

StatusOr<JobRecord> FromJson(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    JobRecord r;
    r.name = j.at("name").get<std::string>();
    r.seq = j.at("seq").get<uint64_t>();
    HUDDLE_ASSIGN_OR_RETURN(r.state, ParseState(j.at("state").get<std::string>()));
    r.submitted_by = j.value("submitted_by", "");
    r.submitted_at = j.value("submitted_at", "");
    r.started_at = j.value("started_at", "");
    r.finished_at = j.value("finished_at", "");
    r.reason = j.value("reason", "");
    r.starts = j.value("starts", int64_t{0});
    r.stop_requested = j.value("stop_requested", false);
    return r;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

}  // namespace

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "queued";
    case JobState::kRunning:
      return "running";
    case JobState::kCompleted:
      return "completed";
    case JobState::kFailed:
      return "failed";
    case JobState::kStopped:
      return "stopped";
  }
  return "unknown";
}

bool IsValidJobName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  if (!std::isalnum(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

StatusOr<JobStore> JobStore::Open(std::string state_dir) {
  JobStore store(std::move(state_dir));
  const std::string jobs = store.state_dir_ + "/jobs";
  HUDDLE_RETURN_IF_ERROR(MakeDirs(jobs));
  std::error_code ec;
  std::filesystem::directory_iterator it(jobs, ec), end;
  if (ec) return absl::UnavailableError(absl::StrCat("cannot list ", jobs, ": ", ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) return absl::UnavailableError(absl::StrCat("cannot list ", jobs, ": ", ec.message()));
    const std::string name = it->path().filename().string();
    if (!IsValidJobName(name) || !it->is_directory(ec)) continue;  // not ours: left alone
    StatusOr<std::string> text = ReadFile(store.JobDir(name) + "/state.json", kMaxStateBytes);
    StatusOr<JobRecord> record = text.ok() ? FromJson(*text) : StatusOr<JobRecord>(text.status());
    if (record.ok() && record->name != name) {
      record =
          absl::InvalidArgumentError(absl::StrCat("its record names job '", record->name, "'"));
    }
    if (!record.ok()) {
      // Fail safe: this job is marked failed (and never run); the others go on.
      JobRecord failed;
      failed.name = name;
      failed.state = JobState::kFailed;
      failed.reason = absl::StrCat("its record ", store.JobDir(name),
                                   "/state.json does not load: ", record.status().message());
      spdlog::error("job '{}': {}", name, failed.reason);
      record = failed;
    }
    store.last_seq_ = std::max(store.last_seq_, record->seq);
    store.jobs_[name] = *std::move(record);
  }
  // Records that failed to load get a place after every other.
  for (auto& [name, r] : store.jobs_) {
    if (r.seq == 0) r.seq = ++store.last_seq_;
  }
  return store;
}

std::string JobStore::JobDir(const std::string& name) const { return state_dir_ + "/jobs/" + name; }

Status JobStore::Write(const JobRecord& record) const {
  return WriteFileAtomic(JobDir(record.name) + "/state.json", ToJson(record).dump(2) + "\n");
}

StatusOr<JobRecord> JobStore::Create(const std::string& name, const std::string& submitted,
                                     const std::string& resolved, const std::string& operator_id,
                                     const std::string& now_iso) {
  if (!IsValidJobName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job name '", name.substr(0, 80),
                     "' is not allowed: 1-64 characters of [A-Za-z0-9._-], starting with a letter "
                     "or digit"));
  }
  std::error_code ec;
  if (jobs_.count(name) != 0 || std::filesystem::exists(JobDir(name), ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("a job named '", name,
                     "' was already submitted; job names are never reused (its "
                     "outputs and audit trail keep meaning that job): choose another name"));
  }
  HUDDLE_RETURN_IF_ERROR(MakeDirs(OutDir(name)));
  JobRecord r;
  r.name = name;
  r.seq = last_seq_ + 1;
  r.submitted_by = operator_id;
  r.submitted_at = now_iso;
  Status st = WriteFileAtomic(JobDir(name) + "/submitted.yaml", submitted);
  if (st.ok()) st = WriteFileAtomic(ConfigPath(name), resolved);
  if (st.ok()) st = Write(r);
  if (!st.ok()) {
    std::filesystem::remove_all(JobDir(name), ec);
    return st;
  }
  last_seq_ = r.seq;
  jobs_[name] = r;
  return r;
}

Status JobStore::Discard(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", name, "'"));
  if (it->second.starts > 0) {
    return absl::FailedPreconditionError(absl::StrCat("job '", name, "' has run: it is kept"));
  }
  std::error_code ec;
  std::filesystem::remove_all(JobDir(name), ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot remove ", JobDir(name), ": ", ec.message()));
  jobs_.erase(it);
  return absl::OkStatus();
}

Status JobStore::Update(const JobRecord& record) {
  auto it = jobs_.find(record.name);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", record.name, "'"));
  HUDDLE_RETURN_IF_ERROR(Write(record));
  it->second = record;
  return absl::OkStatus();
}

const JobRecord* JobStore::Find(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<JobRecord> JobStore::List() const {
  std::vector<JobRecord> out;
  for (const auto& [name, r] : jobs_) out.push_back(r);
  std::sort(out.begin(), out.end(),
            [](const JobRecord& a, const JobRecord& b) { return a.seq < b.seq; });
  return out;
}

std::optional<JobRecord> JobStore::Next(const std::vector<std::string>& running) const {
  std::optional<JobRecord> best;
  for (const JobRecord& r : List()) {
    if (std::find(running.begin(), running.end(), r.name) != running.end()) continue;
    if (r.state != JobState::kRunning && r.state != JobState::kQueued) continue;
    // An interrupted job (kRunning on disk, not running now) goes before any queued one.
    if (!best || (r.state == JobState::kRunning && best->state != JobState::kRunning)) best = r;
    if (best->state == JobState::kRunning) break;
  }
  return best;
}

}  // namespace huddle::service
