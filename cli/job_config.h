// The job YAML and the client YAML, mapped onto Options structs in one place. Every key, its
// default and its range is listed in README.md ("Configuration reference"); unknown keys and bad
// values are errors naming the key, the value and what is allowed.
#pragma once

#include <optional>
#include <string>

#include "client/config.h"
#include "client/privacy_guard.h"
#include "client/runner.h"
#include "common/status.h"
#include "coordinator/options.h"
#include "data/client_data.h"
#include "models/dp_sgd.h"
#include "privacy/accountant.h"

namespace huddle::cli {

struct SimulationOptions {
  int64_t clients = 0;  // simulated clients (in one process)
  int64_t threads = 2;  // pool threads running them
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
  std::string eval_data = data::kDefaultFashionMnistDir;  // test split for server-side evaluation
  // How `huddle run` feeds its local clients: one shard each of this data set.
  data::DataSpec client_data;
  int64_t local_clients = 10;
  std::string client_device = "auto";  // `client: {device: ...}`, passed to each local client
  int64_t client_silo_nproc = 1;       // `client: {silo: {nproc: N}}`, passed to each local client
  std::optional<SimulationOptions> simulation;
  ServerSecurity security;
  std::string log_level = "info";
};

StatusOr<JobConfig> LoadJobConfig(const std::string& path);

using client::ClientConfig;
using client::ClientSecurity;
using client::LoadClientConfig;
using client::ValidateClientConfig;

// `train.dp_sgd` of a datacenter job: DP-SGD across the ranks (datacenter::DataParallelDpSgd).
struct DatacenterDpSgd {
  models::DpSgdOptions dp;  // expected_batch_size: the global expected batch
  double delta = 1e-5;
  std::optional<double> epsilon_budget;  // refuse to start when the run would spend more
  privacy::AccountantKind accountant = privacy::AccountantKind::kRdp;
};

// `huddle datacenter`: one model trained synchronously across ranks (docs/datacenter.md).
struct DatacenterConfig {
  std::string job_name = "datacenter";
  uint64_t seed = 0;
  models::ModelSpec model;
  models::TrainOptions train;  // batch_size is per rank
  std::optional<DatacenterDpSgd> dp_sgd;
  data::DataSpec data;  // every rank loads all of it (no partition)
  std::string eval_data = data::kDefaultFashionMnistDir;  // test split; "" = no evaluation
  int64_t eval_every = 1;                                 // epochs (0: only after the last)
  double target_accuracy = 0;  // the summary reports when test accuracy first reached it
  int64_t nproc = 1;           // ranks `--nproc` starts when the flag is absent
  std::string device = "cpu";  // cpu | cuda | auto: every rank on the CPU (Gloo) or a GPU (NCCL)
  int64_t bucket_bytes = 25 << 20;
  int64_t first_bucket_bytes = 1 << 20;
  int64_t checksum_every = 100;  // steps
  bool overlap = true;
  int64_t timeout_ms = 60000;    // any collective; a rank silent this long ends the job
  int64_t checkpoint_every = 1;  // epochs (0: only after the last)
  std::string out_dir;           // default runs/<name>
  std::string log_level = "info";
  // Fault injection for tests only (`datacenter.crash_for_testing: {after: ledger|metrics|
  // checkpoint, epoch: E}`): rank 0 SIGKILLs itself right after that write of (1-based) epoch E,
  // as a machine failing at that point would. Empty: never.
  std::string crash_after_for_testing;
  int64_t crash_epoch_for_testing = 0;
};

StatusOr<DatacenterConfig> LoadDatacenterConfig(const std::string& path);

}  // namespace huddle::cli
