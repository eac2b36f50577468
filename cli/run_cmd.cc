// `huddle run job.yaml --out DIR`: a whole federation on this machine.
//
// Without a `simulation` section: one coordinator process and `clients` client processes on
// 127.0.0.1, each client loading only its own shard. Progress comes from the coordinator's
// stdout; every process logs to DIR/logs/.
// With `simulation: {clients: N}`: the same coordinator and client agent code in this process,
// over the in-process transport, N agents sharing one copy of the training set.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/process.h"
#include "client/agent.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "coordinator/coordinator.h"
#include "data/csv.h"
#include "data/fashion_mnist.h"
#include "data/partition.h"
#include "transport/inproc_transport.h"
#include "transport/ports.h"

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

// The policy as a client YAML (`huddle client --config`), numbers in round-trip form; with secure
// aggregation, the client's assumptions and the project key it pins too.
std::string ClientYaml(const client::ClientPrivacyPolicy& p, const JobConfig& job,
                       const std::string& project_public_key) {
  std::string y;
  if (job.coordinator.secure_aggregation.enabled) {
    const client::ClientSecAgg a = SecAggForJob(job);
    y += fmt::format("security: {{project_public_key: \"{}\"}}\n", project_public_key);
    y += fmt::format("secure_aggregation: {{corrupt_fraction: {}, security_bits: {}}}\n",
                     a.corrupt_fraction, a.security_bits);
  }
  if (!p.any()) return y;
  y += fmt::format("privacy:\n  ledger: \"{}\"\n  reply_after_s: {}\n", p.ledger_path,
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

int RunProcesses(const JobConfig& job, const std::string& config, const std::string& out,
                 const std::string& exe, const RunFlags& flags) {
  const bool insecure = flags.insecure;
  auto port = transport::FreeLoopbackPort();
  if (!port.ok()) {
    std::fprintf(stderr, "huddle run: %s\n", std::string(port.status().message()).c_str());
    return 1;
  }
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(*port);
  const std::string logs = out + "/logs";
  if (Status st = MakeDirs(logs); !st.ok()) {
    std::fprintf(stderr, "huddle run: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::vector<std::string> ids;
  for (int64_t i = 0; i < job.local_clients; ++i) {
    char id[32];
    std::snprintf(id, sizeof(id), "client-%03lld", static_cast<long long>(i));
    ids.push_back(id);
  }
  // Even a local federation is encrypted and authenticated: fresh keys for every run. Secure
  // aggregation needs them even in plaintext: its members sign with certified keys.
  const std::string keys = out + "/keys";
  const bool secagg = job.coordinator.secure_aggregation.enabled;
  if (insecure) WarnInsecure("run");
  if (!insecure || secagg) {
    if (Status st = GenerateLocalKeys(keys, ids); !st.ok()) {
      std::fprintf(stderr, "huddle run: generating keys: %s\n", std::string(st.message()).c_str());
      return 1;
    }
  }
  std::printf("huddle run: coordinator on %s, %lld client processes, %s, logs in %s\n",
              endpoint.c_str(), static_cast<long long>(job.local_clients),
              insecure ? "PLAINTEXT (--insecure)" : "CurveZMQ with ephemeral keys", logs.c_str());
  std::fflush(stdout);

  std::vector<std::string> coord_argv = {exe,     "coordinator", "--config", config,
                                         "--out", out,           "--bind",   endpoint};
  if (flags.resume) coord_argv.push_back("--resume");
  if (flags.force) coord_argv.push_back("--force");
  if (insecure) {
    coord_argv.push_back("--insecure");
    if (secagg) coord_argv.insert(coord_argv.end(), {"--allow", keys + "/allowed"});
  } else {
    coord_argv.insert(coord_argv.end(),
                      {"--server-key", keys + "/server.key", "--allow", keys + "/allowed"});
  }
  auto coord = Spawn(coord_argv, logs + "/coordinator.log", /*keep_stdout=*/true);
  if (!coord.ok()) return 1;
  std::vector<pid_t> clients;
  std::vector<std::string> client_logs;
  const data::DataSpec& d = job.client_data;
  for (int64_t i = 0; i < job.local_clients; ++i) {
    const std::string& id = ids[static_cast<size_t>(i)];
    std::vector<std::string> argv = {
        exe,        "client",         "--coordinator", endpoint, "--client-id",     id,
        "--data",   d.path,           "--format",      d.format, "--give-up-after", "120",
        "--device", job.client_device};
    if (d.format == "csv") {
      argv.insert(argv.end(), {"--num-classes", std::to_string(d.num_classes)});
      if (d.csv_scale_255) argv.push_back("--scale-255");
    }
    if (job.client_silo_nproc > 1) {
      argv.insert(argv.end(), {"--silo-nproc", std::to_string(job.client_silo_nproc)});
    }
    if (insecure) {
      argv.push_back("--insecure");
      if (secagg) argv.insert(argv.end(), {"--key", keys + "/clients/" + id + ".key"});
    } else {
      argv.insert(argv.end(), {"--server-key", keys + "/server.pub", "--key",
                               keys + "/clients/" + id + ".key"});
    }
    const client::ClientPrivacyPolicy policy =
        PolicyForJob(job, fmt::format("{}/clients/{}/privacy_ledger.jsonl", out, id));
    if (policy.any() || secagg) {
      const std::string dir = fmt::format("{}/clients/{}", out, id);
      const std::string yaml = dir + "/client.yaml";
      const std::string text = ClientYaml(policy, job, keys + "/project.pub");
      if (Status st = MakeDirs(dir); !st.ok() || !WriteFileAtomic(yaml, text).ok()) {
        std::fprintf(stderr, "huddle run: cannot write %s\n", yaml.c_str());
        ::kill(*coord, SIGTERM);
        return 1;
      }
      argv.insert(argv.end(), {"--config", yaml});
    }
    if (d.partitioned) {
      argv.insert(argv.end(),
                  {"--partition",
                   d.partition.kind == data::PartitionOptions::Kind::kIid ? "iid" : "dirichlet",
                   "--num-shards", std::to_string(job.local_clients), "--shard", std::to_string(i),
                   "--alpha", std::to_string(d.partition.alpha), "--partition-seed",
                   std::to_string(d.partition.seed)});
    }
    auto pid = Spawn(argv, logs + "/" + id + ".log", /*keep_stdout=*/false);
    if (pid.ok()) {
      clients.push_back(*pid);
      client_logs.push_back(logs + "/" + id + ".log");
    }
  }

  // Wait for the coordinator. A client that fails (bad data, bad flags) stops the job at once
  // with its own error rather than leaving the coordinator waiting for it.
  int status = 0;
  bool client_failed = false;
  while (true) {
    pid_t r = ::waitpid(*coord, &status, WNOHANG);
    if (r == *coord) break;
    if (StopFlag().load()) ::kill(*coord, SIGTERM);
    for (size_t i = 0; i < clients.size() && !client_failed; ++i) {
      int cs = 0;
      if (clients[i] > 0 && ::waitpid(clients[i], &cs, WNOHANG) == clients[i]) {
        clients[i] = -1;
        if (ExitCode(cs) != 0) {
          const std::string last = LastLogLine(client_logs[i]);
          std::fprintf(stderr, "huddle run: a client exited with %d: %s (see %s)\n", ExitCode(cs),
                       last.c_str(), client_logs[i].c_str());
          client_failed = true;
          ::kill(*coord, SIGTERM);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Clients leave on the coordinator's Shutdown; give them a moment, then stop the rest.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (pid_t pid : clients) {
    if (pid <= 0) continue;
    if (client_failed) ::kill(pid, SIGTERM);
    int cs;
    while (::waitpid(pid, &cs, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        ::kill(pid, SIGTERM);
        ::waitpid(pid, &cs, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  if (StopFlag().load()) return StopExitCode();
  if (client_failed) return 1;
  const int code = ExitCode(status);
  if (code != 0) {
    std::fprintf(stderr, "huddle run: coordinator exited with %d; see %s/coordinator.log\n", code,
                 logs.c_str());
  }
  return code;
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
    return agent_.Handle(msg);
  }

 private:
  data::DatasetView view_;
  client::ClientAgent agent_;
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
    char id[32];
    std::snprintf(id, sizeof(id), "sim-%05lld", static_cast<long long>(i));
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
  std::printf("huddle run: simulating %lld clients in-process on %lld threads\n",
              static_cast<long long>(sim.clients), static_cast<long long>(sim.threads));
  std::fflush(stdout);
  job.coordinator.client_timeout_ms = 0;  // simulated clients do not heartbeat
  transport::InProcServerTransport transport(peers, static_cast<int>(sim.threads));
  transport.Start();
  return RunCoordinatorWith(std::move(job), &transport);
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
  return RunProcesses(*job, flags.config, out_dir, self_exe, flags);
}

}  // namespace huddle::cli
