// The job YAML and the client YAML, mapped onto Options structs in one place. Every key, its
// default and its range is listed in README.md ("Configuration reference"); unknown keys and bad
// values are errors naming the key, the value and what is allowed.
#pragma once

#include <optional>
#include <string>

#include "client/runner.h"
#include "common/status.h"
#include "coordinator/options.h"
#include "data/client_data.h"

namespace huddle::cli {

struct SimulationOptions {
  int64_t clients = 0;  // simulated clients (in one process)
  int64_t threads = 2;  // pool threads running them
};

struct JobConfig {
  coordinator::CoordinatorOptions coordinator;
  std::string bind = "tcp://127.0.0.1:5555";
  std::string eval_data = data::kDefaultFashionMnistDir;  // test split for server-side evaluation
  // How `huddle run` feeds its local clients: one shard each of this data set.
  data::DataSpec client_data;
  int64_t local_clients = 10;
  std::optional<SimulationOptions> simulation;
  std::string log_level = "info";
};

StatusOr<JobConfig> LoadJobConfig(const std::string& path);

struct ClientConfig {
  std::string coordinator;  // tcp://HOST:PORT
  std::string client_id;
  data::DataSpec data;
  client::RunnerOptions runner;
  std::string log_level = "info";
};

// Reads a client YAML; command-line flags are applied on top by the caller.
StatusOr<ClientConfig> LoadClientConfig(const std::string& path);
Status ValidateClientConfig(const ClientConfig& config);

}  // namespace huddle::cli
