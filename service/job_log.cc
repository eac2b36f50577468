#include "service/job_log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <mutex>

#include "common/log_context.h"

namespace huddle::service {
namespace {

// The file of the job whose thread this is (nullptr: not a job's thread).
thread_local std::FILE* tls_job_file = nullptr;

class JobRoutingSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  JobRoutingSink() : formatter_("%Y-%m-%dT%H:%M:%S.%eZ %l %v", spdlog::pattern_time_type::utc) {}

 protected:
  // Called under the sink's mutex (the formatter is not thread-safe); the file is the calling
  // thread's.
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::FILE* f = tls_job_file;
    if (f == nullptr) return;
    spdlog::memory_buf_t line;
    formatter_.format(msg, line);
    std::fwrite(line.data(), 1, line.size(), f);
    std::fflush(f);
  }
  void flush_() override {
    if (tls_job_file != nullptr) std::fflush(tls_job_file);
  }

 private:
  spdlog::pattern_formatter formatter_;
};

}  // namespace

Status InstallJobLogRouting() {
  static std::once_flag once;
  std::call_once(once, [] {
    spdlog::default_logger()->sinks().push_back(std::make_shared<JobRoutingSink>());
  });
  return absl::OkStatus();
}

JobLogScope::JobLogScope(const std::string& job, const std::string& path)
    : context_("job '" + job + "'") {
  SetThreadLogContext(&context_);
  file_ = std::fopen(path.c_str(), "ae");
  if (file_ == nullptr) {
    spdlog::warn("job '{}': cannot open its log {}; it logs to the service's log only", job, path);
  }
  tls_job_file = file_;
}

JobLogScope::~JobLogScope() {
  SetThreadLogContext(nullptr);
  tls_job_file = nullptr;
  if (file_ != nullptr) std::fclose(file_);
}

}  // namespace huddle::service
