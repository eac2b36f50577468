// The operator commands of a service (`huddle submit`, `jobs`, `status`, `stop`, `logs`,
// `clients`, and `huddle report --job`): one authenticated request each
// (service/operator_api.h), a table or --json (a report: its page, written to a file).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "common/file_util.h"
#include "service/operator_server.h"
#include "transport/curve_keys.h"

namespace huddle::cli {
namespace {

using nlohmann::json;

StatusOr<service::OperatorClientOptions> ClientOptions(const OperatorFlags& f) {
  service::OperatorClientOptions o;
  o.endpoint = f.service.empty() ? kDefaultOperatorEndpoint : f.service;
  o.timeout_ms = static_cast<int64_t>(f.timeout_s * 1000);
  if (f.insecure) return o;
  if (f.server_key.empty() || f.key.empty()) {
    return absl::InvalidArgumentError(
        "an operator command needs the service's public key (--server-key server.pub) and this "
        "operator's key (--key NAME.key, enrolled in the service's security.operators), or "
        "--insecure for a service started with --insecure");
  }
  HUDDLE_ASSIGN_OR_RETURN(transport::CurveKeyPair server,
                          transport::ReadRoleKey(f.server_key, "server", false, "--server-key"));
  // An operator key only: a client's is refused here (and by the service, whatever its file says).
  StatusOr<transport::CurveKeyPair> mine = transport::ReadRoleKey(f.key, "operator", true, "--key");
  if (!mine.ok()) {
    auto file = transport::ReadKeyFile(f.key, false);
    if (file.ok() && file->role != "operator") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--key: ", f.key, " is a ", file->role,  // client, server or project
          " key; operator commands take an operator key: `huddle keygen operator --id NAME`, its "
          ".pub enrolled in the service's security.operators"));
    }
    return mine.status();
  }
  o.server_public_z85 = server.public_z85;
  o.key = *std::move(mine);
  return o;
}

// The request's reply, or an error (the service's own text when it refused).
StatusOr<json> Ask(const OperatorFlags& f, const json& request) {
  HUDDLE_ASSIGN_OR_RETURN(service::OperatorClientOptions o, ClientOptions(f));
  HUDDLE_ASSIGN_OR_RETURN(std::string text, service::OperatorRequest(o, request.dump()));
  json reply = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded() || !reply.is_object()) {
    return absl::DataLossError("the service's reply is not a JSON object");
  }
  if (!reply.value("ok", false)) {
    // A job that does not validate, a name taken or unknown: the operator's to fix (exit 2).
    const std::string code = reply.value("code", std::string());
    const std::string error = reply.value("error", std::string("refused"));
    if (code == "INVALID_ARGUMENT" || code == "ALREADY_EXISTS" || code == "NOT_FOUND") {
      return absl::InvalidArgumentError(error);
    }
    return absl::FailedPreconditionError(error);
  }
  return reply;
}

std::string Round(const json& job) {
  const json& last = job["last_round"];
  const int64_t planned = job.value("planned_rounds", int64_t{0});
  std::string r = last.is_object() && last.contains("round") ? last["round"].dump() : "-";
  return planned > 0 ? r + "/" + std::to_string(planned) : r;
}

std::string Epsilon(const json& job) {
  const json& last = job["last_round"];
  if (!last.is_object() || !last.contains("epsilon")) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3g", last["epsilon"].get<double>());
  std::string out = buf;
  if (last.contains("epsilon_budget")) {
    std::snprintf(buf, sizeof(buf), "/%.3g", last["epsilon_budget"].get<double>());
    out += buf;
  }
  return out;
}

void PrintJobLine(const json& j) {
  std::printf("%-24s %-10s %-9s %-11s %s\n", j.value("name", "").c_str(),
              j.value("state", "").c_str(), Round(j).c_str(), Epsilon(j).c_str(),
              j.value("submitted_at", "").c_str());
}

int Fail(const OperatorFlags& f, const Status& st) {
  std::fprintf(stderr, "huddle %s: %s\n", f.command.c_str(), std::string(st.message()).c_str());
  return absl::IsInvalidArgument(st) ? kExitUsage : kExitFailed;
}

}  // namespace

int RunOperatorCommand(const OperatorFlags& f) {
  json request = {{"command", f.command}};
  if (f.command == "submit") {
    StatusOr<std::string> yaml = ReadFile(f.argument, 1 << 20);
    if (!yaml.ok()) return Fail(f, absl::InvalidArgumentError(yaml.status().message()));
    request["job_yaml"] = *yaml;
  } else if (f.command != "jobs" && f.command != "clients") {
    request["job"] = f.argument;
  }
  if (f.command == "logs") request["offset"] = 0;
  if (f.command == "report") request["operator"] = f.operator_view;
  StatusOr<json> reply = Ask(f, request);
  if (!reply.ok()) return Fail(f, reply.status());
  if (f.command == "logs") {
    // --follow: the log's new lines every half second, until the job has ended and all is read.
    while (true) {
      const std::string text = (*reply).value("text", "");
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      const uint64_t next = (*reply).value("next_offset", uint64_t{0});
      if (!f.follow && text.empty()) return kExitOk;
      if (f.follow && text.empty()) {
        StatusOr<json> status = Ask(f, {{"command", "status"}, {"job", f.argument}});
        if (!status.ok()) return Fail(f, status.status());
        const std::string state = (*status)["job"].value("state", "");
        if (state != "queued" && state != "running") {
          // One last read: lines written as it ended.
          reply = Ask(f, {{"command", "logs"}, {"job", f.argument}, {"offset", next}});
          if (!reply.ok()) return Fail(f, reply.status());
          const std::string rest = (*reply).value("text", "");
          std::fwrite(rest.data(), 1, rest.size(), stdout);
          return kExitOk;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        if (StopFlag().load()) return StopExitCode();
      }
      reply = Ask(f, {{"command", "logs"}, {"job", f.argument}, {"offset", next}});
      if (!reply.ok()) return Fail(f, reply.status());
    }
  }
  if (f.command == "report") {
    // The page is written only once the service answered with it (its name checked there).
    const std::string path = f.output.empty() ? f.argument + "-report.html" : f.output;
    if (Status st = WriteFileAtomic(path, (*reply).value("html", "")); !st.ok()) {
      return Fail(f, absl::FailedPreconditionError(absl::StrCat(path, ": ", st.message())));
    }
    std::vector<std::string> left_out;
    if (const auto it = reply->find("left_out"); it != reply->end() && it->is_array()) {
      for (const json& t : *it) {
        if (t.is_string()) left_out.push_back(t.get<std::string>());
      }
    }
    PrintReportNotes((*reply).value("operator_only", false), left_out);
    std::printf("%s\n", path.c_str());
    return kExitOk;
  }
  if (f.json) {
    std::printf("%s\n", reply->dump(2).c_str());
    return kExitOk;
  }
  if (f.command == "submit" || f.command == "stop") {
    const json& j = (*reply)["job"];
    std::printf("job '%s': %s\n", j.value("name", "").c_str(),
                f.command == "submit"               ? "queued"
                : j.value("state", "") == "stopped" ? "stopped"
                                                    : "stopping (at the end of its round)");
  } else if (f.command == "jobs") {
    std::printf("%-24s %-10s %-9s %-11s %s\n", "JOB", "STATE", "ROUND", "EPSILON", "SUBMITTED");
    for (const json& j : (*reply)["jobs"]) PrintJobLine(j);
  } else if (f.command == "status") {
    const json& j = (*reply)["job"];
    std::printf("job:        %s\nstate:      %s%s\nround:      %s\nepsilon:    %s\n",
                j.value("name", "").c_str(), j.value("state", "").c_str(),
                j.value("reason", "").empty() ? "" : (" (" + j.value("reason", "") + ")").c_str(),
                Round(j).c_str(), Epsilon(j).c_str());
    std::printf(
        "submitted:  %s by %s\nstarted:    %s\nfinished:   %s\nagents:     %zu in the job\n",
        j.value("submitted_at", "").c_str(), j.value("submitted_by", "").c_str(),
        j.value("started_at", "").c_str(), j.value("finished_at", "").c_str(), j["agents"].size());
    if (j["last_round"].is_object()) {
      std::printf("last round: %s\n", j["last_round"].dump().c_str());
    }
  } else if (f.command == "clients") {
    std::printf("%-24s %-5s %-10s %-20s %s\n", "CLIENT", "LIVE", "SEEN", "JOB", "DATA SETS");
    for (const json& a : (*reply)["clients"]) {
      char seen[32];
      std::snprintf(seen, sizeof(seen), "%.1fs ago", a.value("last_seen_s_ago", 0.0));
      std::string sets;
      for (const json& d : a["datasets"]) sets += (sets.empty() ? "" : ",") + d.get<std::string>();
      std::printf("%-24s %-5s %-10s %-20s %s\n", a.value("id", "").c_str(),
                  a.value("live", false) ? "yes" : "no", seen, a.value("job", "").c_str(),
                  sets.c_str());
    }
  }
  return kExitOk;
}

}  // namespace huddle::cli
