// The `huddle` binary: one executable, one subcommand per role.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <iostream>
#include <tuple>
#include <vector>

#include "cli/commands.h"
#include "client/silo.h"
#include "common/memory.h"
#include "common/version.h"

int main(int argc, char** argv) {
  huddle::ConfigureMalloc();  // first, before any thread allocates
  CLI::App app{"Huddle: federated and privacy-preserving training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "huddle " + huddle::VersionLine());

  huddle::cli::CoordinatorFlags cf;
  CLI::App* coord = app.add_subcommand("coordinator", "Run a coordinator server for a job");
  coord->add_option("--config", cf.config, "Job YAML")->required()->check(CLI::ExistingFile);
  coord->add_option("--out", cf.out_dir, "Output directory (overrides output.dir)");
  coord->add_option("--bind", cf.bind, "Endpoint to bind, e.g. tcp://0.0.0.0:5555");
  coord->add_flag("--resume", cf.resume, "Continue from OUT/checkpoint.bin");
  coord->add_flag("--allow-legacy-checkpoint", cf.allow_legacy_checkpoint,
                  "With --resume: read a checkpoint of a format before C4, which carries no "
                  "checksum (damage or editing would go unnoticed)");
  coord->add_flag("--force", cf.force,
                  "Start afresh in an OUT that holds an earlier job's outputs (replacing them)");
  coord->add_option("--server-key", cf.server_key,
                    "The coordinator's secret key file (overrides security.server_secret_key)");
  coord->add_option("--allow", cf.allow,
                    "Enrolled clients: a directory of .pub files or a YAML file (overrides "
                    "security.allowed_clients); reloaded on change and on SIGHUP");
  coord->add_flag("--insecure", cf.insecure, "Plaintext, unauthenticated transport (debug only)");

  huddle::cli::ClientFlags kf;
  CLI::App* client = app.add_subcommand("client", "Run a client agent");
  client->add_option("--config", kf.config, "Client YAML")->check(CLI::ExistingFile);
  client->add_option("--coordinator", kf.coordinator, "Coordinator endpoint tcp://HOST:PORT");
  client->add_option("--client-id", kf.client_id, "This client's id ([A-Za-z0-9._-], unique)");
  client->add_option("--data", kf.data,
                     "Local data: a directory of IDX .gz files, or a CSV file with --format csv");
  client->add_option("--format", kf.format, "Data format: idx (default) or csv");
  client->add_option("--num-classes", kf.num_classes, "Labels lie in [0, N) (data.num_classes)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 16));
  client->add_flag("--scale-255", kf.scale_255,
                   "CSV features are 0-255: divide them by 255 (data.scale_255)");
  client->add_option("--partition", kf.partition,
                     "Use one shard of the data: none (default), iid or dirichlet");
  client->add_option("--num-shards", kf.num_shards, "Number of shards the data is split into");
  client->add_option("--shard", kf.shard, "This client's shard index, 0-based");
  client->add_option("--alpha", kf.alpha, "Dirichlet concentration for --partition dirichlet");
  client->add_option("--partition-seed", kf.partition_seed, "Seed of the partition");
  client->add_option("--give-up-after", kf.give_up_after_s,
                     "Exit if no coordinator answers for this many seconds (0: never)");
  client->add_option("--log-level", kf.log_level, "trace, debug, info, warn, error, off");
  client->add_option("--server-key", kf.server_key,
                     "The coordinator's public key file, pinned (security.server_public_key)");
  client->add_option("--key", kf.key, "This client's secret key file (security.secret_key)");
  client->add_option("--project-key", kf.project_key,
                     "The project's public key file, pinned (security.project_public_key)");
  client->add_option("--device", kf.device,
                     "Where to train: auto (a GPU if one is usable), cpu, cuda or cuda:N");
  client
      ->add_option("--silo-nproc", kf.silo_nproc,
                   "Ranks (CPU ranks or GPUs) that train as this one client, data-parallel "
                   "(overrides silo.nproc)")
      ->check(CLI::Range(int64_t{1}, huddle::client::kMaxSiloRanks));
  client
      ->add_option("--slowdown", kf.slowdown,
                   "Behave like a device X times slower: after local training, wait (X - 1) x "
                   "its time before asking to upload (overrides slowdown; default 1)")
      ->check(CLI::Range(1.0, huddle::client::kMaxSlowdown));
  client->add_flag("--insecure", kf.insecure, "Plaintext, unauthenticated transport (debug only)");

  huddle::cli::RunFlags rf;
  CLI::App* run = app.add_subcommand("run", "Run a whole federation on this machine");
  run->add_option("config", rf.config, "Job YAML")->required()->check(CLI::ExistingFile);
  run->add_option("--out", rf.out_dir, "Output directory (overrides output.dir)");
  run->add_flag("--resume", rf.resume, "Continue the job in OUT from its checkpoint");
  run->add_flag("--force", rf.force,
                "Start afresh in an OUT that holds an earlier job's outputs (replacing them)");
  run->add_flag("--insecure", rf.insecure,
                "Plaintext transport between the local processes (default: ephemeral CurveZMQ "
                "keys in OUT/keys)");

  huddle::cli::ServeFlags sf;
  CLI::App* serve = app.add_subcommand(
      "serve", "Run the long-running service: it hosts the jobs operators submit, for agents");
  serve->add_option("--config", sf.config, "Service YAML (server.yaml)")
      ->required()
      ->check(CLI::ExistingFile);
  serve->add_option("--state-dir", sf.state_dir, "State directory (overrides service.state_dir)");
  serve->add_option("--bind", sf.bind, "The agents' endpoint (overrides service.bind)");
  serve->add_option("--operator-bind", sf.operator_bind,
                    "The operators' endpoint (overrides service.operator_bind)");
  serve->add_option("--http-bind", sf.http_bind,
                    "HOST:PORT of /metrics, /healthz, /readyz (overrides http.bind)");
  serve->add_option("--server-key", sf.server_key,
                    "The service's secret key file (overrides security.server_secret_key; the "
                    "systemd unit passes its credential)");
  serve->add_flag("--insecure", sf.insecure,
                  "Plaintext, unauthenticated agents and operators (debug only; the operators' "
                  "endpoint must then be loopback)");

  huddle::cli::AgentFlags af;
  CLI::App* agent = app.add_subcommand(
      "agent", "Run a client agent that stays, taking part in the service's jobs");
  agent->add_option("--config", af.config, "Agent YAML (its data sets, keys, privacy policy)")
      ->required()
      ->check(CLI::ExistingFile);
  agent->add_option("--service", af.service, "The service's endpoint tcp://HOST:PORT");
  agent->add_option("--key", af.key,
                    "This agent's secret key file (overrides security.secret_key; the systemd "
                    "unit passes its credential)");
  agent->add_option("--server-key", af.server_key,
                    "The service's public key file, pinned (overrides security.server_public_key)");
  agent->add_option("--log-level", af.log_level, "trace, debug, info, warn, error, off");
  agent
      ->add_option("--slowdown", af.slowdown,
                   "Behave like a device X times slower: after local training, wait (X - 1) x "
                   "its time before asking to upload (overrides slowdown; default 1)")
      ->check(CLI::Range(1.0, huddle::client::kMaxSlowdown));
  agent->add_flag("--insecure", af.insecure, "Plaintext, unauthenticated transport (debug only)");

  // The service's connection, the same for every operator command and `report --job`.
  auto add_connection_options = [](CLI::App* sub, huddle::cli::OperatorFlags& f) {
    sub->add_option("--service", f.service,
                    std::string("The service's operators' endpoint (default ") +
                        huddle::cli::kDefaultOperatorEndpoint + ")");
    sub->add_option("--server-key", f.server_key, "The service's public key file (server.pub)");
    sub->add_option("--key", f.key, "This operator's key file (enrolled in security.operators)");
    sub->add_option("--timeout", f.timeout_s, "Seconds to wait for the answer")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
    sub->add_flag("--insecure", f.insecure, "Plaintext (a service started with --insecure)");
  };
  huddle::cli::OperatorFlags of;
  std::vector<CLI::App*> operator_commands;
  for (const auto& [name, help, arg, arg_help] :
       std::vector<std::tuple<const char*, const char*, const char*, const char*>>{
           {"submit", "Submit a job to the service", "job", "Job YAML"},
           {"jobs", "List the service's jobs", nullptr, nullptr},
           {"status", "A job's state, round, epsilon and agents", "job", "The job's name"},
           {"stop", "Stop a job for good", "job", "The job's name"},
           {"logs", "A job's log", "job", "The job's name"},
           {"clients", "The service's agents: live, last seen, job", nullptr, nullptr}}) {
    CLI::App* sub = app.add_subcommand(name, help);
    if (arg != nullptr) sub->add_option(arg, of.argument, arg_help)->required();
    add_connection_options(sub, of);
    sub->add_flag("--json", of.json, "Print the service's answer as JSON");
    if (std::string(name) == "logs") {
      sub->add_flag("--follow,-f", of.follow, "Keep printing new lines until the job ends");
    }
    operator_commands.push_back(sub);
  }

  huddle::cli::ReportFlags rpf;
  CLI::App* report = app.add_subcommand(
      "report",
      "Write a job's report: one self-contained HTML page of its plots (OUT/report.html), or with "
      "--job the service's page of one of its jobs");
  report->add_option("out", rpf.out_dir, "The job's output directory (a running job's too)");
  report->add_option("--job", rpf.remote.argument,
                     "A service's job, by name (with the operator flags)");
  report->add_option("--output", rpf.remote.output,
                     "The page's file (default OUT/report.html; with --job NAME-report.html)");
  report->add_flag("--operator", rpf.remote.operator_view,
                   "Under DP, also the operator-only plots (computed without noise), each marked "
                   "so: not for publication");
  add_connection_options(report, rpf.remote);

  huddle::cli::DatacenterFlags df;
  CLI::App* dc = app.add_subcommand(
      "datacenter",
      "Train one model synchronously across ranks (--nproc N on this host, or one "
      "rank of a multi-host job)");
  dc->add_option("--config", df.config, "Datacenter job YAML")
      ->required()
      ->check(CLI::ExistingFile);
  dc->add_option("--nproc", df.nproc, "Ranks to start on this host (default datacenter.nproc)")
      ->check(CLI::Range(1, 1024));
  dc->add_option("--out", df.out_dir, "Output directory (overrides output.dir)");
  dc->add_option("--device", df.device, "cpu (Gloo), cuda (NCCL, one GPU per rank) or auto");
  dc->add_flag("--resume", df.resume, "Continue from OUT/checkpoint.bin (read by rank 0)");
  dc->add_option("--rank", df.rank, "This process's rank in [0, world size)")
      ->check(CLI::Range(0, 1 << 20));
  dc->add_option("--world-size", df.world_size, "Number of ranks in the job")
      ->check(CLI::Range(1, 1 << 20));
  dc->add_option("--rendezvous", df.rendezvous,
                 "tcp://HOST:PORT (rank 0 serves it on PORT) or file:///SHARED/DIR");
  dc->add_option("--local-rank", df.local_rank, "GPU of this rank (default: rank mod GPUs)")
      ->check(CLI::Range(0, 1023));
  dc->add_option("--host", df.host, "This host's address as the other ranks reach it")
      ->capture_default_str();
  dc->add_option("--run-id", df.run_id, "Names this job in a shared rendezvous")
      ->capture_default_str();
  dc->add_option("--rendezvous-key", df.rendezvous_key,
                 "Key file of the job's tcp:// rendezvous, the same on every host (huddle keygen "
                 "server --id JOB; also HUDDLE_RENDEZVOUS_KEY)");
  dc->add_flag("--insecure-rendezvous", df.insecure_rendezvous,
               "Allow an unauthenticated tcp:// rendezvous (every host on the network trusted)");
  dc->add_flag("!--no-serve-rendezvous", df.serve_rendezvous,
               "Rank 0 does not serve the tcp:// rendezvous (another process does)");

  huddle::cli::KeygenFlags gf;
  CLI::App* keygen = app.add_subcommand(
      "keygen",
      "Create a key pair: a CurveZMQ server, client or operator key (a client's with its "
      "signing key; an operator's for `huddle submit` and the other operator commands, enrolled "
      "in the service's security.operators), or a project key that certifies clients");
  keygen->add_option("role", gf.role, "server, client, operator or project")
      ->required()
      ->check(CLI::IsMember({"server", "client", "operator", "project"}));
  keygen->add_option("--id", gf.id,
                     "Client id (client keys) or operator name (operator keys); file name "
                     "(server keys, default server; project keys, default project)");
  keygen->add_option("--out", gf.out_dir, "Directory for NAME.key (0600) and NAME.pub")
      ->capture_default_str();

  huddle::cli::CertifyFlags tf;
  CLI::App* certify = app.add_subcommand(
      "certify", "Certify enrolled clients with the project key (writes each .pub's certificate)");
  certify->add_option("--project", tf.project_key, "The project's secret key file (project.key)")
      ->required();
  certify->add_option("--days", tf.days, "Valid for this many days (0: no expiry)")
      ->capture_default_str()
      ->check(CLI::Range(0, 36500));
  certify->add_option("pub", tf.files, "Client .pub files to certify")->required();

  huddle::cli::ProvisionFlags vf;
  CLI::App* provision = app.add_subcommand(
      "provision",
      "Make the kits that install a federation from project.yaml: the server's, each site's and "
      "each operator's (a directory and a tarball each, keys included); idempotent");
  provision->add_option("project", vf.project, "project.yaml")
      ->required()
      ->check(CLI::ExistingFile);
  provision->add_option("--out", vf.out_dir, "The kits' store (kept between runs)")->required();
  provision->add_option("--etc-dir", vf.etc_dir, "Where the kits are installed")
      ->capture_default_str();
  provision->add_option("--state-dir", vf.state_dir, "The service's and agents' state")
      ->capture_default_str();
  CLI::Option* add_site = provision->add_option(
      "--add-site", vf.add_site, "Enrol a site not in project.yaml (kept on later runs)");
  CLI::Option* rotate = provision->add_option(
      "--rotate", vf.rotate, "A new key pair for a site, an operator, the server or the project");
  CLI::Option* remove_site =
      provision->add_option("--remove-site", vf.remove_site,
                            "Revoke a site: its key leaves the allow-list, its kit goes");
  add_site->excludes(rotate)->excludes(remove_site);
  rotate->excludes(remove_site);

  huddle::cli::PrivacyFlags pf;
  CLI::App* privacy =
      app.add_subcommand("privacy", "Privacy accounting for the subsampled Gaussian");
  privacy->require_subcommand(1);
  CLI::App* privacy_eps =
      privacy->add_subcommand("epsilon", "Epsilon spent by STEPS releases at rate Q, noise Z");
  CLI::App* privacy_rdp = privacy->add_subcommand("rdp", "One-step Renyi DP at an order");
  CLI::App* privacy_noise =
      privacy->add_subcommand("noise", "Smallest noise multiplier that stays within a budget");
  for (CLI::App* sub : {privacy_eps, privacy_rdp, privacy_noise}) {
    sub->add_option("--sampling-rate", pf.sampling_rate, "Poisson sampling rate q in [0, 1]");
    sub->add_flag("--json", pf.json, "Print one JSON object");
  }
  for (CLI::App* sub : {privacy_eps, privacy_rdp}) {
    sub->add_option("--noise-multiplier", pf.noise_multiplier, "Noise stddev / clip norm");
  }
  for (CLI::App* sub : {privacy_eps, privacy_noise}) {
    sub->add_option("--steps", pf.steps, "Number of releases");
    sub->add_option("--delta", pf.delta, "Target delta in (0, 1)");
    sub->add_option("--accountant", pf.accountant, "rdp (default), pld or analytic (q = 1)");
  }
  privacy_rdp->add_option("--order", pf.order, "Renyi order > 1");
  privacy_noise->add_option("--target-epsilon", pf.target_epsilon, "Epsilon budget (nats)");

  // CLI11's own exit codes (105, 106, 109, ...) are mapped onto the contract of cli/commands.h:
  // --help and --version print and exit 0, every parse error exits 2.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? huddle::cli::kExitOk : huddle::cli::kExitUsage;
  }
  huddle::cli::InstallStopHandlers();

  if (*coord) return huddle::cli::RunCoordinatorCommand(cf);
  if (*serve) return huddle::cli::RunServeCommand(sf);
  if (*agent) return huddle::cli::RunAgentCommand(af);
  for (CLI::App* sub : operator_commands) {
    if (*sub) {
      of.command = sub->get_name();
      return huddle::cli::RunOperatorCommand(of);
    }
  }
  if (*report) return huddle::cli::RunReportCommand(rpf);
  if (*client) return huddle::cli::RunClientCommand(kf);
  if (*keygen) return huddle::cli::RunKeygenCommand(gf);
  if (*certify) return huddle::cli::RunCertifyCommand(tf);
  if (*provision) return huddle::cli::RunProvisionCommand(vf);
  if (*privacy) {
    pf.command = *privacy_eps ? "epsilon" : *privacy_rdp ? "rdp" : "noise";
    return huddle::cli::RunPrivacyCommand(pf);
  }
  if (*run || *dc) {
    char self[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    std::string exe = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
    if (*dc) return huddle::cli::RunDatacenterCommand(df, exe);
    return huddle::cli::RunLocalCommand(rf, exe);
  }
  return huddle::cli::kExitUsage;
}
