// The `huddle` subcommands. Each returns the process exit code; errors are printed to stderr as
// "huddle <command>: <message>".
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/job_config.h"
#include "common/clock.h"
#include "common/member_certificate.h"
#include "coordinator/coordinator.h"
#include "service/operator_api.h"
#include "service/service.h"
#include "transport/curve_keys.h"
#include "transport/zmq_transport.h"

namespace huddle::cli {

// The exit-code contract of every command (README, docs/deployment.md): 0 success; 1 the job (or
// the command's work) failed; 2 a configuration, flag or usage error (CLI11's own errors too);
// 128 + the signal after a clean stop by SIGINT (130) or SIGTERM (143).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// Set by SIGINT/SIGTERM (cli/signals.cc); long-running commands stop cleanly when it turns true.
std::atomic<bool>& StopFlag();
// The signal that first set StopFlag() (0: none yet).
std::atomic<int>& StopSignal();
// 128 + that signal (SIGTERM's 143 when none was recorded), and its name.
int StopExitCode();
const char* StopSignalName();
bool IsStopExitCode(int code);
// Bumped by SIGHUP: the coordinator reloads its client allow-list.
std::atomic<uint64_t>& ReloadRequests();
void InstallStopHandlers();

// Printed to stderr at every start with --insecure.
void WarnInsecure(const char* command);

struct CoordinatorFlags {
  std::string config;
  std::string out_dir;  // overrides output.dir
  std::string bind;     // overrides coordinator.bind
  bool resume = false;
  // --resume may read a checkpoint of a format before C4 (no checksum).
  bool allow_legacy_checkpoint = false;
  bool force = false;      // start afresh over an earlier job's outputs
  std::string server_key;  // overrides security.server_secret_key
  std::string allow;       // overrides security.allowed_clients
  bool insecure = false;
};
int RunCoordinatorCommand(const CoordinatorFlags& flags);

struct ClientFlags {
  std::string config;
  std::string coordinator;
  std::string client_id;
  std::string data;
  std::string format;
  int64_t num_classes = 0;  // > 0: overrides data.num_classes
  bool scale_255 = false;   // csv: divide features by 255 (data.scale_255)
  std::string partition;
  int64_t num_shards = 0;
  int64_t shard = -1;
  double alpha = 0;
  int64_t partition_seed = -1;
  double give_up_after_s = -1;
  std::string log_level;
  std::string server_key;   // the coordinator's .pub (overrides security.server_public_key)
  std::string key;          // this client's .key (overrides security.secret_key)
  std::string project_key;  // the project's .pub (overrides security.project_public_key)
  std::string device;       // auto | cpu | cuda[:N] (overrides the config's device)
  int64_t silo_nproc = 0;   // > 0: overrides silo.nproc
  double slowdown = 0;      // >= 1: overrides `slowdown` (ClientAgent::set_slowdown)
  bool insecure = false;
};
int RunClientCommand(const ClientFlags& flags);

struct RunFlags {
  std::string config;
  std::string out_dir;
  bool insecure = false;
  bool resume = false;  // continue the job in OUT
  bool force = false;   // start afresh over an earlier job's outputs in OUT
};

struct KeygenFlags {
  std::string role;  // server | client | project
  std::string id;    // client id (client), name (server: default "server"; project: "project")
  std::string out_dir = "keys";
};
int RunKeygenCommand(const KeygenFlags& flags);
// `huddle certify --project project.key [--days N] a.pub b.pub ...`: each client's certificate by
// the project key (common/member_certificate.h), written into its .pub.
struct CertifyFlags {
  std::string project_key;
  int64_t days = 0;  // 0: no expiry
  std::vector<std::string> files;
};
int RunCertifyCommand(const CertifyFlags& flags);
// `huddle provision project.yaml --out kits/` (cli/provision_cmd.cc, cli/provision.h): every
// party's kit (server, sites, operators, the project key), idempotent; at most one action.
struct ProvisionFlags {
  std::string project;  // project.yaml
  std::string out_dir;  // the kits' store
  std::string etc_dir = "/etc/huddle";
  std::string state_dir = "/var/lib/huddle";
  std::string add_site;     // enrol a site not in project.yaml
  std::string rotate;       // a new key pair for a site, an operator, the server or the project
  std::string remove_site;  // revoke a site
};
int RunProvisionCommand(const ProvisionFlags& flags);
// What the project key certifies of a client's key pair (`huddle certify`, `huddle provision`):
// its id, transport key and signing key, valid until `not_after` (0: no expiry).
StatusOr<MemberCertificate> CertificateFor(const transport::CurveKeyPair& keys, uint64_t not_after);
// The certificates in an allow-list directory (re-read when its files change, at most once a
// second), for the coordinator's secure-aggregation sessions.
std::function<std::optional<MemberCertificate>(const std::string&)> AllowListCertificates(
    std::string path);
// `huddle serve --config server.yaml` (cli/serve_cmd.cc): the long-running service.
struct ServeFlags {
  std::string config;
  std::string state_dir;      // overrides service.state_dir
  std::string bind;           // overrides service.bind
  std::string operator_bind;  // overrides service.operator_bind
  std::string http_bind;      // overrides http.bind
  std::string server_key;     // overrides security.server_secret_key (systemd's credentials)
  bool insecure = false;
};
int RunServeCommand(const ServeFlags& flags);
// A job submitted to the service, checked: its name, the sections only the service sets refused,
// its file paths resolved inside STATE/files, then validated as `huddle coordinator` validates a
// job file (same errors).
StatusOr<service::CheckedJob> CheckSubmission(const std::string& submitted,
                                              const std::string& state_dir);

// `huddle agent --config agent.yaml` (cli/agent_cmd.cc): a client agent that stays.
struct AgentFlags {
  std::string config;
  std::string service;     // overrides `coordinator:`, the service's endpoint
  std::string key;         // overrides security.secret_key (systemd's credentials)
  std::string server_key;  // overrides security.server_public_key
  std::string log_level;
  double slowdown = 0;  // >= 1: overrides `slowdown` (ClientAgent::set_slowdown)
  bool insecure = false;
};
int RunAgentCommand(const AgentFlags& flags);

// The operator commands (cli/operator_cmd.cc): submit FILE, jobs, status JOB, stop JOB,
// logs JOB [--follow], clients, and report (`huddle report --job JOB`: cli/report_cmd.cc).
struct OperatorFlags {
  std::string command;
  std::string argument;    // the job file (submit) or the job's name
  std::string service;     // the operators' endpoint ("": kDefaultOperatorEndpoint)
  std::string server_key;  // the service's .pub
  std::string key;         // this operator's .key
  bool insecure = false;
  bool json = false;
  bool follow = false;
  double timeout_s = 10;
  std::string output;          // report: the page's file ("": JOB-report.html here)
  bool operator_view = false;  // report: with the operator-only plots (labelled)
};
int RunOperatorCommand(const OperatorFlags& flags);
inline constexpr const char* kDefaultOperatorEndpoint = "tcp://127.0.0.1:5556";

// `huddle report OUT` (cli/report_cmd.cc): OUT/report.html, one self-contained page of the job's
// plots (report/report.h); `--job NAME` with the operator flags asks the service for its job's.
struct ReportFlags {
  std::string out_dir;  // a job's output directory (or --job)
  // --job NAME (`argument`), the page's file (`output`: default OUT/report.html, or
  // NAME-report.html), --operator, and the service's connection as the operator commands'.
  OperatorFlags remote = {.command = "report", .timeout_s = 30};
};
int RunReportCommand(const ReportFlags& flags);
// stderr lines about a page: it holds operator-only values (do not publish), or which plots DP
// left out of it.
void PrintReportNotes(bool operator_only, const std::vector<std::string>& left_out);

// `huddle run`: the whole federation on this machine (processes, or in-process simulation).
int RunLocalCommand(const RunFlags& flags, const std::string& self_exe);

// `huddle datacenter` (cli/datacenter_cmd.cc): `--nproc N` launches N ranks on this host; with
// --rank/--world-size/--rendezvous this process is one rank of a (multi-host) job.
struct DatacenterFlags {
  std::string config;
  std::string out_dir;  // overrides output.dir
  std::string device;   // cpu | cuda | auto (overrides datacenter.device)
  bool resume = false;  // continue from OUT/checkpoint.bin
  int64_t nproc = 0;    // 0: datacenter.nproc
  int rank = -1;
  int world_size = 0;
  int local_rank = -1;               // the GPU of this rank (default: rank modulo the GPUs present)
  std::string rendezvous;            // tcp://HOST:PORT or file:///DIR
  std::string run_id = "default";    // separates jobs sharing a rendezvous
  std::string host = "127.0.0.1";    // the address the other ranks reach this one at
  bool serve_rendezvous = true;      // rank 0 serves a tcp:// rendezvous itself
  std::string rendezvous_key;        // the job's key file (overrides HUDDLE_RENDEZVOUS_KEY)
  bool insecure_rendezvous = false;  // allow an unauthenticated tcp:// rendezvous
};
int RunDatacenterCommand(const DatacenterFlags& flags, const std::string& self_exe);

// `huddle privacy epsilon|rdp|noise` (cli/privacy_cmd.cc). Values stay strings until the command
// parses them, so that every bad or missing value exits 2 with a message naming its flag. Empty
// means "not given".
struct PrivacyFlags {
  std::string command;  // epsilon | rdp | noise
  std::string sampling_rate;
  std::string noise_multiplier;
  std::string steps;
  std::string delta;
  std::string order;
  std::string target_epsilon;
  std::string accountant;  // rdp (default) | pld | analytic
  bool json = false;
};
int RunPrivacyCommand(const PrivacyFlags& flags);

// Transport security from the configs and flags (cli/security.cc). Errors say what is missing and
// how to make it (huddle keygen) or to opt out (--insecure).
StatusOr<transport::ZmqOptions> CoordinatorTransportOptions(const JobConfig& job, bool insecure);
// Ephemeral keys for `huddle run`: DIR/server.{key,pub}, DIR/allowed/<id>.pub,
// DIR/clients/<id>.key.
Status GenerateLocalKeys(const std::string& dir, const std::vector<std::string>& client_ids);

// The job's server-side evaluator on its test set (empty when the job has none: federated
// evaluation, an external model, evaluation.every 0). Shared by every path that runs a job.
StatusOr<coordinator::Evaluator> MakeEvaluator(const JobConfig& job);
// Shared by the coordinator and simulation paths: loads the evaluation set and runs the job over
// `transport` on `clock` (a simulation's virtual clock, or real time).
int RunCoordinatorWith(JobConfig job, class transport::ServerTransport* transport,
                       const Clock* clock = SteadyClock::Get());
// "job 'NAME': 20 rounds, model mlp 784-128-10" (or "... asynchronous steps (concurrency C,
// buffer K) ..."): the line a job starts with on stdout.
std::string JobHeadline(const coordinator::CoordinatorOptions& o);
// The "done: ..." lines on stdout after a job (rounds or server steps, accuracy, privacy,
// traffic, outputs); `clock_simulated`: its times are a simulation's virtual seconds.
void PrintJobSummary(const coordinator::CoordinatorOptions& o, const coordinator::JobSummary& s,
                     bool clock_simulated = false);

// Now as ISO-8601 UTC with milliseconds (common/time_format.h), for the service's records.
std::string NowIso8601();

// A loaded job as the service runs it (`huddle serve` and `huddle run`, cli/serve_cmd.cc): its
// evaluator loaded, the agents it asks for, and a run that logs its start notes, runs its
// Coordinator over the service's transport and hands each round's rows to the service.
// `on_round` and `on_done` (optional) also get each round's metrics and the job's summary.
struct PreparedHooks {
  std::function<void(const coordinator::RoundMetrics&)> on_round;
  std::function<void(const coordinator::JobSummary&)> on_done;
};
StatusOr<service::PreparedJob> PrepareLoadedJob(JobConfig job, PreparedHooks hooks = {});

}  // namespace huddle::cli
