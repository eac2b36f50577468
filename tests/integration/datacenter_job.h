// Helpers of the `huddle datacenter` integration tests: small data sets and configurations, the
// launcher's command line, the JSON files a job writes, and a launcher started in its own process
// group so that a test can kill the whole job (launcher and ranks) at once, as a machine failure
// would.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace huddle::testing {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
bool FashionMnistInstalled();

// A job's configuration; WriteJob turns it into YAML.
struct DcJob {
  int epochs = 1;
  double timeout_s = 30;
  std::string dp_sgd;        // the body of train.dp_sgd ("noise_multiplier: 1, ..."); "": none
  std::string datacenter;    // more keys of `datacenter:` ("crash_for_testing: {...}")
  int checkpoint_every = 1;  // checkpoint.every_epochs
  // false: 1200 rows of 16 features in 4 classes, no evaluation. true: 1000 rows of 784 binary
  // features in 10 classes, evaluated on Fashion-MNIST's test split (FashionMnistInstalled()).
  bool evaluate = false;
};

// Writes the job's data (once per directory) and DIR/NAME.yaml; returns the YAML's path.
std::string WriteJob(const std::string& dir, const std::string& name, const DcJob& job);

// `huddle datacenter --config CONFIG --out OUT --nproc N`.
std::vector<std::string> Launcher(const std::string& config, const std::string& out, int nproc);

// `argv` run under /usr/bin/env with `env` ("NAME=value") added to its environment.
std::vector<std::string> WithEnv(const std::vector<std::string>& env,
                                 const std::vector<std::string>& argv);

// A rendezvous key file made with `huddle keygen server --id job --out DIR` (DIR/job.key), and
// the environment entry that hands it to a rank (HUDDLE_RENDEZVOUS_KEY=...).
std::string MakeRendezvousKey(const std::string& dir);
std::string KeyEnv(const std::string& key_file);
inline constexpr const char* kInsecureRendezvous = "HUDDLE_RENDEZVOUS_INSECURE=1";

// The objects of a JSON-lines file (empty when it is missing), and a JSON file (null if missing).
std::vector<nlohmann::json> JsonLines(const std::string& path);
nlohmann::json JsonFile(const std::string& path);

}  // namespace huddle::testing
