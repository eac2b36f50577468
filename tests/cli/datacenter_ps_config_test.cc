// `datacenter.parameter_server` and `datacenter.slowdown_for_testing` in the YAML: values read,
// and the combinations the mode does not support refused naming their keys and saying why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli/job_config.h"

namespace huddle::cli {
namespace {

using ::testing::HasSubstr;

std::string Write(const std::string& text) {
  static int count = 0;
  const auto path =
      std::filesystem::temp_directory_path() /
      ("huddle_ps_cfg_" + std::to_string(::getpid()) + "_" + std::to_string(count++) + ".yaml");
  std::ofstream(path) << text;
  return path.string();
}

std::string ErrorOf(const std::string& text) {
  auto c = LoadDatacenterConfig(Write(text));
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(DatacenterPsConfig, ReadsTheSectionAndItsDefaults) {
  auto c = LoadDatacenterConfig(
      Write("datacenter:\n"
            "  parameter_server: {servers: 2, mode: async, staleness_bound: 3}\n"
            "  slowdown_for_testing: {rank: 3, sleep_ms: 40}\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->parameter_server.has_value());
  EXPECT_EQ(c->parameter_server->servers, 2);
  EXPECT_TRUE(c->parameter_server->async);
  EXPECT_EQ(c->parameter_server->staleness_bound, 3);
  EXPECT_EQ(c->slow_rank_for_testing, 3);
  EXPECT_EQ(c->slow_sleep_ms_for_testing, 40);
  auto d = LoadDatacenterConfig(Write("datacenter: {parameter_server: {}}\n"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->parameter_server->servers, 1);
  EXPECT_TRUE(d->parameter_server->async);
  EXPECT_FALSE(d->parameter_server->staleness_bound.has_value()) << "unbounded by default";
  auto s = LoadDatacenterConfig(
      Write("datacenter: {parameter_server: {mode: sync, backup_workers: 1}}\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->parameter_server->async);
  EXPECT_EQ(s->parameter_server->backup_workers, 1);
  auto none = LoadDatacenterConfig(Write("seed: 1\n"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->parameter_server.has_value());
}

TEST(DatacenterPsConfig, RefusesWhatTheModeDoesNotSupportSayingWhy) {
  const std::string dp = ErrorOf(
      "train: {dp_sgd: {noise_multiplier: 1}}\ndatacenter: {parameter_server: {mode: async}}\n");
  EXPECT_THAT(dp, HasSubstr("datacenter.parameter_server"));
  EXPECT_THAT(dp, HasSubstr("train.dp_sgd"));
  EXPECT_THAT(dp, HasSubstr("arrival order"));
  EXPECT_THAT(ErrorOf("train: {dp_sgd: {noise_multiplier: 1}}\n"
                      "datacenter: {parameter_server: {mode: sync}}\n"),
              HasSubstr("all-reduce mode"));
  const std::string bn =
      ErrorOf("model: {batch_norm: true}\ndatacenter: {parameter_server: {servers: 1}}\n");
  EXPECT_THAT(bn, HasSubstr("batch normalization"));
  EXPECT_THAT(bn, HasSubstr("SyncBatchNorm"));
  EXPECT_THAT(ErrorOf("datacenter: {device: cuda, parameter_server: {}}\n"), HasSubstr("CPU only"));
  EXPECT_THAT(ErrorOf("datacenter: {parameter_server: {mode: async, backup_workers: 1}}\n"),
              HasSubstr("backup_workers"));
  EXPECT_THAT(ErrorOf("datacenter: {parameter_server: {mode: sync, staleness_bound: 1}}\n"),
              HasSubstr("staleness_bound"));
  EXPECT_THAT(ErrorOf("datacenter: {parameter_server: {servers: 0}}\n"), HasSubstr("servers"));
  EXPECT_THAT(ErrorOf("datacenter: {parameter_server: {mode: later}}\n"), HasSubstr("mode"));
  EXPECT_THAT(ErrorOf("datacenter: {parameter_server: {stalenes_bound: 1}}\n"),
              HasSubstr("stalenes_bound"));
}

}  // namespace
}  // namespace huddle::cli
