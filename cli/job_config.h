// The job YAML and the client YAML, mapped onto Options structs in one place. Every key, its
// default and its range is listed in README.md ("Configuration reference"); unknown keys and bad
// values are errors naming the key, the value and what is allowed.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "client/config.h"
#include "client/privacy_guard.h"
#include "client/runner.h"
#include "common/status.h"
#include "coordinator/options.h"
#include "data/client_data.h"
#include "datacenter/job_options.h"
#include "models/dp_sgd.h"
#include "privacy/accountant.h"

namespace huddle::cli {

// `simulation:` the job's clients simulated in `huddle run`'s own process (cli/run_cmd.cc).
struct SimulationOptions {
  int64_t clients = 0;  // simulated clients (in one process)
  int64_t threads = 2;  // pool threads running them
  // `clock: real` (the default): the clients work in real time over the in-process transport.
  // `clock: virtual`: a discrete-event simulation (transport/sim_transport.h) in which the
  // settings below give each client's compute and link times; nothing waits in real time for them,
  // and the same job and seed give the same run. Those settings are refused with `clock: real`.
  bool virtual_clock = false;
  // `slowdown: {distribution: constant | lognormal, sigma}`: each client's multiplier on its
  // compute time, drawn once per client from the job seed (lognormal: exp(sigma * N(0, 1)), median
  // 1; constant: 1 for every client).
  bool lognormal_slowdown = false;
  double slowdown_sigma = 1.0;  // lognormal only
  // Virtual seconds of one example's forward and backward pass on a client of slowdown 1 (a
  // round's training costs that times the examples it passes over; an evaluation a third of it
  // per example).
  double seconds_per_example = 0.001;
  double latency_s = 0.05;        // one-way, per message
  double bandwidth_mbit_s = 100;  // each client's link, each way
  double dropout = 0;             // probability that a training instruction is never answered
};

// The coordinator's transport security (docs/security.md). Paths are relative to the working
// directory. Without keys the coordinator refuses to start unless --insecure is given.
struct ServerSecurity {
  std::string server_secret_key;      // the coordinator's .key file (huddle keygen server)
  std::string allowed_clients;        // a directory of client .pub files, or a YAML `clients:` file
  int64_t reload_interval_ms = 5000;  // allow-list change check (also reloaded on SIGHUP)
  double max_messages_per_s = 100;    // per enrolled client (all its connections)
  double burst_messages = 200;
};

struct JobConfig {
  coordinator::CoordinatorOptions coordinator;
  std::string bind = "tcp://127.0.0.1:5555";
  // `evaluation.data`: the coordinator's test set for server-side evaluation: an IDX directory's
  // test split (t10k-*) or a CSV file. LoadJobConfig defaults it to Fashion-MNIST's only for a
  // model of its input (784 features) and refuses any other model's server evaluation without it;
  // RunCoordinatorWith loads it and checks it against the model before round 1.
  std::string eval_data = data::kDefaultFashionMnistDir;
  // `evaluation.format`: idx | csv (default: idx for a directory, csv for a file, else data.format)
  std::string eval_format = "idx";
  bool eval_scale_255 = false;  // `evaluation.scale_255` (default: data.scale_255), csv only
  // How `huddle run` feeds its local clients: one shard each of this data set.
  data::DataSpec client_data;
  // `data.name`: the data set a service job trains on, by the name agents declare it under
  // (`huddle serve`, `huddle agent`); "" when not given.
  std::string data_name;
  int64_t local_clients = 10;
  std::string client_device = "auto";  // `client: {device: ...}`, passed to each local client
  int64_t client_silo_nproc = 1;       // `client: {silo: {nproc: N}}`, passed to each local client
  std::optional<SimulationOptions> simulation;
  ServerSecurity security;
  std::string log_level = "info";
  // Said once when the job starts (LogStartNotes): `notes` what the job derived rather than read
  // (privacy.expected_cohort_size from the clients it starts; where privacy.stop_at_budget will
  // stop it), `warnings` a plan that will likely not do what it is meant to (noise on the mean
  // update larger than the clip norm). The job runs either way.
  std::vector<std::string> notes;
  std::vector<std::string> warnings;
};

// Reads and checks a job file before anything starts. Besides every key's own range, refused with
// an error naming the key: a client-level DP plan whose rounds cannot all run within
// privacy.epsilon (naming the rounds and the noise multiplier that fit; unless
// privacy.stop_at_budget), central DP without privacy.expected_cohort_size where the job starts no
// clients of its own, a server evaluation without evaluation.data for a model that is not
// Fashion-MNIST's, and a CSV data file (evaluation.data, data.path) whose width is not the model's.
StatusOr<JobConfig> LoadJobConfig(const std::string& path);

// Logs the job's notes (info) and warnings (warn), once, at start.
void LogStartNotes(const JobConfig& job);

using client::ClientConfig;
using client::ClientSecurity;
using client::LoadClientConfig;
using client::ValidateClientConfig;

// `huddle datacenter`'s options (datacenter/job_options.h), from its YAML
// (cli/datacenter_config.cc).
using datacenter::DatacenterConfig;
using datacenter::DatacenterDpSgd;
StatusOr<DatacenterConfig> LoadDatacenterConfig(const std::string& path);

}  // namespace huddle::cli
