// The YAML -> Options mapping: every example parses, defaults are as documented, mistakes are
// errors that name the key, the value and what is allowed.
#include "cli/job_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace huddle::cli {
using ::testing::HasSubstr;

namespace {

std::string Write(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("huddle_cfg_" + std::to_string(::getpid()) + "_" + name + ".yaml");
  std::ofstream(path) << text;
  return path.string();
}

std::string ErrorOf(const std::string& text) {
  auto job = LoadJobConfig(Write("err", text));
  return job.ok() ? "" : std::string(job.status().message());
}

TEST(JobConfigTest, EveryExampleJobParses) {
  for (const char* name : {"fashion_mnist", "dirichlet", "simulation", "dp_central",
                           "dp_distributed", "dp_sgd", "dp_schedule", "secure_aggregation"}) {
    auto job = LoadJobConfig(std::string(HUDDLE_SOURCE_DIR) + "/examples/" + name + ".yaml");
    EXPECT_TRUE(job.ok()) << name << ": " << job.status();
  }
  auto client = LoadClientConfig(std::string(HUDDLE_SOURCE_DIR) + "/examples/client.yaml");
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->client_id, "hospital-a");
  EXPECT_TRUE(client->data.partitioned);
  EXPECT_EQ(client->data.partition.num_shards, 10);
}

TEST(JobConfigTest, RelativePathsResolveAgainstTheFileNotTheWorkingDirectory) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("huddle_cfg_rel_" + std::to_string(::getpid())) / "jobs";
  std::filesystem::create_directories(dir);
  const std::string job_path = (dir / "job.yaml").string();
  std::ofstream(job_path) << "data: {path: ../data/train.csv, format: csv}\n"
                             "evaluation: {data: /abs/fmnist}\n"
                             "security: {server_secret_key: keys/server.key, "
                             "allowed_clients: keys/allowed}\n"
                             "output: {dir: runs/x}\n";
  auto job = LoadJobConfig(job_path);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->client_data.path, (dir.parent_path() / "data/train.csv").string());
  EXPECT_EQ(job->eval_data, "/abs/fmnist");
  EXPECT_EQ(job->security.server_secret_key, (dir / "keys/server.key").string());
  EXPECT_EQ(job->security.allowed_clients, (dir / "keys/allowed").string());
  EXPECT_EQ(job->coordinator.out_dir, "runs/x") << "outputs go where the job is run from";

  const std::string client_path = (dir / "client.yaml").string();
  std::ofstream(client_path)
      << "coordinator: tcp://h:1\nclient_id: a\n"
         "security: {server_public_key: keys/server.pub, secret_key: a.key}\n"
         "privacy: {ledger: state/ledger.jsonl}\n";
  auto client = LoadClientConfig(client_path);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->security.server_public_key, (dir / "keys/server.pub").string());
  EXPECT_EQ(client->security.secret_key, (dir / "a.key").string());
  EXPECT_EQ(client->privacy.ledger_path, (dir / "state/ledger.jsonl").string());
  std::filesystem::remove_all(dir.parent_path());
}

TEST(JobConfigTest, HardeningKeysAreReadAndChecked) {
  auto job = LoadJobConfig(Write("hardening",
                                 "aggregation: {max_update_norm: 5, max_weight_ratio: 2}\n"
                                 "coordinator: {max_rounds_without_update: 7}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_DOUBLE_EQ(job->coordinator.max_update_norm, 5);
  EXPECT_DOUBLE_EQ(job->coordinator.max_weight_ratio, 2);
  EXPECT_EQ(job->coordinator.max_rounds_without_update, 7);
  auto defaults = LoadJobConfig(Write("hardening_defaults", "rounds: 2\n"));
  ASSERT_TRUE(defaults.ok());
  EXPECT_DOUBLE_EQ(defaults->coordinator.max_update_norm, 0);
  EXPECT_DOUBLE_EQ(defaults->coordinator.max_weight_ratio, 4);
  EXPECT_EQ(defaults->coordinator.max_rounds_without_update, 3);
  EXPECT_NE(ErrorOf("aggregation: {max_update_norm: -1}\n").find("aggregation.max_update_norm"),
            std::string::npos);
  EXPECT_NE(ErrorOf("coordinator: {max_rounds_without_update: 0}\n")
                .find("coordinator.max_rounds_without_update"),
            std::string::npos);
}

TEST(JobConfigTest, MaxUpdateNormIsAutoByDefaultOffOrANumber) {
  auto defaults = LoadJobConfig(Write("norm_defaults", "rounds: 2\n"));
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_DOUBLE_EQ(defaults->coordinator.max_update_norm, 0);
  EXPECT_DOUBLE_EQ(defaults->coordinator.auto_norm_factor, 3);
  auto factor = LoadJobConfig(
      Write("norm_factor", "aggregation: {max_update_norm: auto, auto_norm_factor: 5}\n"));
  ASSERT_TRUE(factor.ok()) << factor.status();
  EXPECT_DOUBLE_EQ(factor->coordinator.auto_norm_factor, 5);
  for (const char* off : {"off", "0"}) {
    auto job = LoadJobConfig(
        Write("norm_off", absl::StrCat("aggregation: {max_update_norm: ", off, "}\n")));
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_DOUBLE_EQ(job->coordinator.max_update_norm, 0) << off;
    EXPECT_DOUBLE_EQ(job->coordinator.auto_norm_factor, 0) << off;
  }
  EXPECT_NE(ErrorOf("aggregation: {max_update_norm: big}\n").find("aggregation.max_update_norm"),
            std::string::npos);
  EXPECT_NE(ErrorOf("aggregation: {max_update_norm: 5, auto_norm_factor: 2}\n")
                .find("aggregation.auto_norm_factor"),
            std::string::npos);
  EXPECT_NE(ErrorOf("aggregation: {auto_norm_factor: 0.5}\n").find("aggregation.auto_norm_factor"),
            std::string::npos);
}

TEST(JobConfigTest, DistributedDpNeedsSecureAggregationAndRdp) {
  auto job = LoadJobConfig(std::string(HUDDLE_SOURCE_DIR) + "/examples/dp_distributed.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->coordinator.privacy.mode, privacy::PrivacyMode::kDistributed);
  EXPECT_TRUE(job->coordinator.secure_aggregation.enabled);
  EXPECT_NE(ErrorOf("privacy: {mode: distributed, epsilon: 8}\n")
                .find("privacy.mode distributed needs secure_aggregation"),
            std::string::npos);
  EXPECT_NE(ErrorOf("privacy: {mode: distributed, epsilon: 8, accountant: pld}\n"
                    "secure_aggregation: {enabled: true}\n")
                .find("use accountant: rdp"),
            std::string::npos);
  EXPECT_NE(ErrorOf("privacy: {mode: distribted}\n").find("distributed"), std::string::npos);
}

TEST(JobConfigTest, QuickstartMapsOntoTheOptions) {
  auto job = LoadJobConfig(std::string(HUDDLE_SOURCE_DIR) + "/examples/fashion_mnist.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  const coordinator::CoordinatorOptions& o = job->coordinator;
  EXPECT_EQ(o.rounds, 20);
  EXPECT_EQ(o.model, models::ModelSpec(models::MlpSpec{}));
  EXPECT_DOUBLE_EQ(o.train.learning_rate, 0.02);
  EXPECT_DOUBLE_EQ(o.train.momentum, 0.9);
  EXPECT_EQ(o.cohort.size, 10);
  EXPECT_EQ(o.quorum, 8);
  EXPECT_EQ(o.round_deadline_ms, 60000);
  EXPECT_EQ(o.min_clients, 10);
  EXPECT_EQ(job->local_clients, 10);
  EXPECT_TRUE(job->client_data.partitioned);
  EXPECT_EQ(job->client_data.partition.seed, 1u) << "the partition seed defaults to the job seed";
  EXPECT_FALSE(job->simulation.has_value());
}

TEST(JobConfigTest, DefaultsOfAnEmptyJob) {
  auto job = LoadJobConfig(Write("empty", "{}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->coordinator.min_clients, 10) << "a fixed cohort waits for a full cohort";
  auto poisson = LoadJobConfig(Write("poisson", "cohort: {sampling: poisson, rate: 0.2}\n"));
  ASSERT_TRUE(poisson.ok());
  EXPECT_EQ(poisson->coordinator.min_clients, 1);
  auto sim = LoadJobConfig(Write("sim", "simulation: {clients: 300}\n"));
  ASSERT_TRUE(sim.ok());
  EXPECT_EQ(sim->coordinator.min_clients, 300) << "a simulation waits for all its clients";
}

TEST(JobConfigTest, MistakesNameTheKeyTheValueAndWhatIsAllowed) {
  EXPECT_NE(ErrorOf("trian: {epochs: 1}\n").find("unknown key 'trian' (did you mean 'train'?"),
            std::string::npos);
  EXPECT_NE(ErrorOf("train: {learning_rte: 0.1}\n").find("train: unknown key 'learning_rte'"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf("train: {batch_size: 0}\n").find("train.batch_size: 0 is out of range [1, 65536]"),
      std::string::npos);
  EXPECT_NE(ErrorOf("train: {learning_rate: fast}\n").find("'fast' is not a finite number"),
            std::string::npos);
  EXPECT_NE(ErrorOf("cohort: {sampling: random}\n")
                .find("cohort.sampling: 'random' is not allowed (allowed: fixed, poisson)"),
            std::string::npos);
  EXPECT_NE(ErrorOf("model: {hidden: [128, -1]}\n").find("model.hidden[1]"), std::string::npos);
  EXPECT_NE(ErrorOf("rounds: 2\nrounds: 3\n").find("key 'rounds' appears twice"),
            std::string::npos);
  EXPECT_NE(ErrorOf("round: {quorum: 11}\ncohort: {size: 10}\n").find("round.quorum (11) exceeds"),
            std::string::npos);
  EXPECT_NE(ErrorOf("train: 5\n").find("train must be a mapping"), std::string::npos);
  EXPECT_NE(ErrorOf("rounds: [1\n").find("YAML syntax error"), std::string::npos);
}

TEST(JobConfigTest, ClientConfigNeedsACoordinatorAndAnId) {
  ClientConfig c;
  EXPECT_NE(ValidateClientConfig(c).message().find("no coordinator"), absl::string_view::npos);
  c.coordinator = "tcp://127.0.0.1:5555";
  EXPECT_NE(ValidateClientConfig(c).message().find("no client id"), absl::string_view::npos);
  c.client_id = "a";
  c.data.partitioned = true;
  c.data.partition.num_shards = 4;
  c.data.shard = 4;
  EXPECT_NE(ValidateClientConfig(c).message().find("shard 4 is out of range for 4 shards"),
            absl::string_view::npos);
}

TEST(JobConfigTest, SecuritySectionsMapOntoTheOptions) {
  auto job = LoadJobConfig(Write("sec",
                                 "security:\n  server_secret_key: keys/server.key\n"
                                 "  allowed_clients: allowed/\n  reload_interval_s: 0.5\n"
                                 "  max_messages_per_s: 20\n  burst_messages: 40\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  // Relative to the file's directory (Write puts it in the temp directory).
  const std::filesystem::path tmp = std::filesystem::temp_directory_path();
  EXPECT_EQ(job->security.server_secret_key, (tmp / "keys/server.key").string());
  EXPECT_EQ(job->security.allowed_clients, (tmp / "allowed/").string());
  EXPECT_EQ(job->security.reload_interval_ms, 500);
  EXPECT_DOUBLE_EQ(job->security.max_messages_per_s, 20);
  EXPECT_DOUBLE_EQ(job->security.burst_messages, 40);
  EXPECT_NE(ErrorOf("security: {allowed_client: x}\n").find("did you mean 'allowed_clients'"),
            std::string::npos);
  auto client = LoadClientConfig(Write("csec",
                                       "security: {server_public_key: s.pub, "
                                       "secret_key: me.key}\n"));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->security.server_public_key, (tmp / "s.pub").string());
  EXPECT_EQ(client->security.secret_key, (tmp / "me.key").string());
}

TEST(JobConfigTest, PrivacySectionMapsOntoTheOptions) {
  auto job = LoadJobConfig(Write("priv", R"(
cohort: {sampling: poisson, rate: 0.1}
clients: 10
rounds: 30
train: {dp_sgd: {noise_multiplier: 1.2, clip_norm: 0.5, expected_batch_size: 128, delta: 1.0e-6}}
privacy:
  mode: central
  clip_norm: 0.7
  epsilon: 6
  delta: 1.0e-4
  accountant: pld
  adaptive_clipping: {target_quantile: 0.6}
  schedule:
    - {rounds: [1, 10], noise_multiplier: 1.5}
    - {rounds: [11, 30], epsilon: 0.3, clip_norm: 0.4}
)"));
  ASSERT_TRUE(job.ok()) << job.status();
  const privacy::PrivacyOptions& p = job->coordinator.privacy;
  EXPECT_EQ(p.mode, privacy::PrivacyMode::kCentral);
  EXPECT_EQ(p.clip_norm, 0.7);
  EXPECT_EQ(p.total_epsilon, 6.0);
  EXPECT_EQ(p.delta, 1e-4);
  EXPECT_EQ(p.accountant, privacy::AccountantKind::kPld);
  EXPECT_TRUE(p.adaptive.enabled);
  EXPECT_EQ(p.adaptive.target_quantile, 0.6);
  ASSERT_EQ(p.schedule.size(), 2u);
  EXPECT_EQ(p.schedule[1].first_round, 11);
  EXPECT_EQ(p.schedule[1].epsilon, 0.3);
  EXPECT_EQ(p.schedule[1].clip_norm, 0.4);
  ASSERT_TRUE(job->coordinator.train.dp_sgd.has_value());
  EXPECT_EQ(job->coordinator.train.dp_sgd->expected_batch_size, 128);
  EXPECT_EQ(job->coordinator.train.dp_sgd->delta, 1e-6);
}

TEST(JobConfigTest, PrivacyMistakesAreClearErrors) {
  EXPECT_NE(ErrorOf("privacy: {mode: centrall}").find("privacy.mode"), std::string::npos);
  EXPECT_NE(ErrorOf("privacy: {mode: central, epsilon: 1}").find("cohort.sampling: poisson"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf("cohort: {sampling: poisson}\nprivacy: {mode: central}").find("privacy.epsilon"),
      std::string::npos);
  EXPECT_NE(
      ErrorOf(
          "cohort: {sampling: poisson}\nrounds: 5\nclients: 10\nprivacy: {mode: central, schedule: "
          "[{rounds: [1, 3], noise_multiplier: 1}]}")
          .find("does not cover round 4"),
      std::string::npos);
  EXPECT_NE(ErrorOf("cohort: {sampling: poisson}\nprivacy: {mode: central, schedule: "
                    "[{rounds: [1], noise_multiplier: 1}]}")
                .find("[first, last]"),
            std::string::npos);
  EXPECT_NE(ErrorOf("privacy: {mode: local, epsilon: 1, clip_norm: -1}").find("privacy.clip_norm"),
            std::string::npos);
  EXPECT_NE(ErrorOf("privacy: {mode: local, epsilon: 1, delta: 2}").find("privacy.delta"),
            std::string::npos);
  EXPECT_NE(ErrorOf("train: {dp_sgd: {noise_multipler: 1}}").find("noise_multiplier"),
            std::string::npos);
}

TEST(JobConfigTest, TheDpDenominatorIsConfiguredNotEnrolment) {
  // Default: the cohort rate times the population the job itself names (simulated or started).
  auto sim = LoadJobConfig(Write("denom_sim",
                                 "cohort: {sampling: poisson, rate: 0.1}\n"
                                 "simulation: {clients: 1000}\n"
                                 "privacy: {mode: central, epsilon: 8}\n"));
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_DOUBLE_EQ(*sim->coordinator.privacy.expected_cohort_size, 100.0);
  // A standalone coordinator's job that names no population is refused, not given a guess.
  EXPECT_NE(ErrorOf("cohort: {sampling: poisson, rate: 0.1}\n"
                    "privacy: {mode: central, epsilon: 8}\n")
                .find("privacy.expected_cohort_size is required"),
            std::string::npos);
  auto named = LoadJobConfig(Write("denom_named",
                                   "cohort: {sampling: poisson, rate: 0.5}\nclients: 6\n"
                                   "privacy: {mode: central, epsilon: 8}\n"));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_DOUBLE_EQ(*named->coordinator.privacy.expected_cohort_size, 3.0);
  auto set =
      LoadJobConfig(Write("denom_set",
                          "cohort: {sampling: poisson, rate: 0.1}\n"
                          "privacy: {mode: central, epsilon: 8, expected_cohort_size: 42}\n"));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_DOUBLE_EQ(*set->coordinator.privacy.expected_cohort_size, 42.0);
  EXPECT_NE(ErrorOf("cohort: {sampling: poisson}\n"
                    "privacy: {mode: central, epsilon: 8, expected_cohort_size: 0.5}")
                .find("privacy.expected_cohort_size"),
            std::string::npos);
  EXPECT_NE(ErrorOf("privacy: {mode: local, epsilon: 8, adaptive_clipping: {}}")
                .find("adaptive_clipping"),
            std::string::npos);
}

TEST(JobConfigTest, TheClientsPrivacyPolicyIsReadAndChecked) {
  auto client = LoadClientConfig(Write("cpriv",
                                       "privacy:\n"
                                       "  ledger: /var/lib/huddle/ledger.jsonl\n"
                                       "  local: {require: true, min_noise_multiplier: 1.5,"
                                       " max_epsilon: 8, delta: 1.0e-6, clip_norm: 0.5,"
                                       " adjacency: add_remove}\n"
                                       "  dp_sgd: {min_noise_multiplier: 0.8, max_epsilon: 3,"
                                       " accountant: pld}\n"));
  ASSERT_TRUE(client.ok()) << client.status();
  const client::ClientPrivacyPolicy& p = client->privacy;
  EXPECT_EQ(p.ledger_path, "/var/lib/huddle/ledger.jsonl");
  ASSERT_TRUE(p.local && p.dp_sgd);
  EXPECT_TRUE(p.local->require);
  EXPECT_EQ(p.local->min_noise_multiplier, 1.5);
  EXPECT_EQ(*p.local->max_epsilon, 8.0);
  EXPECT_EQ(p.local->delta, 1e-6);
  EXPECT_EQ(*p.local->clip_norm, 0.5);
  EXPECT_EQ(p.local->adjacency, "add_remove");
  EXPECT_FALSE(p.dp_sgd->require);
  EXPECT_EQ(*p.dp_sgd->max_epsilon, 3.0);
  EXPECT_EQ(p.dp_sgd->accountant, privacy::AccountantKind::kPld);
  // A policy without its ledger, and typos, are errors naming the key.
  auto no_ledger = LoadClientConfig(Write("cpriv2", "privacy: {local: {require: true}}\n"));
  ASSERT_FALSE(no_ledger.ok());
  EXPECT_NE(no_ledger.status().message().find("privacy.ledger"), absl::string_view::npos)
      << no_ledger.status();
  auto typo =
      LoadClientConfig(Write("cpriv3", "privacy: {ledger: l.jsonl, local: {min_noise: 1}}\n"));
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("min_noise"), absl::string_view::npos);
  auto adjacency =
      LoadClientConfig(Write("cpriv4", "privacy: {ledger: l.jsonl, local: {adjacency: swap}}\n"));
  ASSERT_FALSE(adjacency.ok());
  EXPECT_NE(adjacency.status().message().find("replace_one"), absl::string_view::npos);
  auto none = LoadClientConfig(Write("cpriv5", "device: cpu\n"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->privacy.any());
}

TEST(JobConfigTest, BatchNormIsReadAndRefusedWithDpSgd) {
  auto job = LoadJobConfig(Write("bn", "model: {hidden: [16], batch_norm: true}"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->coordinator.model.has_batch_norm());
  auto dc = LoadDatacenterConfig(Write("bn_dc", "model: {batch_norm: true}"));
  ASSERT_TRUE(dc.ok()) << dc.status();
  EXPECT_TRUE(dc->model.has_batch_norm());
  const std::string refused =
      ErrorOf("model: {batch_norm: true}\ntrain: {dp_sgd: {noise_multiplier: 1}}");
  EXPECT_NE(refused.find("train.dp_sgd"), std::string::npos) << refused;
  EXPECT_NE(refused.find("batch_norm"), std::string::npos) << refused;
  auto dc_dp = LoadDatacenterConfig(
      Write("bn_dc_dp", "model: {batch_norm: true}\ntrain: {dp_sgd: {expected_batch_size: 64}}"));
  ASSERT_FALSE(dc_dp.ok());
  EXPECT_NE(dc_dp.status().message().find("batch_norm"), std::string::npos) << dc_dp.status();
  EXPECT_NE(ErrorOf("model: {batch_norm: yes please}").find("model.batch_norm"), std::string::npos);
}

TEST(JobConfigTest, ALayerListIsReadAndItsMistakesNamed) {
  auto job = LoadJobConfig(Write("layers",
                                 "model:\n"
                                 "  input: [1, 28, 28]\n"
                                 "  layers:\n"
                                 "    - conv2d: {out: 8, kernel: 5, padding: 2, stride: 1}\n"
                                 "    - group_norm: {groups: 4}\n"
                                 "    - tanh: {}\n"
                                 "    - avg_pool2d: {kernel: 2}\n"
                                 "    - dropout: {rate: 0.25}\n"
                                 "    - flatten:\n"
                                 "    - dense: {out: 10}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  const models::ModelSpec& m = job->coordinator.model;
  EXPECT_EQ(m.input, (std::vector<int64_t>{1, 28, 28}));
  ASSERT_EQ(m.layers.size(), 7u);
  EXPECT_EQ(
      m.layers[0],
      (models::LayerSpec{
          .kind = models::LayerKind::kConv2d, .out = 8, .kernel = 5, .stride = 1, .padding = 2}));
  EXPECT_EQ(m.layers[1].groups, 4);
  EXPECT_EQ(m.layers[4].rate, 0.25);
  EXPECT_EQ(m.num_classes(), 10);
  auto dc = LoadDatacenterConfig(
      Write("layers_dc", "model: {input: [4], layers: [{dense: {out: 3}}]}\n"));
  ASSERT_TRUE(dc.ok()) << dc.status();
  EXPECT_EQ(dc->model.num_classes(), 3);

  EXPECT_THAT(ErrorOf("model: {input: [1, 28, 28], layers: [{conv2d: {out: 8, kernel: 5}}, "
                      "{dense: {out: 10}}]}"),
              HasSubstr("model.layers: model layer 1 (dense) needs a flat input; it gets "
                        "[8,24,24]: add a flatten layer"));
  auto scattering = LoadDatacenterConfig(
      Write("scattering_dc",
            "model: {input: [1, 28, 28], layers: [{scattering2d: {}}, {flatten: {}}, "
            "{dense: {out: 10}}]}\n"));
  ASSERT_TRUE(scattering.ok()) << scattering.status();
  EXPECT_EQ(
      scattering->model.layers[0],
      (models::LayerSpec{.kind = models::LayerKind::kScattering2d, .scales = 2, .angles = 8}));
  EXPECT_THAT(ErrorOf("model: {input: [1, 28, 28], layers: [{scattering2d: {scales: 3, angles: "
                      "17}}, {flatten: {}}, {dense: {out: 10}}]}"),
              HasSubstr("model.layers[0].scattering2d.angles"));
  EXPECT_THAT(ErrorOf("model: {input: [4], layers: [{densse: {out: 3}}]}"),
              HasSubstr("model.layers[0].densse: unknown layer kind 'densse'"));
  EXPECT_THAT(ErrorOf("model: {input: [4], layers: [{dense: {}}]}"),
              HasSubstr("model.layers[0].dense.out is required"));
  EXPECT_THAT(ErrorOf("model: {input: [4], layers: [{dense: {out: 3, kernel: 2}}]}"),
              HasSubstr("kernel"));
  EXPECT_THAT(ErrorOf("model: {input: [4], layers: [{relu: {}, dense: {out: 3}}]}"),
              HasSubstr("model.layers[0] must be a mapping with one key"));
  EXPECT_THAT(ErrorOf("model: {layers: [{dense: {out: 3}}]}"),
              HasSubstr("model.input is required with layers"));
  EXPECT_THAT(ErrorOf("model: {input: [4], hidden: [3], layers: [{dense: {out: 3}}]}"),
              HasSubstr("model.hidden is for kind: mlp"));
  EXPECT_THAT(ErrorOf("model: {kind: mlp, layers: [{dense: {out: 3}}]}"),
              HasSubstr("model.layers is for kind: layers"));
  // DP-SGD refuses batch norm in a layer list too, naming the alternative.
  EXPECT_THAT(ErrorOf("model: {input: [4], layers: [{dense: {out: 8}}, {batch_norm: {}}, "
                      "{dense: {out: 3}}]}\ntrain: {dp_sgd: {noise_multiplier: 1}}"),
              HasSubstr("group_norm"));
}

TEST(JobConfigTest, SiloNprocIsReadAndCheckedInBothFiles) {
  auto client = LoadClientConfig(Write("silo", "device: cpu\nsilo: {nproc: 4}\n"));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->silo_nproc, 4);
  auto plain = LoadClientConfig(Write("nosilo", "device: cpu\n"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->silo_nproc, 1) << "no silo by default";
  auto bad = LoadClientConfig(Write("silo0", "silo: {nproc: 0}\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("silo.nproc: 0 is out of range [1, 1024]"),
            absl::string_view::npos)
      << bad.status();
  auto typo = LoadClientConfig(Write("silotypo", "silo: {nprocs: 2}\n"));
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("unknown key 'nprocs' (did you mean 'nproc'?"),
            absl::string_view::npos)
      << typo.status();
  auto job = LoadJobConfig(Write("jobsilo", "client: {device: cpu, silo: {nproc: 2}}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->client_silo_nproc, 2);
  EXPECT_NE(ErrorOf("client: {silo: {nproc: 2000}}\n").find("client.silo.nproc: 2000"),
            std::string::npos)
      << ErrorOf("client: {silo: {nproc: 2000}}\n");
  EXPECT_NE(ErrorOf("client: {sillo: {nproc: 2}}\n").find("did you mean 'silo'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("simulation: {clients: 10}\nclient: {silo: {nproc: 2}}\n")
                .find("simulated clients train on one thread each"),
            std::string::npos);
}

}  // namespace
}  // namespace huddle::cli
