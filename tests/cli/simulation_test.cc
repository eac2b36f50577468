// `simulation:`'s virtual clock (cli/simulation.h): its YAML keys, defaults and refusals, the
// clients' slowdowns drawn from the seed, the compute time of each message, and the record a run
// writes.
#include "cli/simulation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace huddle::cli {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Write(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("huddle_sim_" + std::to_string(::getpid()) + "_" + name + ".yaml");
  std::ofstream(path) << text;
  return path.string();
}

StatusOr<SimulationOptions> Simulation(const std::string& section) {
  HUDDLE_ASSIGN_OR_RETURN(JobConfig job, LoadJobConfig(Write("sim", "simulation: " + section)));
  if (!job.simulation) return absl::NotFoundError("no simulation");
  return *job.simulation;
}

std::string ErrorOf(const std::string& section) {
  auto sim = Simulation(section);
  return sim.ok() ? "" : std::string(sim.status().message());
}

TEST(SimulationConfigTest, TheRealClockIsTheDefaultAndTheVirtualOnesKeysHaveTheirDefaults) {
  auto real = Simulation("{clients: 10}");
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_FALSE(real->virtual_clock);
  auto v = Simulation("{clients: 10, clock: virtual}");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->virtual_clock);
  EXPECT_FALSE(v->lognormal_slowdown);
  EXPECT_DOUBLE_EQ(v->seconds_per_example, 0.001);
  EXPECT_DOUBLE_EQ(v->latency_s, 0.05);
  EXPECT_DOUBLE_EQ(v->bandwidth_mbit_s, 100);
  EXPECT_DOUBLE_EQ(v->dropout, 0);
}

TEST(SimulationConfigTest, EveryVirtualClockKeyIsRead) {
  auto v = Simulation(
      "{clients: 1000, threads: 4, clock: virtual, slowdown: {distribution: lognormal, sigma: "
      "1.3}, seconds_per_example: 0.002, latency_s: 0.1, bandwidth_mbit_s: 20, dropout: 0.25}");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->clients, 1000);
  EXPECT_EQ(v->threads, 4);
  EXPECT_TRUE(v->lognormal_slowdown);
  EXPECT_DOUBLE_EQ(v->slowdown_sigma, 1.3);
  EXPECT_DOUBLE_EQ(v->seconds_per_example, 0.002);
  EXPECT_DOUBLE_EQ(v->latency_s, 0.1);
  EXPECT_DOUBLE_EQ(v->bandwidth_mbit_s, 20);
  EXPECT_DOUBLE_EQ(v->dropout, 0.25);
}

TEST(SimulationConfigTest, TheVirtualClocksKeysAreRefusedWithTheRealClockNamingBoth) {
  for (const char* key : {"seconds_per_example: 0.01", "latency_s: 0.1", "bandwidth_mbit_s: 5",
                          "dropout: 0.1", "slowdown: {distribution: lognormal}"}) {
    for (const char* clock : {"", ", clock: real"}) {
      const std::string section = std::string("{clients: 10") + clock + ", " + key + "}";
      const std::string name = std::string(key).substr(0, std::string(key).find(':'));
      EXPECT_THAT(ErrorOf(section),
                  AllOf(HasSubstr("simulation." + name), HasSubstr("simulation.clock: virtual")))
          << section;
    }
  }
}

TEST(SimulationConfigTest, MistakesAreErrorsNamingTheKey) {
  EXPECT_THAT(ErrorOf("{clients: 10, clock: fast}"),
              AllOf(HasSubstr("simulation.clock"), HasSubstr("virtual")));
  EXPECT_THAT(ErrorOf("{clients: 10, clock: virtual, slowdown: {sigma: 2}}"),
              AllOf(HasSubstr("simulation.slowdown.sigma"),
                    HasSubstr("simulation.slowdown.distribution: lognormal")));
  EXPECT_THAT(ErrorOf("{clients: 10, clock: virtual, slowdown: {distribution: gamma}}"),
              HasSubstr("simulation.slowdown.distribution"));
  EXPECT_THAT(ErrorOf("{clients: 10, clock: virtual, slowdown: {distrib: lognormal}}"),
              HasSubstr("unknown key 'distrib'"));
  EXPECT_THAT(ErrorOf("{clients: 10, clock: virtual, slowdown: 2}"),
              HasSubstr("simulation.slowdown"));
  EXPECT_THAT(ErrorOf("{clients: 10, clock: virtual, dropout: 1.5}"),
              HasSubstr("simulation.dropout: 1.5 is out of range"));
  EXPECT_THAT(ErrorOf("{clients: 10, clock: virtual, bandwidth_mbit_s: 0}"),
              HasSubstr("simulation.bandwidth_mbit_s: 0 is out of range"));
  EXPECT_THAT(ErrorOf("{clients: 10, clock: virtual, latency: 0.1}"),
              HasSubstr("did you mean 'latency_s'"));
}

// A process client's `slowdown` (huddle client/agent --slowdown overrides it).
TEST(SimulationConfigTest, AClientsSlowdownIsReadAndChecked) {
  auto plain = LoadClientConfig(Write("client_plain", "client_id: a\n"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_DOUBLE_EQ(plain->slowdown, 1);
  auto slow = LoadClientConfig(Write("client_slow", "client_id: a\nslowdown: 2.5\n"));
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_DOUBLE_EQ(slow->slowdown, 2.5);
  auto fast = LoadClientConfig(Write("client_fast", "client_id: a\nslowdown: 0.5\n"));
  ASSERT_FALSE(fast.ok());
  EXPECT_THAT(std::string(fast.status().message()),
              HasSubstr("slowdown: 0.5 is out of range [1, 1000]"));
}

TEST(SimulationModelTest, SlowdownsComeFromTheSeedAndTheClientAlone) {
  SimulationOptions sim;
  sim.clients = 2001;
  for (double s : DrawSlowdowns(sim, 7)) EXPECT_EQ(s, 1.0) << "constant: 1 for every client";
  sim.lognormal_slowdown = true;
  sim.slowdown_sigma = 1.3;
  const std::vector<double> a = DrawSlowdowns(sim, 7);
  EXPECT_EQ(DrawSlowdowns(sim, 7), a);
  EXPECT_NE(DrawSlowdowns(sim, 8), a);
  SimulationOptions fewer = sim;
  fewer.clients = 10;
  const std::vector<double> prefix = DrawSlowdowns(fewer, 7);
  EXPECT_EQ(prefix, std::vector<double>(a.begin(), a.begin() + 10))
      << "a client's slowdown does not depend on how many there are";
  const SlowdownSummary s = Summarize(a);
  EXPECT_NEAR(s.median, 1.0, 0.12) << "lognormal of median 1";
  // exp(1.3 * -1.2816) = 0.189 and exp(1.3 * 1.2816) = 5.29.
  EXPECT_NEAR(s.p10, 0.189, 0.04);
  EXPECT_NEAR(s.p90, 5.29, 0.8);
  EXPECT_GT(s.slowest_decile_ratio, s.p90 / s.median);
}

TEST(SimulationModelTest, SummaryOfKnownValues) {
  const SlowdownSummary s = Summarize({10, 1, 9, 2, 8, 3, 7, 4, 6, 5});
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_DOUBLE_EQ(s.p10, 1.9);
  EXPECT_DOUBLE_EQ(s.p90, 9.1);
  EXPECT_DOUBLE_EQ(s.slowest_decile_ratio, 10 / 5.5);
  EXPECT_DOUBLE_EQ(Summarize({}).median, 1);
}

TEST(SimulationModelTest, ComputeTimeIsTheExamplesPassedOverTimesTheClientsRate) {
  wire::FitInstruction fit;
  fit.train.epochs = 3;
  EXPECT_EQ(ExamplesTrained(fit.train, 100), 300);
  // DP-SGD: round(2 * 1000 / 64) = 31 steps of 64 expected examples.
  fit.train.epochs = 2;
  fit.train.dp_sgd = wire::DpSgdConfig{1.1, 1.0, 64, 1e-5};
  EXPECT_EQ(ExamplesTrained(fit.train, 1000), 31 * 64);
  // An expected batch larger than the shard: the whole shard per step, one step an epoch.
  EXPECT_EQ(ExamplesTrained(fit.train, 50), 2 * 50);
  fit.train.dp_sgd.reset();
  fit.train.epochs = 3;

  const wire::Message train = wire::MakeMessage(fit, 1);
  EXPECT_DOUBLE_EQ(ComputeSeconds(train, 100, 2.0, 0.001), 2.0 * 0.001 * 300);
  const wire::Message evaluate = wire::MakeMessage(wire::EvaluateInstruction{}, 1);
  EXPECT_DOUBLE_EQ(ComputeSeconds(evaluate, 100, 2.0, 0.001), 2.0 * 0.001 / 3 * 100);
  for (const wire::Message& other :
       {wire::MakeMessage(wire::UploadGrant{}, 1), wire::MakeMessage(wire::Heartbeat{}, 1)}) {
    EXPECT_EQ(ComputeSeconds(other, 100, 2.0, 0.001), 0) << wire::MessageTypeName(other.type());
  }

  SimulationOptions sim;
  sim.clients = 2;
  sim.bandwidth_mbit_s = 80;
  sim.dropout = 0.2;
  const transport::SimulatedTransportOptions t = TransportOptions(sim, 1, {100, 200}, {1.0, 4.0});
  EXPECT_DOUBLE_EQ(t.bandwidth_bytes_per_s, 1e7);
  EXPECT_EQ(t.dropout, (std::vector<double>{0.2, 0.2}));
  EXPECT_DOUBLE_EQ(t.compute(1, train), 4.0 * 0.001 * 3 * 200);
}

TEST(SimulationModelTest, TheRecordSaysWhatRan) {
  SimulationOptions sim;
  sim.clients = 2;
  sim.virtual_clock = true;
  sim.lognormal_slowdown = true;
  sim.slowdown_sigma = 0.5;
  const auto j = nlohmann::json::parse(
      SimulationJson(sim, 11, {"sim-00000", "sim-00001"}, {0.5, 2.0}, uint64_t{3}));
  EXPECT_EQ(j["clock"], "virtual");
  EXPECT_EQ(j["seed"], 11);
  EXPECT_EQ(j["slowdown"]["distribution"], "lognormal");
  EXPECT_DOUBLE_EQ(j["slowdown"]["sigma"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["client_slowdown"]["sim-00001"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["seconds_per_example"].get<double>(), 0.001);
  EXPECT_EQ(j["instructions_dropped"], 3);
  EXPECT_THAT(DescribeVirtualSimulation(sim, {0.5, 2.0}),
              AllOf(HasSubstr("VIRTUAL clock"), HasSubstr("lognormal (sigma 0.5)"),
                    HasSubstr("median 1.25")));
}

}  // namespace
}  // namespace huddle::cli
