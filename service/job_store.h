// The service's jobs on disk: what `huddle serve` must keep across its own restarts.
//
// Layout of the state directory (every file written atomically, common/file_util.h):
//   STATE/jobs/NAME/job.yaml       the job as validated and run (paths resolved, service_job.h)
//   STATE/jobs/NAME/submitted.yaml the job as the operator submitted it, byte for byte
//   STATE/jobs/NAME/state.json     its record (JobRecord): state, submission order, times, reason
//   STATE/jobs/NAME/out/           its outputs, as a `huddle coordinator` job's OUT (metrics,
//                                  summary, model, checkpoint, privacy ledger, privacy.json)
//   STATE/jobs/NAME/job.log        its log lines
// A job's name is its directory's: IsValidJobName keeps every name inside STATE/jobs.
//
// The queue is the jobs in state kQueued in submission order (`seq`); a job that was kRunning when
// the service stopped is run again first, resumed from its checkpoint and ledger. A state.json
// that does not load (torn by a crash before this store existed, edited by hand) marks its job
// kFailed with the reason instead of stopping the service: one bad file costs one job, never the
// others.
//
// Thread-safety: none; the service's scheduler owns it (the operator thread asks through the
// service, under its lock).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace huddle::service {

enum class JobState { kQueued, kRunning, kCompleted, kFailed, kStopped };
const char* JobStateName(JobState state);
// Whether the job will not run again (completed, failed, stopped).
inline bool IsFinished(JobState s) {
  return s == JobState::kCompleted || s == JobState::kFailed || s == JobState::kStopped;
}

// Job names: 1-64 characters of [A-Za-z0-9._-], the first a letter or digit (so never "." or
// ".." and never a hidden file): safe as a directory name, in logs and as a metrics label.
bool IsValidJobName(const std::string& name);

struct JobRecord {
  std::string name;
  uint64_t seq = 0;  // submission order, from 1
  JobState state = JobState::kQueued;
  std::string submitted_by;  // the operator's id
  std::string submitted_at;  // ISO-8601 UTC
  std::string started_at;    // of its latest start ("" before)
  std::string finished_at;
  std::string reason;           // why it failed or stopped (or how it ended)
  int64_t starts = 0;           // how many times it was started (a resume after a restart adds one)
  bool stop_requested = false;  // an operator asked to stop it; it stops, it does not resume
};

class JobStore {
 public:
  // Opens (creating) STATE/jobs and loads every job's record. Errors only when the directory
  // cannot be created or listed.
  static StatusOr<JobStore> Open(std::string state_dir);

  // A new job `name`: writes submitted.yaml (`submitted`), job.yaml (`resolved`) and its record
  // (kQueued, the next seq). AlreadyExists when the name was ever used: names are never reused,
  // so a job's outputs and audit trail keep meaning one job.
  StatusOr<JobRecord> Create(const std::string& name, const std::string& submitted,
                             const std::string& resolved, const std::string& operator_id,
                             const std::string& now_iso);
  // Removes a job that never ran (its validation failed after Create).
  Status Discard(const std::string& name);
  // Records `record` (replacing the job's record on disk and here).
  Status Update(const JobRecord& record);

  const JobRecord* Find(const std::string& name) const;
  // Every job, in submission order.
  std::vector<JobRecord> List() const;
  // The next job to start: a kRunning one (interrupted by a restart) first, then the oldest
  // kQueued; nullopt when none waits. `running` names the jobs running now (skipped).
  std::optional<JobRecord> Next(const std::vector<std::string>& running) const;

  const std::string& state_dir() const { return state_dir_; }
  std::string JobDir(const std::string& name) const;
  std::string ConfigPath(const std::string& name) const { return JobDir(name) + "/job.yaml"; }
  std::string OutDir(const std::string& name) const { return JobDir(name) + "/out"; }
  std::string LogPath(const std::string& name) const { return JobDir(name) + "/job.log"; }

 private:
  explicit JobStore(std::string state_dir) : state_dir_(std::move(state_dir)) {}
  Status Write(const JobRecord& record) const;

  std::string state_dir_;
  std::map<std::string, JobRecord> jobs_;
  uint64_t last_seq_ = 0;
};

}  // namespace huddle::service
