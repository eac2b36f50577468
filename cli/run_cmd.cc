// `huddle run job.yaml --out DIR`: a whole federation on this machine.
//
// Without a `simulation` section: the service of `huddle serve` in this process, on a loopback
// port with its state in DIR/service, and `clients` `huddle agent` processes, each declaring only
// its own shard of the job's data; the job is submitted to the service and runs as any submitted
// job does (service/service.h). Progress and the summary on stdout; the coordinator side logs to
// DIR/logs/coordinator.log, each agent to DIR/logs/client-NNN.log.
// With `simulation: {clients: N}`: the same coordinator and client agent code in this process,
// over the in-process transport, N agents sharing one copy of the training set (no sessions: the
// simulated clients are the job's from the start). With `clock: virtual` the transport is a
// discrete-event simulation on a virtual clock (transport/sim_transport.h, cli/simulation.h), and
// OUT/simulation.json records its settings and each client's drawn slowdown.
#include <signal.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/process.h"
#include "cli/simulation.h"
#include "client/agent.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "coordinator/coordinator.h"
#include "data/csv.h"
#include "data/fashion_mnist.h"
#include "data/partition.h"
#include "models/model.h"
#include "service/job_log.h"
#include "service/service.h"
#include "transport/inproc_transport.h"
#include "transport/ports.h"
#include "transport/sim_transport.h"
#include "transport/zmq_transport.h"

namespace huddle::cli {
namespace {

// The privacy policy `huddle run` gives each of its clients under DP: exactly what the job asks
// for, as a client that protects itself would state it (client/privacy_guard.h), so that the
// clients account their own releases and would refuse a coordinator that asked for less noise.
client::ClientPrivacyPolicy PolicyForJob(const JobConfig& job, std::string ledger_path) {
  client::ClientPrivacyPolicy policy;
  const coordinator::CoordinatorOptions& o = job.coordinator;
  // The plan's smallest noise multiplier over the job's rounds (0 if the plan is invalid: the
  // coordinator refuses such a job anyway).
  auto smallest_z = [&o] {
    auto plan = privacy::PrivacyPlan::Create(o.privacy, o.cohort.rate, o.rounds);
    if (!plan.ok()) return 0.0;
    double min_z = plan->ForRound(1).noise_multiplier;
    for (int64_t r = 2; r <= o.rounds; ++r) {
      min_z = std::min(min_z, plan->ForRound(static_cast<uint64_t>(r)).noise_multiplier);
    }
    return min_z;
  };
  if (o.privacy.mode == privacy::PrivacyMode::kLocal) {
    client::LocalDpPolicy local;
    local.require = true;
    local.delta = o.privacy.delta;
    local.max_epsilon = o.privacy.total_epsilon;
    local.min_noise_multiplier = smallest_z();
    policy.local = local;
  }
  if (o.privacy.mode == privacy::PrivacyMode::kDistributed) {
    // The client checks each session's noise share by the job's own threat model: the colluders
    // it tolerates, the plan's smallest z, the budget.
    client::DistributedDpPolicy dist;
    dist.require = true;
    dist.delta = o.privacy.delta;
    dist.max_epsilon = o.privacy.total_epsilon;
    dist.min_noise_multiplier = smallest_z();
    policy.distributed = dist;
  }
  if (o.train.dp_sgd) {
    client::DpSgdPolicy dp;
    dp.require = true;
    dp.min_noise_multiplier = o.train.dp_sgd->noise_multiplier;
    dp.delta = o.train.dp_sgd->delta;
    policy.dp_sgd = dp;
  }
  if (policy.any()) policy.ledger_path = std::move(ledger_path);
  // One machine, one operator: the reply time shows nothing it does not already know, and holding
  // replies would only slow the run (a deployed client holds them: privacy_guard.h).
  policy.reply_after_ms = 0;
  return policy;
}

// What `huddle run` gives each of its clients to assume in secure aggregation: the job's own
// threat model (the colluders it tolerates, the failure it accepts).
client::ClientSecAgg SecAggForJob(const JobConfig& job) {
  const aggregation::secagg::GraphOptions& g = job.coordinator.secure_aggregation.graph;
  client::ClientSecAgg c;
  c.corrupt_fraction = g.corrupt_fraction;
  c.security_bits = g.security_bits;
  return c;
}

// A YAML double-quoted scalar of `s` (paths may hold any character).
std::string Quoted(const std::string& s) {
  YAML::Emitter e;
  e << YAML::DoubleQuoted << s;
  return e.c_str();
}

// The data set name the local agents declare and the job trains on.
constexpr char kRunData[] = "local";

// Agent `i`'s configuration (`huddle agent --config`): the service's endpoint and keys, its shard
// of the job's data as the one data set it declares, its device, and, under DP or with secure
// aggregation, the job's own policy and threat model as a client that protects itself would state
// them (numbers in round-trip form).
std::string AgentYaml(const JobConfig& job, const std::string& endpoint, const std::string& id,
                      int64_t shard, const std::string& keys, bool insecure,
                      const client::ClientPrivacyPolicy& p) {
  const data::DataSpec& d = job.client_data;
  std::string y = fmt::format("coordinator: {}\nclient_id: {}\ndevice: {}\n", Quoted(endpoint),
                              Quoted(id), Quoted(job.client_device));
  if (job.client_silo_nproc > 1) y += fmt::format("silo: {{nproc: {}}}\n", job.client_silo_nproc);
  y += fmt::format("datasets:\n  {}:\n    path: {}\n    format: {}\n", kRunData,
                   Quoted(std::filesystem::absolute(d.path).string()), d.format);
  if (d.format == "csv") {
    y += fmt::format("    num_classes: {}\n    scale_255: {}\n", d.num_classes, d.csv_scale_255);
  }
  if (d.partitioned) {
    y += fmt::format(
        "    partition: {}\n    num_shards: {}\n    shard: {}\n    alpha: {}\n    seed: {}\n",
        d.partition.kind == data::PartitionOptions::Kind::kIid ? "iid" : "dirichlet",
        job.local_clients, shard, d.partition.alpha, d.partition.seed);
  }
  const bool secagg = job.coordinator.secure_aggregation.enabled;
  if (!insecure || secagg) {
    y += fmt::format("security:\n  secret_key: {}\n", Quoted(keys + "/clients/" + id + ".key"));
    if (!insecure) y += fmt::format("  server_public_key: {}\n", Quoted(keys + "/server.pub"));
    if (secagg) y += fmt::format("  project_public_key: {}\n", Quoted(keys + "/project.pub"));
  }
  if (secagg) {
    const client::ClientSecAgg a = SecAggForJob(job);
    y += fmt::format("secure_aggregation: {{corrupt_fraction: {}, security_bits: {}}}\n",
                     a.corrupt_fraction, a.security_bits);
  }
  if (!p.any()) return y;
  y += fmt::format("privacy:\n  ledger: {}\n  reply_after_s: {}\n", Quoted(p.ledger_path),
                   static_cast<double>(p.reply_after_ms.value_or(0)) / 1000);
  if (p.local) {
    y += fmt::format(
        "  local: {{require: {}, min_noise_multiplier: {}, delta: {}, adjacency: {}{}}}\n",
        p.local->require, p.local->min_noise_multiplier, p.local->delta, p.local->adjacency,
        p.local->max_epsilon ? fmt::format(", max_epsilon: {}", *p.local->max_epsilon) : "");
  }
  if (p.distributed) {
    y += fmt::format(
        "  distributed: {{require: {}, min_noise_multiplier: {}, delta: {}{}}}\n",
        p.distributed->require, p.distributed->min_noise_multiplier, p.distributed->delta,
        p.distributed->max_epsilon ? fmt::format(", max_epsilon: {}", *p.distributed->max_epsilon)
                                   : "");
  }
  if (p.dp_sgd) {
    y += fmt::format("  dp_sgd: {{require: {}, min_noise_multiplier: {}, delta: {}}}\n",
                     p.dp_sgd->require, p.dp_sgd->min_noise_multiplier, p.dp_sgd->delta);
  }
  return y;
}

// The local agents: started, watched, and stopped when the job is over.
class LocalAgents {
 public:
  ~LocalAgents() { StopAll(); }
  Status Start(const std::vector<std::string>& argv, const std::string& log) {
    HUDDLE_ASSIGN_OR_RETURN(pid_t pid, Spawn(argv, log, /*keep_stdout=*/false));
    pids_.push_back(pid);
    logs_.push_back(log);
    return absl::OkStatus();
  }
  // An agent that exited (agents stay until stopped: any exit is a failure), with its last line.
  std::optional<std::string> Failed() {
    for (size_t i = 0; i < pids_.size(); ++i) {
      int status = 0;
      if (pids_[i] > 0 && ::waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
        pids_[i] = -1;
        return fmt::format("an agent exited with {}: {} (see {})", ExitCode(status),
                           LastLogLine(logs_[i]), logs_[i]);
      }
    }
    return std::nullopt;
  }
  // SIGTERM to every agent (each leaves its session and exits), SIGKILL past 10 s.
  void StopAll() {
    for (pid_t pid : pids_) {
      if (pid > 0) ::kill(pid, SIGTERM);
    }
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (pid_t& pid : pids_) {
      if (pid <= 0) continue;
      int status = 0;
      while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > give_up) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      pid = -1;
    }
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<std::string> logs_;
};

// A process federation on this machine, built on the service: this process hosts the service
// (service/service.h) on a loopback port with its state in OUT/service, submits the job to it,
// and starts `clients` `huddle agent` processes, each declaring its shard of the job's data; the
// job runs exactly as a submitted job on `huddle serve`. Progress and the summary on stdout.
int RunProcesses(JobConfig job, const std::string& config, const std::string& out,
                 const std::string& exe, const RunFlags& flags) {
  const bool insecure = flags.insecure;
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "huddle run: %s\n", why.c_str());
    return kExitFailed;
  };
  auto port = transport::FreeLoopbackPort();
  if (!port.ok()) return fail(std::string(port.status().message()));
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(*port);
  const std::string logs = out + "/logs";
  if (Status st = MakeDirs(logs); !st.ok()) return fail(std::string(st.message()));
  std::vector<std::string> ids;
  for (int64_t i = 0; i < job.local_clients; ++i) ids.push_back(fmt::format("client-{:03}", i));
  // Even a local federation is encrypted and authenticated: fresh keys for every run. Secure
  // aggregation needs them even in plaintext: its members sign with certified keys.
  const std::string keys = std::filesystem::absolute(out + "/keys").string();
  const bool secagg = job.coordinator.secure_aggregation.enabled;
  if (insecure) WarnInsecure("run");
  if (!insecure || secagg) {
    if (Status st = GenerateLocalKeys(keys, ids); !st.ok()) {
      return fail("generating keys: " + std::string(st.message()));
    }
    job.security.allowed_clients = keys + "/allowed";
    job.security.server_secret_key = keys + "/server.key";
  }
  // The coordinator side's log lines (the service's and its job's) go to OUT/logs/coordinator.log
  // at the job's log level; the console shows warnings and errors.
  if (Status st = SetupLogging(job.log_level, "run"); !st.ok())
    return fail(std::string(st.message()));
  try {
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(logs + "/coordinator.log",
                                                                    /*truncate=*/true);
    file->set_formatter(std::make_unique<spdlog::pattern_formatter>(
        absl::StrCat(kLogTimePattern, " [coordinator] %l %v"), spdlog::pattern_time_type::utc));
    for (auto& sink : spdlog::default_logger()->sinks()) sink->set_level(spdlog::level::warn);
    spdlog::default_logger()->sinks().push_back(std::move(file));
    spdlog::default_logger()->flush_on(spdlog::level::trace);  // a log to follow as it runs
  } catch (const spdlog::spdlog_ex& e) {
    return fail(absl::StrCat("cannot open ", logs, "/coordinator.log: ", e.what()));
  }
  (void)service::InstallJobLogRouting();

  coordinator::CoordinatorOptions& o = job.coordinator;
  if (secagg) o.secure_aggregation.certificates = AllowListCertificates(keys + "/allowed");
  job.data_name = kRunData;
  auto zopts = CoordinatorTransportOptions(job, insecure);
  if (!zopts.ok()) return fail(std::string(zopts.status().message()));
  auto server = transport::BindZmqServer(endpoint, *zopts);
  if (!server.ok()) return fail(std::string(server.status().message()));
  // The service's state (the job's record and its own log) is this run's alone: a fresh one
  // each time (the job's outputs, its checkpoint and ledger included, are in OUT).
  const std::string state = out + "/service";
  std::error_code ec;
  std::filesystem::remove_all(state, ec);
  auto store = service::JobStore::Open(state);
  if (!store.ok()) return fail("state directory: " + std::string(store.status().message()));

  std::printf("huddle run: service on %s, %lld agent processes, %s, logs in %s\n", endpoint.c_str(),
              static_cast<long long>(job.local_clients),
              insecure ? "PLAINTEXT (--insecure)" : "CurveZMQ with ephemeral keys", logs.c_str());
  std::printf("%s\n", JobHeadline(o).c_str());
  std::fflush(stdout);

  // The agents first: they load their data while the job is prepared, and join once the service
  // runs (the endpoint is bound: their sessions wait in its queue).
  LocalAgents agents;
  std::optional<std::string> failure;
  for (int64_t i = 0; i < job.local_clients; ++i) {
    const std::string& id = ids[static_cast<size_t>(i)];
    const std::string dir = fmt::format("{}/clients/{}", out, id);
    const client::ClientPrivacyPolicy policy =
        PolicyForJob(job, std::filesystem::absolute(dir + "/privacy_ledger.jsonl").string());
    const std::string yaml = dir + "/agent.yaml";
    if (Status st = MakeDirs(dir); !st.ok()) {
      failure = std::string(st.message());
      break;
    }
    if (Status st = WriteFileAtomic(yaml, AgentYaml(job, endpoint, id, i, keys, insecure, policy));
        !st.ok()) {
      failure = fmt::format("cannot write {}: {}", yaml, st.message());
      break;
    }
    std::vector<std::string> argv = {exe, "agent", "--config", yaml};
    if (insecure) argv.push_back("--insecure");
    if (Status st = agents.Start(argv, logs + "/" + id + ".log"); !st.ok()) {
      failure = std::string(st.message());
      break;
    }
  }

  // The job as submitted, run in OUT with this run's --resume/--force (checked before).
  PreparedHooks hooks;
  hooks.on_round = [](const coordinator::RoundMetrics& m) {
    std::printf("%s\n", m.ProgressLine().c_str());
    std::fflush(stdout);
  };
  hooks.on_done = [options = o](const coordinator::JobSummary& s) { PrintJobSummary(options, s); };
  // Prepared (its test set loaded and checked) before the service starts: a job that cannot run
  // fails here with its own error (and the agents are stopped).
  auto prepared = failure ? StatusOr<service::PreparedJob>(absl::AbortedError(*failure))
                          : PrepareLoadedJob(job, std::move(hooks));
  if (!prepared.ok()) return fail(std::string(prepared.status().message()));
  auto preparer = [&prepared](const std::string&, const std::string&, const std::string&, bool) {
    return prepared;
  };
  service::ServiceOptions options;
  service::Service svc(options, *std::move(store), server->get(), SteadyClock::Get(), preparer,
                       NowIso8601);
  const std::string name = o.job_name;
  const std::string submitted = ReadFile(config, 1 << 20).value_or(std::string());
  if (auto r = svc.Submit(name, submitted, submitted, "huddle run"); !r.ok()) {
    return fail(std::string(r.status().message()));
  }
  std::atomic<bool> stop_service{false};
  Status served;
  std::thread dispatcher([&] { served = svc.Run(&stop_service); });

  // Until the job ends. An agent that exits (bad data, bad settings) stops the job at once with
  // its own error rather than leaving the job waiting for it.
  StatusOr<service::JobView> view = svc.Job(name);
  while (!failure && !StopFlag().load()) {
    view = svc.Job(name);
    if (!view.ok() || service::IsFinished(view->record.state)) break;
    failure = agents.Failed();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (failure && view.ok() && !service::IsFinished(view->record.state)) {
    (void)svc.Stop(name, "huddle run");
  }
  stop_service.store(true);
  server->get()->Wake();
  dispatcher.join();
  agents.StopAll();
  if (StopFlag().load()) return StopExitCode();
  if (failure) return fail(*failure);
  if (!served.ok()) return fail(std::string(served.message()));
  view = svc.Job(name);
  if (!view.ok()) return fail(std::string(view.status().message()));
  if (view->record.state != service::JobState::kCompleted) {
    return fail(fmt::format("job {}: {} (see {}/coordinator.log)",
                            service::JobStateName(view->record.state), view->record.reason, logs));
  }
  return kExitOk;
}

// One simulated client: the real agent behind the in-process transport.
class SimulatedClient final : public transport::InProcPeer {
 public:
  SimulatedClient(std::string id, data::DatasetView view, client::PrivacyGuard guard,
                  std::optional<client::SecAggIdentity> identity)
      : view_(std::move(view)), agent_(std::move(id), &view_, /*routine_logs_at_info=*/false) {
    agent_.set_privacy_guard(std::move(guard));
    if (identity) agent_.set_secagg_identity(*std::move(identity));
  }
  std::vector<wire::Message> OnStart() override {
    std::vector<wire::Message> out;
    out.push_back(agent_.MakeJoin());
    return out;
  }
  StatusOr<std::vector<wire::Message>> OnMessage(const wire::Message& msg) override {
    if (virtual_cost_ && msg.type() == wire::MessageType::kFitInstruction) {
      const auto& fit = std::get<wire::FitInstruction>(msg.body);
      using Mode = wire::UpdatePrivacy::Mode;
      // Under local or distributed DP or DP-SGD the agent reports no timing: that stays so.
      reports_time_ = fit.privacy.mode != Mode::kLocal && fit.privacy.mode != Mode::kDistributed &&
                      !fit.train.dp_sgd;
      train_seconds_ = ComputeSeconds(msg, static_cast<int64_t>(view_.size()), virtual_cost_->first,
                                      virtual_cost_->second);
    }
    StatusOr<std::vector<wire::Message>> replies = agent_.Handle(msg);
    if (virtual_cost_ && reports_time_ && replies.ok()) {
      for (wire::Message& m : *replies) {
        if (auto* result = std::get_if<wire::FitResult>(&m.body)) {
          result->train_seconds = train_seconds_;
        }
      }
    }
    return replies;
  }
  // On the virtual clock: the training seconds a FitResult reports are the simulated device's
  // (its compute time: `slowdown` x `seconds_per_example` per example), not this machine's, so
  // that the run stays the same, bitwise (cli/simulation.h).
  void set_virtual_cost(double slowdown, double seconds_per_example) {
    virtual_cost_.emplace(slowdown, seconds_per_example);
  }

 private:
  data::DatasetView view_;
  client::ClientAgent agent_;
  std::optional<std::pair<double, double>> virtual_cost_;  // slowdown, seconds per example
  bool reports_time_ = false;
  double train_seconds_ = 0;  // the last training instruction's, in virtual seconds
};

int RunSimulation(JobConfig job) {
  const SimulationOptions sim = *job.simulation;
  const data::DataSpec& d = job.client_data;
  StatusOr<data::Dataset> train =
      d.format == "csv"
          ? data::LoadCsvDataset(d.path, data::CsvOptions{d.num_classes, d.csv_scale_255})
          : data::LoadFashionMnist(d.path, data::Split::kTrain, nullptr);
  if (!train.ok()) {
    std::fprintf(stderr, "huddle run: %s\n", std::string(train.status().message()).c_str());
    return 1;
  }
  data::PartitionOptions popts = d.partition;
  popts.num_shards = sim.clients;
  popts.min_shard_size = 1;
  auto shards = data::Partition(train->labels, train->num_classes, popts);
  if (!shards.ok()) {
    std::fprintf(stderr, "huddle run: %s\n", std::string(shards.status().message()).c_str());
    return 1;
  }
  std::vector<std::unique_ptr<SimulatedClient>> clients;
  std::vector<transport::InProcPeer*> peers;
  std::vector<std::string> ids;
  std::vector<int64_t> shard_sizes;  // for the virtual clock's compute times
  const uint64_t seed = job.coordinator.seed;
  const std::vector<double> slowdowns = DrawSlowdowns(sim, seed);  // all 1 unless lognormal
  // Secure aggregation: an ephemeral project key certifies every simulated client (held by this
  // process alone); the members share one cache of verified signatures (every member verifies
  // the same member list's n signatures; a deployed client verifies them itself).
  const bool secagg = job.coordinator.secure_aggregation.enabled;
  const SigningKey project = SigningKey::Generate();
  auto certificates = std::make_shared<std::map<std::string, MemberCertificate>>();
  auto verified = std::make_shared<aggregation::secagg::SignatureCache>();
  for (int64_t i = 0; i < sim.clients; ++i) {
    data::DatasetView view;
    view.base = &train.value();
    view.indices = std::move((*shards)[static_cast<size_t>(i)]);
    shard_sizes.push_back(static_cast<int64_t>(view.size()));
    char id[32];
    std::snprintf(id, sizeof(id), "sim-%05lld", static_cast<long long>(i));
    ids.push_back(id);
    // The job's policy with an in-memory ledger: a thousand simulated clients keep no files.
    auto guard = client::PrivacyGuard::Open(PolicyForJob(job, ""));
    if (!guard.ok()) {
      std::fprintf(stderr, "huddle run: %s\n", std::string(guard.status().message()).c_str());
      return 1;
    }
    std::optional<client::SecAggIdentity> identity;
    if (secagg) {
      identity.emplace();
      identity->id = id;
      MemberCertificate c;
      c.id = id;
      c.transport_key = aggregation::secagg::Hash(
          std::span(reinterpret_cast<const uint8_t*>(c.id.data()), c.id.size()));
      c.signing_key = identity->key.public_key();
      (*certificates)[id] = Certify(c, project);
      const client::ClientSecAgg assumed = SecAggForJob(job);
      identity->policy.project_key = project.public_key();
      identity->policy.corrupt_fraction = assumed.corrupt_fraction;
      identity->policy.security_bits = assumed.security_bits;
      identity->policy.cache = verified.get();
    }
    clients.push_back(std::make_unique<SimulatedClient>(id, std::move(view), *std::move(guard),
                                                        std::move(identity)));
    if (sim.virtual_clock) {
      clients.back()->set_virtual_cost(slowdowns[static_cast<size_t>(i)], sim.seconds_per_example);
    }
    peers.push_back(clients.back().get());
  }
  if (secagg) {
    job.coordinator.secure_aggregation.certificates =
        [certificates](const std::string& id) -> std::optional<MemberCertificate> {
      auto it = certificates->find(id);
      if (it == certificates->end()) return std::nullopt;
      return it->second;
    };
  }
  job.coordinator.client_timeout_ms = 0;  // simulated clients do not heartbeat
  if (!sim.virtual_clock) {
    std::printf("huddle run: simulating %lld clients in-process on %lld threads\n",
                static_cast<long long>(sim.clients), static_cast<long long>(sim.threads));
    std::fflush(stdout);
    transport::InProcServerTransport transport(peers, static_cast<int>(sim.threads));
    transport.Start();
    return RunCoordinatorWith(std::move(job), &transport);
  }
  // A discrete-event simulation (transport/sim_transport.h): each client's compute and link times
  // in virtual time, so the job's times are simulated and the run is the same every time.
  const std::string record = job.coordinator.out_dir + "/simulation.json";
  if (Status st = WriteFileAtomic(record, SimulationJson(sim, seed, ids, slowdowns)); !st.ok()) {
    std::fprintf(stderr, "huddle run: cannot write %s: %s\n", record.c_str(),
                 std::string(st.message()).c_str());
    return kExitFailed;
  }
  std::printf("huddle run: %s\n", DescribeVirtualSimulation(sim, slowdowns).c_str());
  std::fflush(stdout);
  transport::SimulatedServerTransport transport(
      peers, TransportOptions(sim, seed, std::move(shard_sizes), slowdowns));
  transport.Start();
  const int code = RunCoordinatorWith(std::move(job), &transport, transport.clock());
  if (transport.dropouts() > 0) {
    std::printf("simulation: %llu training instructions dropped (simulation.dropout)\n",
                static_cast<unsigned long long>(transport.dropouts()));
  }
  // The record again, with what the run dropped.
  (void)WriteFileAtomic(record, SimulationJson(sim, seed, ids, slowdowns, transport.dropouts()));
  return code;
}

}  // namespace

int RunLocalCommand(const RunFlags& flags, const std::string& self_exe) {
  auto job = LoadJobConfig(flags.config);
  if (!job.ok()) {
    std::fprintf(stderr, "huddle run: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  if (job->coordinator.model.external()) {
    std::fprintf(stderr,
                 "huddle run: the job's model is external (model.file: only its tensors are "
                 "known): the built-in clients that huddle run starts cannot train it; run "
                 "`huddle coordinator --config %s` and clients that bring their own trainer "
                 "(client SDK)\n",
                 flags.config.c_str());
    return 2;
  }
  if (!flags.out_dir.empty()) job->coordinator.out_dir = flags.out_dir;
  if (job->coordinator.out_dir.empty())
    job->coordinator.out_dir = "runs/" + job->coordinator.job_name;
  job->coordinator.resume = flags.resume;
  job->coordinator.force = flags.force;
  // Before any process starts: an earlier job's outputs are never replaced by accident.
  if (Status st = coordinator::CheckOutputDir(job->coordinator); !st.ok()) {
    std::fprintf(stderr, "huddle run: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (job->simulation) {
    if (Status st = SetupLogging(job->log_level, "simulation"); !st.ok()) return 2;
    if (Status st = MakeDirs(job->coordinator.out_dir); !st.ok()) return 1;
    return RunSimulation(std::move(job).value());
  }
  std::string out_dir = job->coordinator.out_dir;
  return RunProcesses(*std::move(job), flags.config, out_dir, self_exe, flags);
}

}  // namespace huddle::cli
