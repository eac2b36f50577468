#include "tests/integration/datacenter_job.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "tests/integration/job_yaml.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

uint64_t Xorshift(uint64_t* x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

// Four classes around distinct means: label, then 16 features.
std::string SmallCsv() {
  std::ostringstream out;
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 1200; ++i) {
    const int label = i % 4;
    out << label;
    for (int f = 0; f < 16; ++f) {
      const double noise = static_cast<double>(Xorshift(&x) % 10000) / 10000.0 - 0.5;
      out << ',' << (f % 4 == label ? 1.0 : 0.0) + noise;
    }
    out << '\n';
  }
  return out.str();
}

// Ten classes in Fashion-MNIST's shape: label, then 784 features that are 1 more often where
// feature % 10 == label.
std::string WideCsv() {
  std::ostringstream out;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 1000; ++i) {
    const int label = i % 10;
    out << label;
    for (int f = 0; f < 784; ++f) {
      const uint64_t percent = Xorshift(&x) % 100;
      out << ',' << (percent < (f % 10 == label ? 60u : 10u) ? '1' : '0');
    }
    out << '\n';
  }
  return out.str();
}

}  // namespace

bool FashionMnistInstalled() {
  return std::filesystem::exists(std::string(kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz");
}

std::string WriteJob(const std::string& dir, const std::string& name, const DcJob& job) {
  const std::string csv = dir + (job.evaluate ? "/train784.csv" : "/train.csv");
  if (!std::filesystem::exists(csv)) WriteText(csv, job.evaluate ? WideCsv() : SmallCsv());
  const int classes = job.evaluate ? 10 : 4;
  JobYaml y;
  y.Set("name", "dc-it")
      .Set("seed", 5)
      .Set("model.input_dim", job.evaluate ? 784 : 16)
      .Set("model.hidden", "[32]")
      .Set("model.num_classes", classes)
      .Set("train.epochs", job.epochs)
      .Set("train.batch_size", 8)
      .Set("train.learning_rate", 0.05)
      .Set("train.momentum", 0.9);
  if (!job.dp_sgd.empty()) y.Set("train.dp_sgd", "{" + job.dp_sgd + "}");
  return y.Set("data.path", csv)
      .Set("data.format", "csv")
      .Set("data.num_classes", classes)
      .Set("evaluation.data", "'" + std::string(job.evaluate ? kFashionMnistDir : "") + "'")
      .Set("datacenter.checksum_every", 10)
      .Set("datacenter.timeout_s", job.timeout_s)
      .Fields("datacenter", job.datacenter)
      .Set("checkpoint.every_epochs", job.checkpoint_every)
      .Write(dir + "/" + name + ".yaml");
}

std::vector<std::string> Launcher(const std::string& config, const std::string& out, int nproc) {
  return {HuddleBin(), "datacenter", "--config", config,
          "--out",     out,          "--nproc",  std::to_string(nproc)};
}

std::vector<std::string> WithEnv(const std::vector<std::string>& env,
                                 const std::vector<std::string>& argv) {
  std::vector<std::string> out = {"/usr/bin/env"};
  out.insert(out.end(), env.begin(), env.end());
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::string MakeRendezvousKey(const std::string& dir) {
  const std::string key = dir + "/keys/job.key";
  if (std::filesystem::exists(key)) return key;
  Process keygen({HuddleBin(), "keygen", "server", "--id", "job", "--out", dir + "/keys"},
                 dir + "/keygen.log");
  if (keygen.Wait(std::chrono::seconds(30)) != 0) return "";
  return key;
}

std::string KeyEnv(const std::string& key_file) { return "HUDDLE_RENDEZVOUS_KEY=" + key_file; }

std::vector<nlohmann::json> JsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  for (const std::string& line : ReadLines(path)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

nlohmann::json JsonFile(const std::string& path) {
  const std::string text = ReadAll(path);
  return text.empty() ? nlohmann::json() : nlohmann::json::parse(text);
}

}  // namespace huddle::testing
