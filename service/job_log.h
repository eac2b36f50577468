// Each job's log lines in its own file (STATE/jobs/NAME/job.log), for `huddle logs`.
//
// The job's Coordinator logs through spdlog's default logger like any other code. While a
// JobLogScope lives on a thread, the lines that thread logs are also appended to the scope's
// file (ISO-8601 UTC time, level, message); InstallJobLogRouting adds the sink that does this to
// the default logger. Lines logged by other threads (the service's own) are not copied. The
// service's own log (the console) names the job in each of its lines (SetThreadLogContext).
//
// Thread-safety: each scope's file is written by its own thread only.
#pragma once

#include <cstdio>
#include <string>

#include "common/status.h"

namespace huddle::service {

// Adds the routing sink to spdlog's default logger (once; later calls do nothing).
Status InstallJobLogRouting();

class JobLogScope {
 public:
  // Opens `path` for appending (a failure is logged; the job then logs to stderr only).
  JobLogScope(const std::string& job, const std::string& path);
  ~JobLogScope();
  JobLogScope(const JobLogScope&) = delete;
  JobLogScope& operator=(const JobLogScope&) = delete;

 private:
  std::string context_;  // "job 'NAME'": names the job in the thread's console lines
  std::FILE* file_ = nullptr;
};

}  // namespace huddle::service
