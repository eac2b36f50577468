// The operators' requests to `huddle serve`, as JSON documents (docs/protocol.md, "Operators"):
//   {"command": "submit", "job_yaml": TEXT}         -> {"ok": true, "job": RECORD}
//   {"command": "jobs"}                             -> {"ok": true, "jobs": [JOB...]}
//   {"command": "status", "job": NAME}              -> {"ok": true, "job": JOB}
//   {"command": "stop", "job": NAME}                -> {"ok": true, "job": RECORD}
//   {"command": "logs", "job": NAME, "offset": N}   -> {"ok": true, "text": ..., "next_offset": M}
//   {"command": "clients"}                          -> {"ok": true, "clients": [AGENT...]}
//   {"command": "report", "job": NAME, "operator": B} -> {"ok": true, "html": PAGE, "state": ...,
//                                                       "operator_only": B, "left_out": [...]}
//     the job's report page (report/report.h) from STATE/jobs/NAME/out as it stands; "operator"
//     true draws the operator-only plots (labelled); at most report::kMaxReportBytes of HTML,
//     rendered on the operator server's thread (a large job's page takes it a moment)
// and {"ok": false, "error": TEXT} for anything refused. Every request, answered or refused, is
// one line of the audit log (STATE/audit.jsonl: time, operator, command, job, ok, error, and
// operator_view for a report with the operator-only values), written
// after the request took effect and before its reply leaves (a request whose line cannot be
// written is answered as refused, and the service logs the failure).
//
// Thread-safety: Handle() from the operator server's one thread.
#pragma once

#include <functional>
#include <string>

#include "common/status.h"
#include "service/service.h"

namespace huddle::service {

// A submitted job made ready to store: its name and its YAML as it will run (service_job.h).
struct CheckedJob {
  std::string name;
  std::string resolved_yaml;
};
using SubmissionChecker = std::function<StatusOr<CheckedJob>(const std::string& submitted_yaml)>;

class OperatorApi {
 public:
  // `service` and `metrics` (may be null) must outlive the API; `now_iso` stamps the audit rows.
  OperatorApi(Service* service, SubmissionChecker checker, std::function<std::string()> now_iso,
              ServiceMetrics* metrics = nullptr);

  // The reply to one request of `operator_id` (never throws; malformed requests get an error).
  std::string Handle(const std::string& operator_id, const std::string& request);

  std::string audit_path() const { return audit_path_; }

 private:
  Service* service_;
  SubmissionChecker checker_;
  std::function<std::string()> now_iso_;
  ServiceMetrics* metrics_;
  std::string audit_path_;
};

}  // namespace huddle::service
