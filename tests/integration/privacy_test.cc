// Integration tests of client-level DP: real `huddle` processes on 127.0.0.1.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "privacy/ledger.h"
#include "tests/integration/job_yaml.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

class PrivacyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kFashionMnist) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
    }
  }

  static std::vector<nlohmann::json> Lines(const std::string& path) {
    std::vector<nlohmann::json> out;
    for (const std::string& line : ReadLines(path)) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  // `huddle privacy ARGS... --json`: the JSON object it prints.
  static nlohmann::json PrivacyCli(const std::string& dir, std::vector<std::string> args) {
    args.insert(args.begin(), {HuddleBin(), "privacy"});
    args.push_back("--json");
    const std::string log = dir + "/cli.log";
    std::filesystem::remove(log);
    const Finished p = RunToEnd(args, log, seconds(60));
    EXPECT_EQ(p.exit_code, 0) << p.log;
    const auto lines = ReadLines(log);
    return lines.empty() ? nlohmann::json() : nlohmann::json::parse(lines.back());
  }

  // `huddle coordinator` for DIR/job.yaml into DIR/out, plaintext on `endpoint`.
  static std::vector<std::string> CoordinatorArgv(const std::string& dir,
                                                  const std::string& endpoint, bool resume) {
    std::vector<std::string> argv = {HuddleBin(),       "coordinator", "--config",
                                     dir + "/job.yaml", "--out",       dir + "/out",
                                     "--bind",          endpoint,      "--insecure"};
    if (resume) argv.push_back("--resume");
    return argv;
  }

  // A job for two clients whose coordinator a test kills and resumes: 30 s rounds of quorum 1,
  // no evaluation, clients dropped after 20 s of silence. The test adds cohort and privacy.
  static JobYaml RestartedJob(const std::string& name, int seed, int rounds, int batch_size) {
    JobYaml job;
    job.Set("name", name)
        .Set("seed", seed)
        .Set("rounds", rounds)
        .Set("model.hidden", "[8]")
        .Set("train.epochs", 2)
        .Set("train.batch_size", batch_size)
        .Set("train.learning_rate", 0.1)
        .Set("round.deadline_s", 30)
        .Set("round.quorum", 1)
        .Set("evaluation.every", 0)
        .Set("coordinator.min_clients", 2)
        .Set("coordinator.wait_for_clients_s", 60)
        .Set("coordinator.heartbeat_interval_s", 0.2)
        .Set("coordinator.client_timeout_s", 20);
    return job;
  }

  static std::string Num(double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return buf;
  }
};

// A simulated federation with central DP: the epsilon it reports after each round is what
// `huddle privacy epsilon` says for the same parameters, and the ledger holds every round.
TEST_F(PrivacyTest, CentralDpEpsilonEqualsTheCli) {
  const std::string dir = MakeTempDir("dp_central");
  JobYaml()
      .Set("name", "dp")
      .Set("seed", 5)
      .Set("rounds", 3)
      .Set("model.hidden", "[16]")
      .Set("train.epochs", 1)
      .Set("train.batch_size", 32)
      .Set("train.learning_rate", 0.1)
      .Set("cohort.sampling", "poisson")
      .Set("cohort.rate", 0.2)
      .Set("evaluation.every", 3)
      .Set("simulation.clients", 100)
      .Set("simulation.threads", 2)
      .Set("privacy.mode", "central")
      .Set("privacy.clip_norm", 0.5)
      .Set("privacy.epsilon", 2.0)
      .Set("privacy.delta", 1.0e-5)
      .Write(dir + "/job.yaml");
  const Finished p = RunToEnd({HuddleBin(), "run", dir + "/job.yaml", "--out", dir + "/out"},
                              dir + "/log", seconds(300));
  ASSERT_EQ(p.exit_code, 0) << p.log;
  const auto metrics = Lines(dir + "/out/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 3u);
  const double z = metrics[0]["privacy"]["noise_multiplier"].get<double>();
  for (size_t r = 0; r < metrics.size(); ++r) {
    const auto cli = PrivacyCli(
        dir, {"epsilon", "--sampling-rate", "0.2", "--noise-multiplier", Num(z), "--steps",
              std::to_string(r + 1), "--delta", "1e-05", "--accountant", "rdp"});
    EXPECT_DOUBLE_EQ(metrics[r]["epsilon"].get<double>(), cli["epsilon"].get<double>())
        << "round " << r + 1;
    EXPECT_EQ(metrics[r]["delta"].get<double>(), 1e-5);
    EXPECT_EQ(metrics[r]["privacy"]["clip_norm"].get<double>(), 0.5);
    EXPECT_FALSE(metrics[r].contains("train_loss")) << "client-reported losses are not private";
    EXPECT_FALSE(metrics[r].contains("clients_sampled")) << "operator-only";
  }
  const auto ops = Lines(dir + "/out/operator_metrics.jsonl");
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_TRUE(ops[0].contains("clients_sampled"));
  const auto report = nlohmann::json::parse(ReadAll(dir + "/out/privacy.json"));
  EXPECT_EQ(report["epsilon"], metrics.back()["epsilon"]);
  EXPECT_EQ(report["unit_of_privacy"], "client");
  EXPECT_EQ(report["releases"][0]["releases"], 3);
  EXPECT_EQ(report["releases"][0]["noise_multiplier"].get<double>(), z);
  EXPECT_LE(metrics.back()["epsilon"].get<double>(), 2.0);
  // The calibrated z makes the 3 rounds use (almost) all of the budget.
  EXPECT_GT(metrics.back()["epsilon"].get<double>(), 2.0 * 0.99);
  auto ledger = privacy::PrivacyLedger::Open(dir + "/out/" + privacy::kLedgerFile);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  ASSERT_EQ(ledger->entries().size(), 3u);
  EXPECT_EQ(ledger->entries()[2].round, 3u);
  EXPECT_EQ(ledger->entries()[2].noise_multiplier, z);
  const auto summary = nlohmann::json::parse(ReadAll(dir + "/out/summary.json"));
  EXPECT_EQ(summary["privacy"]["epsilon"], metrics.back()["epsilon"]);
  EXPECT_NE(ReadAll(dir + "/log").find("eps "), std::string::npos) << "progress line shows epsilon";
}

// A schedule whose noise would overrun the total: the job stops before the round that would
// exceed it, says so, and never reports more than the total.
TEST_F(PrivacyTest, BudgetExhaustionStopsTraining) {
  const std::string dir = MakeTempDir("dp_budget");
  JobYaml()
      .Set("name", "dp")
      .Set("seed", 5)
      .Set("rounds", 40)
      .Set("model.hidden", "[8]")
      .Set("train.epochs", 1)
      .Set("train.batch_size", 64)
      .Set("train.learning_rate", 0.1)
      .Set("cohort.sampling", "poisson")
      .Set("cohort.rate", 0.5)
      .Set("evaluation.every", 0)
      .Set("simulation.clients", 20)
      .Set("simulation.threads", 2)
      .Set("privacy.mode", "central")
      .Set("privacy.epsilon", 3.0)
      .Set("privacy.delta", 1.0e-5)
      .Set("privacy.schedule", "[{rounds: [1, 40], noise_multiplier: 2.0, clip_norm: 1.0}]")
      // Without it the plan is refused at start (its 40 rounds do not fit the total).
      .Set("privacy.stop_at_budget", "true")
      .Write(dir + "/job.yaml");
  const Finished p = RunToEnd({HuddleBin(), "run", dir + "/job.yaml", "--out", dir + "/out"},
                              dir + "/log", seconds(300));
  ASSERT_EQ(p.exit_code, 0) << p.log;
  const auto metrics = Lines(dir + "/out/metrics.jsonl");
  ASSERT_GT(metrics.size(), 0u);
  ASSERT_LT(metrics.size(), 40u);
  EXPECT_LE(metrics.back()["epsilon"].get<double>(), 3.0);
  const auto next =
      PrivacyCli(dir, {"epsilon", "--sampling-rate", "0.5", "--noise-multiplier", "1", "--steps",
                       std::to_string(metrics.size() + 1), "--delta", "1e-05"});
  EXPECT_GT(next["epsilon"].get<double>(), 3.0) << "one more round would have exceeded it";
  EXPECT_NE(
      ReadAll(dir + "/log").find("privacy budget: round " + std::to_string(metrics.size() + 1)),
      std::string::npos)
      << ReadAll(dir + "/log");
  const auto summary = nlohmann::json::parse(ReadAll(dir + "/out/summary.json"));
  EXPECT_EQ(summary["rounds_completed"], metrics.size());
  EXPECT_TRUE(summary.contains("stopped_early"));
  // privacy.json restates the plan: its schedule, and the rounds planned against those run.
  const auto report = nlohmann::json::parse(ReadAll(dir + "/out/privacy.json"));
  EXPECT_EQ(report["rounds"]["planned"], 40);
  EXPECT_EQ(report["rounds"]["run"], metrics.size());
  EXPECT_EQ(report["stop_at_budget"], true);
  EXPECT_GT(report["planned_epsilon"].get<double>(), 3.0);
  ASSERT_EQ(report["noise_schedule"].size(), 1u);
  EXPECT_EQ(report["noise_schedule"][0]["rounds"], nlohmann::json::array({1, 40}));
  EXPECT_EQ(report["noise_schedule"][0]["noise_multiplier"], 2.0);
  EXPECT_NE(ReadAll(dir + "/log")
                .find("the job stops after round " + std::to_string(metrics.size()) + " of 40"),
            std::string::npos);
}

// SIGKILL the coordinator at many points of a DP run and resume each time: every round whose
// model was released (metrics line, checkpoint) has its ledger entry, so the ledger's epsilon is
// never below the true spend.
TEST_F(PrivacyTest, SigkillAnywhereNeverUnderCountsTheSpend) {
  const std::string dir = MakeTempDir("dp_kill");
  const int rounds = 10;
  RestartedJob("dp", 9, rounds, 16)
      .Set("cohort.sampling", "poisson")
      .Set("cohort.rate", 1.0)
      // A schedule without a total: rounds re-run after a crash are counted again, and must not
      // end the job early here. Private noise: cohorts (all clients at rate 1) and noise are
      // drawn afresh when a round is re-run.
      .Set("privacy.mode", "central")
      .Set("privacy.clip_norm", 1.0)
      .Set("privacy.delta", 1.0e-5)
      .Set("privacy.expected_cohort_size", 2)
      .Set("privacy.schedule", "[{rounds: [1, 10], noise_multiplier: 2.0}]")
      .Write(dir + "/job.yaml");
  const int port = FreeLoopbackPort();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  auto coordinator_argv = [&](bool resume) { return CoordinatorArgv(dir, endpoint, resume); };
  std::vector<std::unique_ptr<Process>> clients;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(std::make_unique<Process>(
        std::vector<std::string>{HuddleBin(), "client", "--coordinator", endpoint, "--client-id",
                                 "c" + std::to_string(i), "--data", kFashionMnist, "--partition",
                                 "iid", "--num-shards", "4", "--shard", std::to_string(i),
                                 "--give-up-after", "60", "--insecure"},
        dir + "/client-" + std::to_string(i) + ".log"));
  }
  // Kill points spread over the rounds (fixed, so a failure reproduces).
  const int delays_ms[] = {700, 1100, 450, 1500, 900, 1300, 600, 1000, 800, 1200};
  bool resume = false;
  int kills = 0;
  for (int delay : delays_ms) {
    Process c(coordinator_argv(resume), dir + "/coordinator-" + std::to_string(kills) + ".log");
    std::this_thread::sleep_for(milliseconds(delay));
    c.Kill(SIGKILL);
    const int rc = c.Wait(seconds(10));
    ++kills;
    resume = true;       // from here on (with no checkpoint yet, --resume starts at round 1)
    if (rc == 0) break;  // finished before the kill
    // The invariant holds at every crash point (no ledger yet: nothing can have been released).
    if (!std::filesystem::exists(dir + "/out/" + privacy::kLedgerFile)) continue;
    auto ledger = privacy::PrivacyLedger::Open(dir + "/out/" + privacy::kLedgerFile);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    for (const auto& m : Lines(dir + "/out/metrics.jsonl")) {
      const uint64_t round = m["round"].get<uint64_t>();
      bool found = false;
      for (const auto& e : ledger->entries()) found = found || e.round == round;
      EXPECT_TRUE(found) << "round " << round << " was released without a ledger entry";
    }
  }
  const Finished last =
      RunToEnd(coordinator_argv(resume), dir + "/coordinator-last.log", seconds(240));
  ASSERT_EQ(last.exit_code, 0) << last.log;
  const auto metrics = Lines(dir + "/out/metrics.jsonl");
  ASSERT_EQ(metrics.size(), static_cast<size_t>(rounds));
  auto ledger = privacy::PrivacyLedger::Open(dir + "/out/" + privacy::kLedgerFile);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_GE(ledger->entries().size(), static_cast<size_t>(rounds));
  // The reported epsilon is the accountant's over the whole ledger (re-run rounds included).
  const double z = ledger->entries()[0].noise_multiplier;
  const auto cli = PrivacyCli(dir, {"epsilon", "--sampling-rate", "1", "--noise-multiplier", Num(z),
                                    "--steps", std::to_string(ledger->entries().size()), "--delta",
                                    "1e-05", "--accountant", "analytic"});
  EXPECT_DOUBLE_EQ(metrics.back()["epsilon"].get<double>(), cli["epsilon"].get<double>());
  std::cout << kills << " kills; ledger " << ledger->entries().size() << " entries for " << rounds
            << " rounds\n";
}

// Local DP against a coordinator that is killed and resumed many times: each client keeps its own
// ledger and, asked again for a round it already released (the same model after a resume), sends
// the same noised update, so no client ever releases two noised versions of one round's update.
// Each client's own epsilon never exceeds what the coordinator reports for the job.
TEST_F(PrivacyTest, LocalDpClientsNeverReleaseARoundTwiceAcrossCoordinatorRestarts) {
  const std::string dir = MakeTempDir("dp_local_kill");
  const int rounds = 20;
  RestartedJob("local", 4, rounds, 32)
      .Set("cohort.size", 2)
      // A schedule without a total: rounds the coordinator re-runs are counted again in its
      // ledger (and must not end the job early here); the clients' are not.
      .Set("privacy.mode", "local")
      .Set("privacy.clip_norm", 1.0)
      .Set("privacy.delta", 1.0e-5)
      .Set("privacy.schedule", "[{rounds: [1, 20], noise_multiplier: 4.0}]")
      .Write(dir + "/job.yaml");
  const int port = FreeLoopbackPort();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  auto coordinator_argv = [&](bool resume) { return CoordinatorArgv(dir, endpoint, resume); };
  std::vector<std::unique_ptr<Process>> clients;
  for (int i = 0; i < 2; ++i) {
    const std::string id = "c" + std::to_string(i);
    JobYaml()
        .Set("privacy.ledger", dir + "/" + id + "/ledger.jsonl")
        .Set("privacy.local.require", "true")
        .Set("privacy.local.min_noise_multiplier", 1.0)
        .Set("privacy.local.max_epsilon", 30)
        // Replies at once: this test is about restarts, not the reply time (the default holds
        // each reply half the 30 s deadline: 20 rounds of 15 s).
        .Set("privacy.reply_after_s", 0)
        .Write(dir + "/" + id + ".yaml");
    clients.push_back(std::make_unique<Process>(
        std::vector<std::string>{
            HuddleBin(), "client", "--config", dir + "/" + id + ".yaml", "--coordinator", endpoint,
            "--client-id", id, "--data", kFashionMnist, "--partition", "iid", "--num-shards", "8",
            "--shard", std::to_string(i), "--give-up-after", "60", "--insecure"},
        dir + "/client-" + std::to_string(i) + ".log"));
  }
  // The first start waits for the clients; later ones are killed a few rounds after they resume.
  const int delays_ms[] = {1200, 700, 500, 900, 600, 800, 400};
  bool resume = false;
  for (int delay : delays_ms) {
    Process c(coordinator_argv(resume), dir + "/coordinator-" + std::to_string(delay) + ".log");
    std::this_thread::sleep_for(milliseconds(delay));
    c.Kill(SIGKILL);
    resume = true;
    if (c.Wait(seconds(10)) == 0) break;
  }
  const Finished last =
      RunToEnd(coordinator_argv(resume), dir + "/coordinator-last.log", seconds(240));
  ASSERT_EQ(last.exit_code, 0) << last.log;
  for (auto& c : clients) c->Wait(seconds(30));
  const auto metrics = Lines(dir + "/out/metrics.jsonl");
  ASSERT_EQ(metrics.size(), static_cast<size_t>(rounds));
  const double job_epsilon = metrics.back()["epsilon"].get<double>();
  int asked_again = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string id = "c" + std::to_string(i);
    auto ledger = privacy::PrivacyLedger::Open(dir + "/" + id + "/ledger.jsonl");
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    ASSERT_GE(ledger->entries().size(), static_cast<size_t>(rounds)) << id;
    std::map<uint64_t, int> per_round;
    std::set<std::string> releases;
    for (const auto& e : ledger->entries()) {
      EXPECT_EQ(e.adjacency, privacy::kReplaceOne);
      EXPECT_EQ(++per_round[e.round], 1) << id << " released round " << e.round << " twice";
      EXPECT_TRUE(releases.insert(e.release).second);
    }
    // The client's own account, under the same replace-one adjacency, is within the job's.
    const auto events = ledger->Events();
    auto spent = privacy::ComputeEpsilon(events, 1e-5, privacy::AccountantKind::kAnalytic);
    ASSERT_TRUE(spent.ok());
    EXPECT_LE(spent->epsilon, job_epsilon + 1e-9) << id;
    const std::string log = ReadAll(dir + "/client-" + std::to_string(i) + ".log");
    for (size_t at = log.find("sending again"); at != std::string::npos;
         at = log.find("sending again", at + 1)) {
      ++asked_again;
    }
  }
  std::cout << "rounds asked again after a restart and answered with the kept release: "
            << asked_again << "\n";
}

// Distributed DP in a process federation whose clients are silos (2 ranks each): `huddle run`
// gives each client the job's policy, each checks the session's noise share by its own count and
// accounts it in its own ledger, and every round's release is the same there as in the
// coordinator's ledger.
TEST_F(PrivacyTest, DistributedDpSilosAccountEachShareAsTheCoordinatorDoes) {
  const std::string dir = MakeTempDir("dp_distributed_silo");
  const int rounds = 3;
  JobYaml()
      .Set("name", "distributed")
      .Set("seed", 4)
      .Set("rounds", rounds)
      .Set("model.hidden", "[16]")
      .Set("train.epochs", 1)
      .Set("train.batch_size", 64)
      .Set("train.learning_rate", 0.1)
      .Set("clients", 4)
      .Set("cohort.size", 4)
      .Set("round.deadline_s", 60)
      .Set("round.quorum", 1)
      .Set("evaluation.every", 1)
      .Set("client.device", "cpu")
      .Set("client.silo.nproc", 2)
      .Set("secure_aggregation.enabled", "true")
      .Set("secure_aggregation.corrupt_fraction", 0.25)
      .Set("secure_aggregation.min_survivors", 0.75)
      .Set("privacy.mode", "distributed")
      .Set("privacy.clip_norm", 1.0)
      .Set("privacy.epsilon", 20)
      .Set("privacy.delta", 1.0e-5)
      .Set("data.path", kFashionMnist)
      .Set("data.partition", "iid")
      .Write(dir + "/job.yaml");
  Process run({HuddleBin(), "run", dir + "/job.yaml", "--out", dir + "/out"}, dir + "/run.log");
  ASSERT_EQ(run.Wait(seconds(300)), 0)
      << ReadAll(dir + "/run.log") << ReadAll(dir + "/out/logs/client-000.log");
  const auto metrics = Lines(dir + "/out/metrics.jsonl");
  ASSERT_EQ(metrics.size(), static_cast<size_t>(rounds));
  // (4 clients are far too few for this much noise to leave a useful model: this is about the
  // accounting. examples/dp_distributed.yaml's 1000 clients learn.)
  EXPECT_TRUE(std::isfinite(metrics.back()["test_accuracy"].get<double>()));
  auto job = privacy::PrivacyLedger::Open(dir + "/out/privacy_ledger.jsonl");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->entries().size(), static_cast<size_t>(rounds));
  for (const auto& e : job->entries()) {
    EXPECT_EQ(e.mechanism, privacy::kMechanismDistributed);
    EXPECT_EQ(e.adjacency, privacy::kReplaceOne);
  }
  const auto report = nlohmann::json::parse(ReadAll(dir + "/out/privacy.json"));
  EXPECT_LE(report["epsilon"].get<double>(), 20.0);
  const std::string log = ReadAll(dir + "/out/logs/client-000.log");
  EXPECT_NE(log.find("training as a silo: 2 x cpu"), std::string::npos) << log;
  for (int i = 0; i < 4; ++i) {
    char id[32];
    std::snprintf(id, sizeof(id), "client-%03d", i);
    auto mine = privacy::PrivacyLedger::Open(dir + "/out/clients/" + id + "/privacy_ledger.jsonl");
    ASSERT_TRUE(mine.ok()) << id << ": " << mine.status();
    // min_survivors 3 of 4, 1 colluder: the client counts 2 honest shares, as the coordinator.
    ASSERT_EQ(mine->entries().size(), static_cast<size_t>(rounds)) << id;
    for (size_t r = 0; r < mine->entries().size(); ++r) {
      const privacy::LedgerEntry& e = mine->entries()[r];
      EXPECT_EQ(e.mechanism, privacy::kMechanismDistributed) << id;
      EXPECT_EQ(e.round, job->entries()[r].round) << id;
      EXPECT_EQ(e.noise_multiplier, job->entries()[r].noise_multiplier) << id;
      EXPECT_EQ(e.tau, job->entries()[r].tau) << id;
      EXPECT_EQ(e.dimension, job->entries()[r].dimension) << id;
    }
  }
}

}  // namespace
}  // namespace huddle::testing
