#include "service/operator_api.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/version.h"
#include "report/report.h"

namespace huddle::service {
namespace {

using nlohmann::json;

constexpr size_t kMaxLogChunk = 256 * 1024;  // bytes of a job's log per `logs` reply

json RecordJson(const JobRecord& r) {
  return {{"name", r.name},
          {"state", JobStateName(r.state)},
          {"seq", r.seq},
          {"submitted_by", r.submitted_by},
          {"submitted_at", r.submitted_at},
          {"started_at", r.started_at},
          {"finished_at", r.finished_at},
          {"reason", r.reason},
          {"starts", r.starts}};
}

json JobJson(const JobView& v) {
  json j = RecordJson(v.record);
  j["planned_rounds"] = v.planned_rounds;
  j["agents"] = v.agents;
  j["last_round"] = nullptr;
  if (!v.last_round_row.empty()) {
    const json row = json::parse(v.last_round_row, nullptr, /*allow_exceptions=*/false);
    if (!row.is_discarded()) j["last_round"] = row;
  }
  return j;
}

json AgentJson(const AgentView& a) {
  return {{"id", a.id},
          {"live", a.live},
          {"last_seen_s_ago", static_cast<double>(a.last_seen_ms_ago) / 1000.0},
          {"connected_at", a.connected_at},
          {"datasets", a.datasets},
          {"job", a.job},
          {"version", a.version}};
}

// A string field of the request, or an error naming it.
StatusOr<std::string> Field(const json& request, const char* key) {
  auto it = request.find(key);
  if (it == request.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("the request needs \"", key, "\" (a string)"));
  }
  return it->get<std::string>();
}

// {"command": "report", "job": NAME, "operator": BOOL}: the job's report page, rendered from its
// outputs as they stand (report/report.h), with the service's record of its state.
StatusOr<json> ReportReply(const Service& service, const std::string& now_iso, const json& request,
                           const std::string& job, bool* operator_view) {
  if (auto it = request.find("operator"); it != request.end()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError("the request's \"operator\" is not true or false");
    }
    *operator_view = it->get<bool>();
  }
  HUDDLE_ASSIGN_OR_RETURN(JobView v, service.Job(job));
  report::ReportOptions options;
  options.operator_view = *operator_view;
  options.build = VersionLine();
  options.generated_at = now_iso;
  options.job_name = job;
  options.state = JobStateName(v.record.state);
  options.state_reason = v.record.reason;
  StatusOr<report::Report> page = report::RenderReport(service.OutDir(job), options);
  if (!page.ok()) {
    // The outputs are the service's: a missing or unreadable directory is its failure, not a
    // usage error of the operator's.
    const std::string why =
        absl::StrCat("the report of job '", job, "': ", page.status().message());
    if (absl::IsNotFound(page.status()) || absl::IsInvalidArgument(page.status())) {
      return absl::FailedPreconditionError(why);
    }
    return Status(page.status().code(), why);
  }
  return json{{"ok", true},
              {"html", page->html},
              {"state", page->state},
              {"operator_only", page->holds_operator_only},
              {"left_out", page->left_out}};
}

}  // namespace

OperatorApi::OperatorApi(Service* service, SubmissionChecker checker,
                         std::function<std::string()> now_iso, ServiceMetrics* metrics)
    : service_(service),
      checker_(std::move(checker)),
      now_iso_(std::move(now_iso)),
      metrics_(metrics),
      audit_path_(service->state_dir() + "/audit.jsonl") {}

std::string OperatorApi::Handle(const std::string& operator_id, const std::string& request) {
  std::string command;
  std::string job;
  bool operator_view = false;  // a report with the operator-only values (audited as such)
  auto answer = [&]() -> StatusOr<json> {
    const json r = json::parse(request, nullptr, /*allow_exceptions=*/false);
    if (r.is_discarded() || !r.is_object()) {
      return absl::InvalidArgumentError("the request is not a JSON object");
    }
    HUDDLE_ASSIGN_OR_RETURN(command, Field(r, "command"));
    if (command.size() > 32) command.resize(32);
    if (command == "submit") {
      HUDDLE_ASSIGN_OR_RETURN(const std::string yaml, Field(r, "job_yaml"));
      HUDDLE_ASSIGN_OR_RETURN(CheckedJob checked, checker_(yaml));
      job = checked.name;
      HUDDLE_ASSIGN_OR_RETURN(
          JobRecord record,
          service_->Submit(checked.name, yaml, checked.resolved_yaml, operator_id));
      return json{{"ok", true}, {"job", RecordJson(record)}};
    }
    if (command == "jobs") {
      json jobs = json::array();
      for (const JobView& v : service_->Jobs()) jobs.push_back(JobJson(v));
      return json{{"ok", true}, {"jobs", jobs}};
    }
    if (command == "clients") {
      json agents = json::array();
      for (const AgentView& a : service_->Agents()) agents.push_back(AgentJson(a));
      return json{{"ok", true}, {"clients", agents}};
    }
    if (command == "status" || command == "stop" || command == "logs" || command == "report") {
      HUDDLE_ASSIGN_OR_RETURN(job, Field(r, "job"));
      if (!IsValidJobName(job)) {
        const std::string shown = job.substr(0, 64);
        job.clear();
        return absl::InvalidArgumentError(absl::StrCat("'", shown, "' is not a job name"));
      }
      if (command == "status") {
        HUDDLE_ASSIGN_OR_RETURN(JobView v, service_->Job(job));
        json j = JobJson(v);
        return json{{"ok", true}, {"job", j}};
      }
      if (command == "stop") {
        HUDDLE_ASSIGN_OR_RETURN(JobRecord record, service_->Stop(job, operator_id));
        return json{{"ok", true}, {"job", RecordJson(record)}};
      }
      if (command == "report") return ReportReply(*service_, now_iso_(), r, job, &operator_view);
      HUDDLE_RETURN_IF_ERROR(service_->Job(job).status());
      uint64_t offset = 0;
      if (auto it = r.find("offset"); it != r.end() && it->is_number_unsigned()) {
        offset = it->get<uint64_t>();
      }
      std::string text;
      StatusOr<ReadableFile> f = ReadableFile::Open(service_->LogPath(job));
      uint64_t next = offset;
      if (f.ok() && offset < f->size()) {
        text.resize(std::min<uint64_t>(kMaxLogChunk, f->size() - offset));
        HUDDLE_ASSIGN_OR_RETURN(size_t n, f->ReadSomeAt(offset, text.size(), text.data()));
        text.resize(n);
        next = offset + n;
      }
      return json{{"ok", true}, {"text", text}, {"next_offset", next}};
    }
    const std::string shown = command;
    command = "unknown";
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown command '", shown, "' (submit, jobs, status, stop, logs, report, clients)"));
  };
  StatusOr<json> reply = answer();
  if (metrics_ != nullptr)
    metrics_->OnOperatorRequest(command.empty() ? "none" : command, reply.ok());
  // The audit trail: every request, before its answer leaves. A query that changes nothing is
  // kept too (who looked at what, and when).
  json row = {{"time", now_iso_()},
              {"operator", operator_id},
              {"command", command},
              {"job", job},
              {"ok", reply.ok()}};
  if (operator_view) row["operator_view"] = true;
  if (!reply.ok()) row["error"] = std::string(reply.status().message());
  if (Status st = AppendLine(audit_path_, row.dump(-1, ' ', false, json::error_handler_t::replace));
      !st.ok()) {
    spdlog::error("audit log {}: {}; the request is refused", audit_path_, st.message());
    return json{{"ok", false}, {"error", "the service cannot write its audit log"}}.dump();
  }
  if (!reply.ok()) {
    return json{{"ok", false},
                {"error", std::string(reply.status().message())},
                {"code", absl::StatusCodeToString(reply.status().code())}}
        .dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return reply->dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace huddle::service
