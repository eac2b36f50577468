// `huddle serve --config server.yaml`: the long-running service (service/service.h), and the
// checks a submitted job passes before it is stored (CheckSubmission).
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "common/config_reader.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/time_format.h"
#include "common/version.h"
#include "service/http_endpoint.h"
#include "service/job_log.h"
#include "service/operator_api.h"
#include "service/operator_server.h"
#include "service/prometheus.h"
#include "service/service.h"
#include "transport/curve_keys.h"

namespace huddle::cli {
namespace {

constexpr const char* kCommand = "huddle serve";
constexpr size_t kMaxJobYamlBytes = 1 << 20;

struct ServeConfig {
  std::string bind = "tcp://127.0.0.1:5555";
  std::string operator_bind = "tcp://127.0.0.1:5556";
  std::string state_dir = "/var/lib/huddle";
  service::ServiceOptions service;
  ServerSecurity security;
  std::string operators;  // the operators' allow-list
  service::HttpEndpointOptions http;
  bool http_enabled = true;
  bool operator_metrics = true;  // the huddle_operator_ families on /metrics
  std::string log_level = "info";
};

StatusOr<ServeConfig> LoadServeConfig(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::LoadFile(path));
  ServeConfig c;
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap s, top.Child("service"));
  HUDDLE_RETURN_IF_ERROR(s.Optional("bind", &c.bind));
  HUDDLE_RETURN_IF_ERROR(s.Optional("operator_bind", &c.operator_bind));
  HUDDLE_RETURN_IF_ERROR(s.OptionalPath("state_dir", &c.state_dir));
  HUDDLE_RETURN_IF_ERROR(s.Optional("max_concurrent_jobs", &c.service.max_concurrent_jobs, 1, 64));
  HUDDLE_RETURN_IF_ERROR(
      s.OptionalSeconds("heartbeat_interval_s", &c.service.heartbeat_interval_ms, 0.05, 3600));
  HUDDLE_RETURN_IF_ERROR(
      s.OptionalSeconds("agent_timeout_s", &c.service.agent_timeout_ms, 0.5, 86400));
  HUDDLE_RETURN_IF_ERROR(s.Finish());
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap sec, top.Child("security"));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("server_secret_key", &c.security.server_secret_key));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("allowed_clients", &c.security.allowed_clients));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("operators", &c.operators));
  HUDDLE_RETURN_IF_ERROR(
      sec.OptionalSeconds("reload_interval_s", &c.security.reload_interval_ms, 0.1, 86400));
  HUDDLE_RETURN_IF_ERROR(
      sec.Optional("max_messages_per_s", &c.security.max_messages_per_s, 0.0, 1e6));
  HUDDLE_RETURN_IF_ERROR(sec.Optional("burst_messages", &c.security.burst_messages, 1.0, 1e6));
  HUDDLE_RETURN_IF_ERROR(sec.Finish());
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap http, top.Child("http"));
  HUDDLE_RETURN_IF_ERROR(http.Optional("enabled", &c.http_enabled));
  HUDDLE_RETURN_IF_ERROR(http.Optional("bind", &c.http.bind));
  HUDDLE_RETURN_IF_ERROR(http.Optional("operator_metrics", &c.operator_metrics));
  int64_t connections = c.http.connection_limit;
  HUDDLE_RETURN_IF_ERROR(http.Optional("max_connections", &connections, 1, 1024));
  c.http.connection_limit = static_cast<unsigned>(connections);
  int64_t per_ip = c.http.per_ip_connection_limit;
  HUDDLE_RETURN_IF_ERROR(http.Optional("max_connections_per_address", &per_ip, 1, 1024));
  c.http.per_ip_connection_limit = static_cast<unsigned>(per_ip);
  int64_t timeout_ms = int64_t{c.http.connection_timeout_s} * 1000;
  HUDDLE_RETURN_IF_ERROR(http.OptionalSeconds("timeout_s", &timeout_ms, 1, 3600));
  c.http.connection_timeout_s = static_cast<unsigned>(timeout_ms / 1000);
  HUDDLE_RETURN_IF_ERROR(http.Finish());
  HUDDLE_RETURN_IF_ERROR(top.OptionalChoice("log_level", &c.log_level,
                                            {"trace", "debug", "info", "warn", "error", "off"}));
  HUDDLE_RETURN_IF_ERROR(top.Finish());
  return c;
}

// The job's YAML with its file paths inside STATE/files: a relative path (no "..") is resolved
// there; anything else is refused naming the key.
Status ResolvePath(YAML::Node parent, const char* key, const std::string& where,
                   const std::string& files_dir) {
  if (!parent.IsMap() || !parent[key]) return absl::OkStatus();
  YAML::Node value = parent[key];
  const std::string path = value.IsScalar() ? value.as<std::string>() : "";
  const std::filesystem::path p(path);
  bool escapes = path.empty() || p.is_absolute();
  for (const auto& part : p) escapes |= part == "..";
  if (escapes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": '", path.substr(0, 128),
        "' is not allowed in a submitted job: give a path relative to the service's files "
        "directory (",
        files_dir, "), without '..'"));
  }
  parent[key] = files_dir + "/" + path;
  return absl::OkStatus();
}

}  // namespace

StatusOr<service::CheckedJob> CheckSubmission(const std::string& submitted,
                                              const std::string& state_dir) {
  if (submitted.size() > kMaxJobYamlBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job is ", submitted.size(), " bytes; at most ", kMaxJobYamlBytes));
  }
  YAML::Node top;
  try {
    top = YAML::Load(submitted);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the job is not YAML: ", e.what()));
  }
  if (!top.IsMap()) return absl::InvalidArgumentError("the job is not a YAML mapping");
  // What the service decides, never a job: its endpoint and keys, where outputs go, local clients.
  for (const auto& [key, why] : std::vector<std::pair<std::string, std::string>>{
           {"security", "the service's keys and allow-list are its own (server.yaml)"},
           {"output", "the service keeps each job's outputs under its state directory"},
           {"simulation", "a simulation runs with `huddle run`, not on the service"},
           {"clients", "the service's agents take part; `clients` is for `huddle run`"},
           {"client", "the agents' devices are their own (agent.yaml)"}}) {
    if (top[key]) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", key, "' is not allowed in a submitted job: ", why));
    }
  }
  if (top["coordinator"] && top["coordinator"].IsMap() && top["coordinator"]["bind"]) {
    return absl::InvalidArgumentError(
        "'coordinator.bind' is not allowed in a submitted job: the service owns its endpoint");
  }
  const std::string name =
      top["name"] && top["name"].IsScalar() ? top["name"].as<std::string>() : std::string();
  if (!service::IsValidJobName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: a submitted job needs a name of 1-64 characters of [A-Za-z0-9._-], starting with "
        "a letter or digit (it names the job's directory)",
        name.empty() ? "" : absl::StrCat("; got '", name.substr(0, 64), "'")));
  }
  YAML::Node data = top["data"];
  if (!data || !data.IsMap() || !data["name"]) {
    return absl::InvalidArgumentError(
        "data.name: a submitted job names the data set its agents train on, as they declare it "
        "in agent.yaml (`datasets:`)");
  }
  for (const auto& kv : data) {
    const std::string key = kv.first.as<std::string>();
    if (key != "name") {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.", key.substr(0, 64),
          " is not allowed in a submitted job: the agents declare their data sets (path, format, "
          "partition) in agent.yaml; the job names one with data.name"));
    }
  }
  const std::string files = state_dir + "/files";
  HUDDLE_RETURN_IF_ERROR(ResolvePath(top["model"], "file", "model.file", files));
  HUDDLE_RETURN_IF_ERROR(ResolvePath(top["model"], "init", "model.init", files));
  HUDDLE_RETURN_IF_ERROR(ResolvePath(top["evaluation"], "data", "evaluation.data", files));
  YAML::Emitter out;
  out << top;
  std::string resolved = std::string(out.c_str()) + "\n";
  // Validated exactly as `huddle coordinator` validates a job file (same errors).
  const std::string tmp = state_dir + "/tmp";
  HUDDLE_RETURN_IF_ERROR(MakeDirs(tmp));
  const std::string check = tmp + "/" + name + ".yaml";
  HUDDLE_RETURN_IF_ERROR(WriteFileAtomic(check, resolved));
  StatusOr<JobConfig> job = LoadJobConfig(check);
  std::error_code ec;
  std::filesystem::remove(check, ec);
  if (!job.ok()) {
    // Its errors name the file checked; the operator knows it as the job.
    return Status(
        job.status().code(),
        absl::StrReplaceAll(job.status().message(), {{check + ": ", ""}, {check, "the job"}}));
  }
  return service::CheckedJob{name, std::move(resolved)};
}

std::string NowIso8601() { return Iso8601Utc(absl::ToUnixMillis(absl::Now())); }

StatusOr<service::PreparedJob> PrepareLoadedJob(JobConfig job, PreparedHooks hooks) {
  const coordinator::CoordinatorOptions& o = job.coordinator;
  HUDDLE_ASSIGN_OR_RETURN(coordinator::Evaluator evaluator, MakeEvaluator(job));
  service::PreparedJob p;
  p.data = job.data_name;
  p.rounds = o.rounds;
  p.wanted_agents = o.min_clients;
  if (o.cohort.sampling == coordinator::CohortOptions::Sampling::kFixed) {
    p.wanted_agents = std::max(p.wanted_agents, o.cohort.size);
  }
  const bool dp = o.privacy.mode != privacy::PrivacyMode::kNone;
  p.run = [evaluator, dp, job = std::move(job), hooks = std::move(hooks)](
              transport::ServerTransport* transport, const std::atomic<bool>* stop,
              const service::PreparedJob::RoundRows& on_round) -> Status {
    LogStartNotes(job);  // on the job's thread: into its log
    coordinator::Coordinator coord(job.coordinator, transport, SteadyClock::Get(), evaluator,
                                   [&on_round, &hooks, dp](const coordinator::RoundMetrics& m) {
                                     spdlog::info("{}", m.ProgressLine());
                                     if (hooks.on_round) hooks.on_round(m);
                                     if (dp) {
                                       on_round(m.PublicJson(), m.OperatorJson());
                                     } else {
                                       const std::string row = m.ToJson();
                                       on_round(row, row);
                                     }
                                   });
    HUDDLE_RETURN_IF_ERROR(coord.Run(stop));
    if (hooks.on_done) hooks.on_done(coord.summary());
    return absl::OkStatus();
  };
  return p;
}

namespace {

// A stored job made runnable: its configuration loaded, its outputs in `out_dir`.
StatusOr<service::PreparedJob> PrepareJob(const ServeConfig& serve, const std::string& name,
                                          const std::string& config_path,
                                          const std::string& out_dir, bool resume) {
  HUDDLE_ASSIGN_OR_RETURN(JobConfig job, LoadJobConfig(config_path));
  if (job.data_name.empty()) {
    return absl::InvalidArgumentError("data.name: the job does not name its data set");
  }
  coordinator::CoordinatorOptions& o = job.coordinator;
  o.job_name = name;
  o.out_dir = out_dir;
  o.resume = resume;
  o.force = !resume;  // a first start, or one interrupted before its first checkpoint
  if (o.secure_aggregation.enabled) {
    if (serve.security.allowed_clients.empty()) {
      return absl::FailedPreconditionError(
          "secure aggregation lists each member with its certificate from the allow-list: the "
          "service runs without one (--insecure)");
    }
    o.secure_aggregation.certificates = AllowListCertificates(serve.security.allowed_clients);
  }
  return PrepareLoadedJob(std::move(job));
}

}  // namespace

int RunServeCommand(const ServeFlags& flags) {
  auto loaded = LoadServeConfig(flags.config);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s: %s\n", kCommand, std::string(loaded.status().message()).c_str());
    return kExitUsage;
  }
  ServeConfig c = *std::move(loaded);
  if (!flags.state_dir.empty()) c.state_dir = flags.state_dir;
  if (!flags.bind.empty()) c.bind = flags.bind;
  if (!flags.operator_bind.empty()) c.operator_bind = flags.operator_bind;
  if (!flags.http_bind.empty()) c.http.bind = flags.http_bind;
  if (!flags.server_key.empty()) c.security.server_secret_key = flags.server_key;
  if (Status st = SetupLogging(c.log_level, "serve"); !st.ok()) return kExitUsage;
  (void)service::InstallJobLogRouting();
  // The agents' endpoint: the same transport security as `huddle coordinator`.
  JobConfig as_job;
  as_job.security = c.security;
  auto zopts = CoordinatorTransportOptions(as_job, flags.insecure);
  if (!zopts.ok()) {
    std::fprintf(stderr, "%s: %s\n", kCommand, std::string(zopts.status().message()).c_str());
    return kExitUsage;
  }
  service::OperatorServerOptions op;
  op.bind = c.operator_bind;
  if (!flags.insecure) {
    if (c.operators.empty()) {
      std::fprintf(stderr,
                   "%s: security.operators is required: a directory of operator .pub files "
                   "(`huddle keygen operator --id NAME --out keys/operators`); a client's key can "
                   "never act as an operator\n",
                   kCommand);
      return kExitUsage;
    }
    std::error_code ec;
    if (std::filesystem::equivalent(c.operators, c.security.allowed_clients, ec)) {
      std::fprintf(stderr,
                   "%s: security.operators and security.allowed_clients are the same (%s): the "
                   "operators' allow-list is its own directory of operator .pub files (`huddle "
                   "keygen operator`), so that no client key is ever taken for an operator's\n",
                   kCommand, c.operators.c_str());
      return kExitUsage;
    }
    op.server_key = zopts->curve_server->server;
    // Each list takes only its own role's keys, and refuses a key enrolled in the other (whatever
    // its file says): one key is one role, so a client's key never acts as an operator.
    op.zap.allow_list_path = c.operators;
    op.zap.role = transport::AllowListRole::kOperator;
    op.zap.conflicting_path = c.security.allowed_clients;
    op.zap.reload_interval_ms = c.security.reload_interval_ms;
    op.zap.reload_requests = &ReloadRequests();
    zopts->curve_server->zap.conflicting_path = c.operators;
  }
  auto store = service::JobStore::Open(c.state_dir);
  if (!store.ok()) {
    std::fprintf(stderr, "%s: state directory: %s\n", kCommand,
                 std::string(store.status().message()).c_str());
    return kExitFailed;
  }
  auto server = transport::BindZmqServer(c.bind, *zopts);
  if (!server.ok()) {
    std::fprintf(stderr, "%s: %s\n", kCommand, std::string(server.status().message()).c_str());
    return kExitFailed;
  }
  service::ServiceMetrics metrics;
  service::Service svc(
      c.service, *std::move(store), server->get(), SteadyClock::Get(),
      [&c](const std::string& name, const std::string& config_path, const std::string& out_dir,
           bool resume) { return PrepareJob(c, name, config_path, out_dir, resume); },
      NowIso8601, &metrics);
  service::OperatorApi api(
      &svc, [&c](const std::string& yaml) { return CheckSubmission(yaml, c.state_dir); },
      NowIso8601, &metrics);
  // Prometheus and the probes (loopback by default; bounded connections and timeouts).
  std::unique_ptr<service::HttpEndpoint> http;
  if (c.http_enabled) {
    service::HttpHandlers handlers;
    handlers.metrics = [&svc, &metrics, &c]() -> StatusOr<std::string> {
      return service::Render(metrics.Families(svc.Counts(), c.operator_metrics));
    };
    handlers.healthy = [&svc](std::string* reason) {
      if (svc.healthy(5000)) return true;
      *reason = "the dispatcher has not run for 5 s (starting, stopping, or stuck)";
      return false;
    };
    handlers.ready = [&svc](std::string* reason) {
      if (svc.ready()) return true;
      *reason = "starting or stopping";
      return false;
    };
    auto started = service::HttpEndpoint::Start(c.http, std::move(handlers));
    if (!started.ok()) {
      std::fprintf(stderr, "%s: http: %s\n", kCommand,
                   std::string(started.status().message()).c_str());
      return kExitFailed;
    }
    http = *std::move(started);
  }
  auto operators =
      service::OperatorServer::Start(op, [&api](const std::string& id, const std::string& request) {
        return api.Handle(id, request);
      });
  if (!operators.ok()) {
    std::fprintf(stderr, "%s: %s\n", kCommand, std::string(operators.status().message()).c_str());
    return kExitFailed;
  }
  spdlog::info("huddle {} serving: agents on {}, operators on {}, metrics on {}, state in {}",
               VersionLine(), c.bind, (*operators)->endpoint(),
               http ? "http://" + http->bind_address() + "/metrics" : std::string("(off)"),
               c.state_dir);
  Status st = svc.Run(&StopFlag());
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", kCommand, std::string(st.message()).c_str());
    return kExitFailed;
  }
  return StopFlag().load() ? StopExitCode() : kExitOk;
}

}  // namespace huddle::cli
