#include "common/config_reader.h"

#include <fstream>

#include "gtest/gtest.h"

namespace huddle {
namespace {

ConfigMap Parse(const std::string& yaml) {
  auto map = ConfigMap::From(YAML::Load(yaml), "job.yaml", "");
  EXPECT_TRUE(map.ok()) << map.status();
  return std::move(map).value();
}

TEST(ConfigMapTest, ReadsEveryTypeAndKeepsDefaultsForAbsentKeys) {
  ConfigMap m = Parse(R"(
rounds: 30
learning_rate: 0.05
secure: true
name: fashion
strategy: fedavgm
hidden: [256, 128]
empty_value:
)");
  int64_t rounds = 1, absent_int = 42;
  double lr = 1.0;
  bool secure = false;
  std::string name, strategy = "fedavg";
  std::vector<int64_t> hidden, absent_list = {7};
  int64_t empty_value = 9;
  EXPECT_TRUE(m.Optional("rounds", &rounds, 1, 1000).ok());
  EXPECT_TRUE(m.Optional("learning_rate", &lr, 0.0, 10.0).ok());
  EXPECT_TRUE(m.Optional("secure", &secure).ok());
  EXPECT_TRUE(m.Optional("name", &name).ok());
  EXPECT_TRUE(m.OptionalChoice("strategy", &strategy, {"fedavg", "fedavgm"}).ok());
  EXPECT_TRUE(m.Optional("hidden", &hidden, 1, 4096).ok());
  EXPECT_TRUE(m.Optional("absent_int", &absent_int, 0, 100).ok());
  EXPECT_TRUE(m.Optional("absent_list", &absent_list, 0, 100).ok());
  EXPECT_TRUE(m.Optional("empty_value", &empty_value, 0, 100).ok());
  EXPECT_TRUE(m.Finish().ok()) << m.Finish();
  EXPECT_EQ(rounds, 30);
  EXPECT_EQ(lr, 0.05);
  EXPECT_TRUE(secure);
  EXPECT_EQ(name, "fashion");
  EXPECT_EQ(strategy, "fedavgm");
  EXPECT_EQ(hidden, (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(absent_int, 42);
  EXPECT_EQ(absent_list, (std::vector<int64_t>{7}));
  EXPECT_EQ(empty_value, 9) << "a null value counts as absent";
  EXPECT_TRUE(m.Has("rounds"));
  EXPECT_FALSE(m.Has("absent_int"));
}

TEST(ConfigMapTest, RejectsWrongTypesWithTheKeyAndTheAllowedValues) {
  ConfigMap m = Parse("a: 1.5\nb: abc\nc: yes\nd: [1]\ne: sgd\nf: nan\n");
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::string s = "fedavg";
  Status st = m.Optional("a", &i, 0, 10);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "job.yaml: a: '1.5' is not an integer (allowed: [0, 10])");
  EXPECT_EQ(m.Optional("b", &d, 0, 1).message(),
            "job.yaml: b: 'abc' is not a finite number (allowed: [0, 1])");
  EXPECT_EQ(m.Optional("f", &d, 0, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Optional("c", &b).message(),
            "job.yaml: c: 'yes' is not a boolean (allowed: true, false)");
  EXPECT_EQ(m.Optional("d", &i, 0, 10).message(), "job.yaml: d must be a single value");
  EXPECT_EQ(m.OptionalChoice("e", &s, {"fedavg", "fedavgm"}).message(),
            "job.yaml: e: 'sgd' is not allowed (allowed: fedavg, fedavgm)");
  EXPECT_EQ(i, 0);
  EXPECT_EQ(d, 0);
  EXPECT_EQ(s, "fedavg") << "outputs are untouched on error";
}

TEST(ConfigMapTest, ChecksRanges) {
  ConfigMap m = Parse("batch_size: 0\nlr: 2.5\nmax: 65536\n");
  int64_t batch = 32, max = 0;
  double lr = 0.1;
  EXPECT_EQ(m.Optional("batch_size", &batch, 1, 65536).message(),
            "job.yaml: batch_size: 0 is out of range [1, 65536]");
  EXPECT_EQ(batch, 32);
  EXPECT_EQ(m.Optional("lr", &lr, 0.0, 1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lr, 0.1);
  EXPECT_TRUE(m.Optional("max", &max, 1, 65536).ok()) << "bounds are inclusive";
  EXPECT_EQ(max, 65536);
}

TEST(ConfigMapTest, UnknownKeyNamesTheKeyAndSuggestsTheClosest) {
  ConfigMap m = Parse("learning_rte: 0.1\nrounds: 3\n");
  double lr = 0;
  int64_t rounds = 0;
  ASSERT_TRUE(m.Optional("learning_rate", &lr, 0, 1).ok());
  ASSERT_TRUE(m.Optional("rounds", &rounds, 0, 10).ok());
  const Status st = m.Finish();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "job.yaml: top level: unknown key 'learning_rte' (did you mean 'learning_rate'? "
            "allowed: learning_rate, rounds)");
  ConfigMap far = Parse("zzzzzz: 1\n");
  ASSERT_TRUE(far.Optional("rounds", &rounds, 0, 10).ok());
  EXPECT_EQ(far.Finish().message(), "job.yaml: top level: unknown key 'zzzzzz' (allowed: rounds)");
}

TEST(ConfigMapTest, NestedChildrenCarryTheirPathIntoErrors) {
  ConfigMap top = Parse("train:\n  optimizer:\n    momentum: 2\n    nesterv: true\n");
  auto train = top.Child("train");
  ASSERT_TRUE(train.ok());
  auto optimizer = train->Child("optimizer");
  ASSERT_TRUE(optimizer.ok());
  double momentum = 0;
  bool nesterov = false;
  EXPECT_EQ(optimizer->Optional("momentum", &momentum, 0, 1).message(),
            "job.yaml: train.optimizer.momentum: 2 is out of range [0, 1]");
  ASSERT_TRUE(optimizer->Optional("nesterov", &nesterov).ok());
  EXPECT_EQ(optimizer->Finish().message(),
            "job.yaml: train.optimizer: unknown key 'nesterv' (did you mean 'nesterov'? allowed: "
            "momentum, nesterov)");
  EXPECT_TRUE(train->Finish().ok());
  EXPECT_TRUE(top.Finish().ok());
  EXPECT_EQ(optimizer->Where("lr"), "job.yaml: train.optimizer.lr");

  auto absent = top.Child("privacy");
  ASSERT_TRUE(absent.ok()) << "an absent child is an empty mapping";
  EXPECT_TRUE(absent->Finish().ok());
}

TEST(ConfigMapTest, ChildThatIsNotAMappingIsAnError) {
  ConfigMap top = Parse("train: 5\n");
  auto train = top.Child("train");
  EXPECT_EQ(train.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(train.status().message(), "job.yaml: train must be a mapping of keys to values");
  auto scalar_top = ConfigMap::From(YAML::Load("hello"), "job.yaml", "");
  EXPECT_EQ(scalar_top.status().message(),
            "job.yaml: top level must be a mapping of keys to values");
}

TEST(ConfigMapTest, ListsCheckEveryElement) {
  ConfigMap m = Parse("a: [128, 0, 64]\nb: 5\nc: [1, [2]]\nd: []\n");
  std::vector<int64_t> v = {9};
  EXPECT_EQ(m.Optional("a", &v, 1, 1024).message(),
            "job.yaml: a[1]: '0' is not an integer in [1, 1024]");
  EXPECT_EQ(m.Optional("b", &v, 1, 1024).message(),
            "job.yaml: b must be a list of integers, e.g. [128, 64]");
  EXPECT_EQ(m.Optional("c", &v, 1, 1024).message(),
            "job.yaml: c[1]: '<not a scalar>' is not an integer in [1, 1024]");
  EXPECT_EQ(v, (std::vector<int64_t>{9}));
  EXPECT_TRUE(m.Optional("d", &v, 1, 1024).ok());
  EXPECT_TRUE(v.empty());
}

TEST(ConfigMapTest, LoadFileReportsMissingFilesAndSyntaxErrors) {
  const std::string dir = testing::TempDir();
  EXPECT_EQ(ConfigMap::LoadFile(dir + "/no_such_config.yaml").status().code(),
            absl::StatusCode::kNotFound);
  const std::string bad = dir + "/config_reader_test_bad.yaml";
  std::ofstream(bad) << "train: [1, 2\n";
  auto st = ConfigMap::LoadFile(bad).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("YAML syntax error"), std::string::npos) << st;
  const std::string good = dir + "/config_reader_test_good.yaml";
  std::ofstream(good) << "rounds: 4\n";
  auto m = ConfigMap::LoadFile(good);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->Where("rounds"), good + ": rounds");
}

}  // namespace
}  // namespace huddle
