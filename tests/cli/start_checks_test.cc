// What a job is checked for before anything starts (cli/job_config.h, LoadJobConfig; and the
// coordinator's test set, MakeEvaluator): a DP plan whose rounds cannot all run within its total,
// central DP without a stated denominator, a cohort too small for its noise (a warning), and data
// that does not fit the model. Every refusal names the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "cli/job_config.h"
#include "models/model.h"
#include "privacy/budget.h"

namespace huddle::cli {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

class StartChecksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("huddle_start_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string WriteText(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::binary) << text;
    return Path(name);
  }
  // `rows` rows of `label % classes` and `features` features.
  std::string WriteCsv(const std::string& name, int rows, int features, int classes) const {
    std::string csv;
    for (int r = 0; r < rows; ++r) {
      csv += std::to_string(r % classes);
      for (int f = 0; f < features; ++f) csv += f == r % features ? ",1" : ",0";
      csv += "\n";
    }
    return WriteText(name, csv);
  }
  StatusOr<JobConfig> Load(const std::string& yaml) const {
    return LoadJobConfig(WriteText("job.yaml", yaml));
  }
  std::string ErrorOf(const std::string& yaml) const {
    StatusOr<JobConfig> job = Load(yaml);
    return job.ok() ? "" : std::string(job.status().message());
  }

  std::filesystem::path dir_;
};

// The plan: 40 rounds of noise_multiplier 2 at q = 0.5 capped at epsilon 3 would stop
// after a few rounds with no word at start.
constexpr const char* kOverrunningPlan =
    "rounds: 40\n"
    "simulation: {clients: 20}\n"
    "cohort: {sampling: poisson, rate: 0.5}\n"
    "privacy:\n"
    "  mode: central\n"
    "  epsilon: 3\n"
    "  delta: 1.0e-5\n"
    "  schedule: [{rounds: [1, 40], noise_multiplier: 2.0}]\n";

TEST_F(StartChecksTest, ADpPlanWhoseRoundsCannotAllRunIsRefusedWithWhatFits) {
  const std::string error = ErrorOf(kOverrunningPlan);
  EXPECT_THAT(error, HasSubstr("privacy.epsilon: 40 rounds at noise_multiplier 2 spend epsilon "));
  EXPECT_THAT(error, HasSubstr("at delta 1e-05, past the total 3: "));
  EXPECT_THAT(error, HasSubstr("or set privacy.stop_at_budget: true"));
  // "N rounds fit (rounds: N), or noise_multiplier >= Z fits all 40" (read without std::regex:
  // GCC 12 warns falsely inside it under ASan).
  const size_t fits_at = error.find(" rounds fit (rounds: ");
  const size_t z_at = error.find("or noise_multiplier >= ");
  ASSERT_NE(fits_at, std::string::npos) << error;
  ASSERT_NE(z_at, std::string::npos) << error;
  ASSERT_NE(error.find(" fits all 40", z_at), std::string::npos) << error;
  size_t digits = fits_at;
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(error[digits - 1]))) --digits;
  ASSERT_LT(digits, fits_at) << error;
  const int64_t fit = std::stoll(error.substr(digits, fits_at - digits));
  const double z = std::stod(error.substr(z_at + std::string("or noise_multiplier >= ").size()));
  EXPECT_GT(fit, 0);
  EXPECT_LT(fit, 40);
  // What it suggests holds: `fit` rounds of this plan, or all 40 at z, stay within the total.
  auto at = [](int64_t rounds, double noise) {
    privacy::PrivacyOptions o;
    o.mode = privacy::PrivacyMode::kCentral;
    o.expected_cohort_size = 10;
    o.delta = 1e-5;
    privacy::ScheduleRange all;
    all.last_round = rounds;
    all.noise_multiplier = noise;
    o.schedule = {all};
    auto plan = privacy::PrivacyPlan::Create(o, 0.5, rounds);
    return plan->Spent(plan->PlannedEvents(rounds))->epsilon;
  };
  EXPECT_LE(at(fit, 2.0), 3.0);
  EXPECT_GT(at(fit + 1, 2.0), 3.0);
  EXPECT_LE(at(40, z), 3.0);
  EXPECT_GT(at(40, z * 0.98), 3.0);

  // Opting into the stop: accepted, and said at start where it will stop.
  auto job = Load(std::string(kOverrunningPlan) + "  stop_at_budget: true\n");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->coordinator.privacy.stop_at_budget);
  EXPECT_THAT(job->notes,
              testing::Contains(HasSubstr(absl::StrCat(
                  "privacy.stop_at_budget: the job stops after round ", fit, " of 40"))));
  // A plan that cannot run even one round is refused all the same.
  const std::string none = ErrorOf(
      "rounds: 3\nsimulation: {clients: 20}\ncohort: {sampling: poisson, rate: 0.5}\n"
      "privacy: {mode: central, epsilon: 3, delta: 1.0e-5, stop_at_budget: true, "
      "schedule: [{rounds: [1, 3], noise_multiplier: 0.9}]}\n");
  EXPECT_THAT(none, HasSubstr("not even round 1 fits; noise_multiplier >= "));
  EXPECT_THAT(none, testing::Not(HasSubstr("stop_at_budget")));
  // A plan that fits needs no opt-in.
  auto calibrated = Load(
      "rounds: 40\nsimulation: {clients: 20}\ncohort: {sampling: poisson, rate: 0.5}\n"
      "privacy: {mode: central, epsilon: 3, delta: 1.0e-5}\n");
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  EXPECT_FALSE(calibrated->coordinator.privacy.stop_at_budget);
}

TEST_F(StartChecksTest, CentralDpMustStateItsDenominatorWhereTheJobStartsNoClients) {
  const std::string error =
      ErrorOf("cohort: {sampling: poisson, rate: 0.1}\nprivacy: {mode: central, epsilon: 8}\n");
  EXPECT_THAT(error, AllOf(HasSubstr("privacy.expected_cohort_size is required"),
                           HasSubstr("the expected number of client updates per round"),
                           HasSubstr("Set it to cohort.rate (0.1) x the number of clients you "
                                     "expect to be enrolled, e.g. 0.1 x 30 clients = 3")));
  // Its other mistakes come first.
  EXPECT_THAT(ErrorOf("cohort: {sampling: poisson}\nprivacy: {mode: central}\n"),
              HasSubstr("privacy.epsilon"));
  // Derived from the clients the job starts: said at start.
  auto run = Load(
      "cohort: {sampling: poisson, rate: 0.5}\nclients: 10\n"
      "privacy: {mode: central, epsilon: 8}\n");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(*run->coordinator.privacy.expected_cohort_size, 5.0);
  EXPECT_THAT(run->notes, ElementsAre(HasSubstr(
                              "privacy.expected_cohort_size derived: cohort.rate 0.5 x 10 clients "
                              "(started by huddle run) = 5")));
  auto sim = Load(
      "cohort: {sampling: poisson, rate: 0.1}\nsimulation: {clients: 1000}\n"
      "privacy: {mode: central, epsilon: 8}\n");
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_THAT(sim->notes, ElementsAre(HasSubstr("cohort.rate 0.1 x 1000 simulated clients = 100")));
  // Stated: nothing to say.
  auto set = Load(
      "cohort: {sampling: poisson, rate: 0.1}\n"
      "privacy: {mode: central, epsilon: 8, expected_cohort_size: 42}\n");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(set->notes.empty());
}

TEST_F(StartChecksTest, ACohortTooSmallForItsNoiseIsWarnedOnce) {
  // The job: 3 clients at rate 0.5 (an expected cohort of 1.5), z 4.5, C 0.3: the noise
  // on the mean has std 4.5 x 0.3 / 1.5 = 0.9, three times the clip norm.
  auto small = Load(
      "rounds: 10\nclients: 3\ncohort: {sampling: poisson, rate: 0.5}\n"
      "privacy: {mode: central, clip_norm: 0.3, schedule: [{rounds: [1, 10], "
      "noise_multiplier: 4.5}]}\n");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_THAT(small->warnings,
              ElementsAre(AllOf(HasSubstr("privacy: noise std on the mean update 0.9 is 3x the "
                                          "clip norm 0.3 with an expected cohort of 1.5"),
                                HasSubstr("the model will likely not learn; raise the cohort"))));
  // Local DP: n independent draws averaged, std z C / sqrt(n): 4 / sqrt(4) = 2x.
  auto local = Load(
      "rounds: 5\nclients: 4\ncohort: {size: 4}\n"
      "privacy: {mode: local, schedule: [{rounds: [1, 5], noise_multiplier: 4}]}\n");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_THAT(local->warnings, ElementsAre(HasSubstr("is 2x the clip norm 1 with an expected "
                                                     "cohort of 4 (local DP")));
  // Only the rounds past the threshold are named.
  auto later = Load(
      "rounds: 10\nclients: 4\ncohort: {size: 4}\n"
      "privacy: {mode: local, schedule: [{rounds: [1, 5], noise_multiplier: 1}, "
      "{rounds: [6, 10], noise_multiplier: 6}]}\n");
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_THAT(later->warnings, ElementsAre(HasSubstr("noise_multiplier 6 in rounds 6-10")));
  // The shipped DP examples' cohorts are large enough.
  for (const char* name : {"dp_central", "dp_distributed", "dp_schedule"}) {
    auto job = LoadJobConfig(std::string(HUDDLE_SOURCE_DIR) + "/examples/" + name + ".yaml");
    ASSERT_TRUE(job.ok()) << name << ": " << job.status();
    EXPECT_TRUE(job->warnings.empty()) << name << ": " << job->warnings[0];
  }
}

TEST_F(StartChecksTest, EvaluationDataDefaultsToFashionMnistOnlyForItsInput) {
  // The job: a 20-feature CSV model with no evaluation.data.
  const std::string csv20 =
      "name: csv20\nmodel: {input_dim: 20, hidden: [8], num_classes: 2}\n"
      "data: {path: train.csv, format: csv, num_classes: 2}\n";
  EXPECT_THAT(ErrorOf(csv20),
              AllOf(HasSubstr("job.yaml: evaluation.data is required for a model whose input is "
                              "not Fashion-MNIST's 28x28 (the model's input is [20], 20 features)"),
                    HasSubstr("evaluation: {every: 0}")));
  // No server evaluation, or the clients': nothing to load.
  EXPECT_TRUE(Load(csv20 + "evaluation: {every: 0}\n").ok());
  EXPECT_TRUE(Load(csv20 + "evaluation: {mode: federated}\n").ok());
  // Given, it is read as the clients' data is (format, scale_255), unless it says otherwise.
  WriteCsv("test.csv", 10, 20, 2);
  auto given = Load(
      "model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
      "data: {path: train.csv, format: csv, num_classes: 2, scale_255: true}\n"
      "evaluation: {data: test.csv}\n");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->eval_data, Path("test.csv"));
  EXPECT_EQ(given->eval_format, "csv");
  EXPECT_TRUE(given->eval_scale_255);
  // An IDX test set is a directory, a CSV one a file.
  std::filesystem::create_directories(Path("idx"));
  auto idx = Load(
      "model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
      "data: {path: train.csv, format: csv, num_classes: 2}\nevaluation: {data: idx}\n");
  ASSERT_TRUE(idx.ok()) << idx.status();
  EXPECT_EQ(idx->eval_format, "idx");
  auto file = Load(
      "model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
      "evaluation: {data: test.csv}\n");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->eval_format, "csv");
  auto explicit_format = Load(
      "model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
      "evaluation: {data: test.csv, format: csv, scale_255: false}\n");
  ASSERT_TRUE(explicit_format.ok()) << explicit_format.status();
  EXPECT_EQ(explicit_format->eval_format, "csv");
  // A 784-input model keeps the default (28x28 as layers, too).
  auto fmnist = Load("model: {input: [1, 28, 28], layers: [{flatten: {}}, {dense: {out: 10}}]}\n");
  ASSERT_TRUE(fmnist.ok()) << fmnist.status();
  EXPECT_EQ(fmnist->eval_data, kFashionMnist);
  EXPECT_EQ(fmnist->eval_format, "idx");
  EXPECT_THAT(ErrorOf("evaluation: {mode: federated, format: csv}\n"),
              HasSubstr("evaluation.format is for mode: server"));
}

TEST_F(StartChecksTest, CsvDataWhoseWidthIsNotTheModelsIsRefusedNamingTheKey) {
  WriteCsv("wide.csv", 4, 784, 2);
  EXPECT_THAT(ErrorOf("model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
                      "evaluation: {data: wide.csv, format: csv}\n"),
              HasSubstr("evaluation.data: " + Path("wide.csv") +
                        " has 784 features per example; the model (mlp 20-8-2) expects 20"));
  WriteCsv("narrow.csv", 4, 5, 2);
  EXPECT_THAT(ErrorOf("model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
                      "evaluation: {every: 0}\ndata: {path: narrow.csv, format: csv}\n"),
              HasSubstr("data.path: " + Path("narrow.csv") +
                        " has 5 features per example; the model (mlp 20-8-2) expects 20"));
  // A header line has the rows' width; blank lines before it are skipped.
  WriteText("header.csv", "\n\nlabel,a,b,c\n1,0,0,0\n");
  EXPECT_THAT(ErrorOf("model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
                      "evaluation: {every: 0}\ndata: {path: header.csv, format: csv}\n"),
              HasSubstr("has 3 features per example"));
  // Labels the model has no class for.
  EXPECT_THAT(ErrorOf("model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
                      "evaluation: {every: 0}\ndata: {format: csv, num_classes: 5}\n"),
              HasSubstr("data.num_classes is 5; the model (mlp 20-8-2) has 2 classes"));
  // A client data file the coordinator's host does not have is no error (its clients read it).
  EXPECT_TRUE(Load("model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
                   "evaluation: {every: 0}\ndata: {path: elsewhere.csv, format: csv}\n")
                  .ok());
}

// The coordinator loads its test set and checks it against the model at start, before round 1,
// naming evaluation.data.
TEST_F(StartChecksTest, TheTestSetIsLoadedAndCheckedBeforeRoundOne) {
  JobConfig job;
  job.coordinator.model = models::MlpSpec{20, {8}, 2};
  job.eval_format = "csv";
  job.eval_data = WriteCsv("test.csv", 10, 20, 2);
  auto evaluator = MakeEvaluator(job);
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  ASSERT_TRUE(*evaluator);
  auto stats = (*evaluator)(models::InitModel(job.coordinator.model, 1));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->examples, 10);

  // Labels past the model's classes.
  job.eval_data = WriteCsv("three.csv", 10, 20, 3);
  auto labels = MakeEvaluator(job);
  ASSERT_FALSE(labels.ok());
  EXPECT_THAT(labels.status().message(),
              HasSubstr("evaluation.data: " + Path("three.csv") +
                        ": example 2 has label 2, outside the model's [0, 2)"));
  // Missing.
  job.eval_data = Path("missing.csv");
  auto missing = MakeEvaluator(job);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("evaluation.data: "));

  // Fashion-MNIST's test split for a model of 20 inputs: its width, before any round.
  if (!std::filesystem::exists(kFashionMnist)) {
    GTEST_SKIP() << kFashionMnist << " is not installed";
  }
  job.eval_format = "idx";
  job.eval_data = kFashionMnist;
  auto wide = MakeEvaluator(job);
  ASSERT_FALSE(wide.ok());
  EXPECT_THAT(wide.status().message(),
              HasSubstr(absl::StrCat("evaluation.data: ", kFashionMnist,
                                     " has 784 features per example; the model (mlp 20-8-2) "
                                     "expects 20")));
}

// Asynchronous training under DP: the participation bound is read, its denominator is the
// buffer (nothing derived), and a job without a bound is refused naming the key.
TEST_F(StartChecksTest, AnAsynchronousDpJobNeedsItsParticipationBound) {
  const std::string job =
      "rounds: 20\nsimulation: {clients: 50}\nasync: {concurrency: 5, buffer: 10}\n"
      "privacy: {mode: central, epsilon: 4, delta: 1.0e-5";
  auto loaded = Load(job + ", max_participations: 3, min_separation: 2}\n");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->coordinator.privacy.max_participations, 3);
  EXPECT_EQ(loaded->coordinator.privacy.min_separation, 2);
  EXPECT_FALSE(loaded->coordinator.privacy.expected_cohort_size.has_value());
  EXPECT_THAT(ErrorOf(job + "}\n"), HasSubstr("privacy.max_participations"));
  EXPECT_THAT(ErrorOf(job + ", max_participations: 3, expected_cohort_size: 10}\n"),
              HasSubstr("privacy.expected_cohort_size does not apply with async"));
  EXPECT_THAT(ErrorOf("rounds: 2\nsimulation: {clients: 50}\n"
                      "privacy: {mode: central, epsilon: 4, max_participations: 3}\n"),
              HasSubstr("privacy.max_participations applies to asynchronous training"));
}

}  // namespace
}  // namespace huddle::cli
