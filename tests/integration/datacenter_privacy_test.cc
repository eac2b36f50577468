// Integration tests of `huddle datacenter` with train.dp_sgd and its privacy ledger
// (datacenter/privacy_session.h): the ledger counts every step any output reflected, whatever
// moment the job is killed at; the start rules (no ledger overwritten, a ledger that does not cover
// the checkpoint refused, the budget over all sessions); zero noise reported as not private
// everywhere; public and operator-only outputs kept apart; and privacy.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "privacy/accountant.h"
#include "tests/integration/datacenter_job.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// 1200 rows, expected batch 60: q = 0.05, 20 steps per epoch.
constexpr char kDp[] = "noise_multiplier: 1.0, clip_norm: 1.0, expected_batch_size: 60";
constexpr double kDelta = 1e-5;
// datacenter.timeout_s of runs that rank 0 refuses before joining: the other ranks wait for it
// that long (or until the launcher stops them, 5 s after the refusal).
constexpr double kRefused = 2;

// Epsilon (rdp, delta 1e-5) of `steps` steps at q, z.
double Epsilon(double q, double z, int64_t steps) {
  const privacy::DpEvent event{q, z, steps};
  auto spend = privacy::ComputeEpsilon(std::span(&event, 1), kDelta, privacy::AccountantKind::kRdp);
  EXPECT_TRUE(spend.ok()) << spend.status();
  return spend.ok() ? spend->epsilon : -1;
}

struct Ledger {
  std::vector<nlohmann::json> entries;
  int64_t steps = 0;
};

Ledger ReadLedger(const std::string& out) {
  Ledger l;
  l.entries = JsonLines(out + "/privacy_ledger.jsonl");
  for (const auto& e : l.entries) l.steps += e["steps"].get<int64_t>();
  return l;
}

// Epsilon over a ledger's entries, which here all have the same (q, z).
double LedgerEpsilon(const Ledger& l) {
  if (l.entries.empty()) return 0;
  return Epsilon(l.entries[0]["sampling_rate"].get<double>(),
                 l.entries[0]["noise_multiplier"].get<double>(), l.steps);
}

std::vector<std::string> Resume(std::vector<std::string> argv) {
  argv.push_back("--resume");
  return argv;
}

// ", epsilon: <value>" for train.dp_sgd.
std::string Budget(double epsilon) {
  char text[64];
  std::snprintf(text, sizeof text, ", epsilon: %.6f", epsilon);
  return text;
}

std::string Format4g(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.4g", value);
  return text;
}

bool Contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// How a session of the kill test ends.
struct Ending {
  enum Kind { kKillGroupAfterAnEpoch, kCrash, kComplete } kind;
  std::string after;  // kCrash: crash_for_testing's `after`
};

// The job is killed at several points, and resumed each time: rank 0 killing itself right after
// the ledger entry of epoch 1 (before any checkpoint: the next session starts over), the whole
// process group killed (SIGKILL) at whatever moment the session's first progress line is seen,
// rank 0 killing itself right after a metrics line (before that epoch's checkpoint), after a
// ledger entry, and after a checkpoint. Before each resume cuts metrics.jsonl back to the
// checkpoint, the test reads every line the session released: the ledger must count at least all
// their steps (the steps of a re-run epoch count again), every metrics line must report at least
// the epsilon of the steps released so far, and the final epsilon, everywhere, is the ledger's.
TEST(DatacenterPrivacy, KilledAnywhereTheLedgerCountsEveryReleasedStep) {
  const std::string dir = MakeTempDir("dc_dp_kill");
  const std::string out = dir + "/out";
  constexpr int kEpochs = 20;
  DcJob job;
  job.epochs = kEpochs;
  job.dp_sgd = kDp;
  job.checkpoint_every = 2;  // epochs after the checkpoint are re-run after a resume
  const std::vector<Ending> endings = {{Ending::kCrash, "ledger"},
                                       {Ending::kKillGroupAfterAnEpoch, ""},
                                       {Ending::kCrash, "metrics"},
                                       {Ending::kCrash, "ledger"},
                                       {Ending::kKillGroupAfterAnEpoch, ""},
                                       {Ending::kCrash, "checkpoint"},
                                       {Ending::kComplete, ""}};
  const double q = 0.05, z = 1.0;
  int64_t released = 0;    // steps that some output of some session reflected
  int64_t last_epoch = 0;  // the last epoch any metrics line showed
  std::string logs;
  for (size_t s = 0; s < endings.size(); ++s) {
    const Ending& ending = endings[s];
    DcJob session = job;
    if (ending.kind == Ending::kCrash) {
      // An epoch the session reaches (it resumes at or before last_epoch); for metrics and
      // checkpoint, one whose checkpoint is due (even), so that the kill falls between them.
      int64_t epoch = last_epoch + 1;
      if (ending.after != "ledger" && epoch % 2 != 0) ++epoch;
      session.datacenter =
          "crash_for_testing: {after: " + ending.after + ", epoch: " + std::to_string(epoch) + "}";
    }
    const std::string config = WriteJob(dir, "session-" + std::to_string(s), session);
    const std::string log = dir + "/session-" + std::to_string(s) + ".log";
    std::vector<std::string> argv = Launcher(config, out, 2);
    Process launcher(s == 0 ? argv : Resume(argv), log, /*own_group=*/true);
    if (ending.kind == Ending::kKillGroupAfterAnEpoch) {
      ASSERT_TRUE(WaitFor(
          [&] {
            for (const std::string& line : ReadLines(log)) {
              if (line.starts_with("epoch ") && Contains(line, "/20: ")) return true;
            }
            return false;
          },
          milliseconds(60000)))
          << ReadAll(log);
      launcher.KillGroup(SIGKILL);
      EXPECT_EQ(launcher.Wait(seconds(30)), 128 + SIGKILL);
    } else {
      const int code = launcher.Wait(seconds(120));
      EXPECT_EQ(code, ending.kind == Ending::kComplete ? 0 : 1) << ReadAll(log);
    }
    const std::string text = ReadAll(log);
    logs += "--- session " + std::to_string(s) + "\n" + text;
    if (s == 1) {
      EXPECT_TRUE(Contains(text, "no checkpoint at " + out +
                                     "/checkpoint.bin: starting over from "
                                     "step 0; the 20 steps the ledger records stay counted"))
          << text;
    }
    // Where this session started: the checkpoint's epoch and step, or 0.
    int64_t start_epoch = 0, start_step = 0;
    if (const size_t at = text.find("resuming after epoch "); at != std::string::npos) {
      long long epoch = 0, step = 0;
      if (std::sscanf(text.c_str() + at, "resuming after epoch %lld (step %lld)", &epoch, &step) ==
          2) {
        start_epoch = epoch;
        start_step = step;
      }
    }
    // The lines this session wrote (those after its checkpoint), and the steps they reflect.
    int64_t session_released = 0;
    for (const nlohmann::json& line : JsonLines(out + "/metrics.jsonl")) {
      if (line["epoch"].get<int64_t>() <= start_epoch) continue;
      session_released = line["steps"].get<int64_t>() - start_step;
      const int64_t released_so_far = released + session_released;
      EXPECT_GE(line["ledger_steps"].get<int64_t>(), released_so_far) << line << "\n" << logs;
      EXPECT_GE(line["epsilon"].get<double>(), Epsilon(q, z, released_so_far)) << line;
      last_epoch = std::max(last_epoch, line["epoch"].get<int64_t>());
    }
    released += session_released;
    EXPECT_GE(ReadLedger(out).steps, released) << "after session " << s << "\n" << logs;
  }

  // Every epoch was released at least once; re-runs after the kills were counted again.
  const Ledger ledger = ReadLedger(out);
  EXPECT_GE(released, kEpochs * 20);
  EXPECT_GE(ledger.steps, released);
  EXPECT_GT(ledger.steps, kEpochs * 20) << logs;
  const double epsilon = LedgerEpsilon(ledger);
  EXPECT_GT(epsilon, Epsilon(q, z, kEpochs * 20));
  const auto metrics = JsonLines(out + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), static_cast<size_t>(kEpochs)) << logs;
  EXPECT_EQ(metrics.back()["epsilon"].get<double>(), epsilon);
  EXPECT_EQ(metrics.back()["ledger_steps"].get<int64_t>(), ledger.steps);
  const auto summary = JsonFile(out + "/summary.json");
  EXPECT_EQ(summary["privacy"]["epsilon"].get<double>(), epsilon);
  EXPECT_EQ(summary["privacy"]["ledger_steps"].get<int64_t>(), ledger.steps);
  EXPECT_EQ(summary["privacy"]["steps"].get<int64_t>(), kEpochs * 20);
  const auto report = JsonFile(out + "/privacy.json");
  EXPECT_EQ(report["epsilon"].get<double>(), epsilon);
  int64_t report_steps = 0;
  for (const auto& run : report["releases"]) report_steps += run["steps"].get<int64_t>();
  EXPECT_EQ(report_steps, ledger.steps);
}

TEST(DatacenterPrivacy, ADeletedOrTruncatedLedgerIsRefusedOnResume) {
  const std::string dir = MakeTempDir("dc_dp_lost");
  const std::string out = dir + "/out";
  const Finished first =
      RunToEnd(Launcher(WriteJob(dir, "two", {.epochs = 2, .dp_sgd = kDp}), out, 2),
               dir + "/first.log", seconds(120));
  ASSERT_EQ(first.exit_code, 0) << first.log;
  const std::string ledger_path = out + "/privacy_ledger.jsonl";
  const std::vector<std::string> entries = ReadLines(ledger_path);
  ASSERT_EQ(entries.size(), 2u);
  const std::string three =
      WriteJob(dir, "three", {.epochs = 3, .timeout_s = kRefused, .dp_sgd = kDp});

  std::filesystem::remove(ledger_path);
  const Finished deleted =
      RunToEnd(Resume(Launcher(three, out, 2)), dir + "/deleted.log", seconds(60));
  EXPECT_EQ(deleted.exit_code, 1);
  std::string log = deleted.log;
  // Its mark (privacy/ledger.h) says 2 entries were appended.
  EXPECT_TRUE(Contains(log, "it is missing, and its mark")) << log;
  EXPECT_TRUE(Contains(log, "says 2 entries")) << log;
  EXPECT_TRUE(Contains(log, "restore")) << log;
  EXPECT_EQ(JsonLines(out + "/metrics.jsonl").size(), 2u) << "a refused resume changes nothing";

  WriteText(ledger_path, entries[0] + "\n");
  const Finished truncated =
      RunToEnd(Resume(Launcher(three, out, 2)), dir + "/truncated.log", seconds(60));
  EXPECT_EQ(truncated.exit_code, 1);
  log = truncated.log;
  EXPECT_TRUE(Contains(log, "it holds 1 entry")) << log;
  EXPECT_TRUE(Contains(log, "says 2 entries")) << log;
  // Deleted with its mark: the checkpoint still shows the loss.
  std::filesystem::remove(ledger_path);
  std::filesystem::remove(ledger_path + ".mark");
  const Finished unmarked =
      RunToEnd(Resume(Launcher(three, out, 2)), dir + "/unmarked.log", seconds(60));
  EXPECT_EQ(unmarked.exit_code, 1);
  log = unmarked.log;
  EXPECT_TRUE(Contains(log, "counts 0 DP-SGD steps, but")) << log;
  EXPECT_TRUE(Contains(log, "checkpoint.bin is at step 40")) << log;
  EXPECT_TRUE(Contains(log, "deleted or truncated")) << log;

  // With the ledger restored the job continues, and accounts for all 60 steps.
  WriteText(ledger_path, entries[0] + "\n" + entries[1] + "\n");
  const Finished restored =
      RunToEnd(Resume(Launcher(WriteJob(dir, "three-ok", {.epochs = 3, .dp_sgd = kDp}), out, 2)),
               dir + "/restored.log", seconds(120));
  ASSERT_EQ(restored.exit_code, 0) << restored.log;
  EXPECT_EQ(ReadLedger(out).steps, 60);
  EXPECT_EQ(JsonFile(out + "/summary.json")["privacy"]["epsilon"].get<double>(),
            Epsilon(0.05, 1.0, 60));
}

TEST(DatacenterPrivacy, ALedgerIsNeverStartedOverWithoutResume) {
  const std::string dir = MakeTempDir("dc_dp_again");
  const std::string out = dir + "/out";
  const std::string config = WriteJob(dir, "two", {.epochs = 2, .dp_sgd = kDp});
  const Finished first = RunToEnd(Launcher(config, out, 2), dir + "/first.log", seconds(120));
  ASSERT_EQ(first.exit_code, 0) << first.log;

  const Finished again = RunToEnd(
      Launcher(WriteJob(dir, "again", {.epochs = 2, .timeout_s = kRefused, .dp_sgd = kDp}), out, 2),
      dir + "/again.log", seconds(60));
  EXPECT_EQ(again.exit_code, 1);
  std::string log = again.log;
  EXPECT_TRUE(Contains(log, out + "/privacy_ledger.jsonl records 2 DP-SGD releases (40 steps)"))
      << log;
  EXPECT_TRUE(Contains(log, "--resume")) << log;
  EXPECT_TRUE(Contains(log, "new output directory")) << log;
  EXPECT_EQ(JsonLines(out + "/metrics.jsonl").size(), 2u) << "the refused run removed outputs";
  EXPECT_EQ(ReadLedger(out).steps, 40);

  // Nor is a run without DP-SGD let loose on the directory.
  const Finished plain =
      RunToEnd(Launcher(WriteJob(dir, "plain", {.epochs = 1, .timeout_s = kRefused}), out, 2),
               dir + "/plain.log", seconds(60));
  EXPECT_EQ(plain.exit_code, 1);
  log = plain.log;
  EXPECT_TRUE(Contains(log, "records DP-SGD releases of an earlier job")) << log;
  EXPECT_EQ(JsonLines(out + "/metrics.jsonl").size(), 2u);
}

// The budget covers every session: steps released before a kill and run again after the resume
// count twice, so a job whose plan fits can be refused on resume.
TEST(DatacenterPrivacy, TheBudgetCountsEarlierSessions) {
  const std::string dir = MakeTempDir("dc_dp_budget");
  const std::string out = dir + "/out";
  const double eps60 = Epsilon(0.05, 1.0, 60), eps80 = Epsilon(0.05, 1.0, 80);
  const std::string budget = Budget((eps60 + eps80) / 2);
  // Killed after epoch 2's metrics line, before its checkpoint: 40 steps released, checkpoint
  // at step 20.
  const Finished first = RunToEnd(Launcher(WriteJob(dir, "crash",
                                                    {.epochs = 3,
                                                     .dp_sgd = kDp + budget,
                                                     .datacenter = "crash_for_testing: {after: "
                                                                   "metrics, epoch: 2}"}),
                                           out, 2),
                                  dir + "/first.log", seconds(120));
  EXPECT_EQ(first.exit_code, 1) << first.log;
  ASSERT_EQ(JsonLines(out + "/metrics.jsonl").size(), 2u) << ReadAll(dir + "/first.log");
  ASSERT_EQ(ReadLedger(out).steps, 40);

  // 40 recorded + 40 still to run = 80 steps, over the budget that 60 fit in.
  const std::string three =
      WriteJob(dir, "three", {.epochs = 3, .timeout_s = kRefused, .dp_sgd = kDp + budget});
  const Finished refused =
      RunToEnd(Resume(Launcher(three, out, 2)), dir + "/refused.log", seconds(60));
  EXPECT_EQ(refused.exit_code, 1);
  const std::string log = refused.log;
  EXPECT_TRUE(Contains(log, "records 40 steps")) << log;
  EXPECT_TRUE(Contains(log, "40 of its 60 steps left")) << log;
  EXPECT_TRUE(Contains(log, "together epsilon " + Format4g(eps80))) << log;
  EXPECT_TRUE(Contains(log, "over the budget")) << log;
  EXPECT_EQ(ReadLedger(out).steps, 40);

  // With room for 80 steps it finishes, and reports the epsilon of 80 steps, not of 60.
  const std::string room = Budget(eps80 + 0.01);
  const Finished resumed =
      RunToEnd(Resume(Launcher(WriteJob(dir, "room", {.epochs = 3, .dp_sgd = kDp + room}), out, 2)),
               dir + "/resumed.log", seconds(120));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.log;
  EXPECT_EQ(ReadLedger(out).steps, 80);
  const auto summary = JsonFile(out + "/summary.json");
  EXPECT_EQ(summary["privacy"]["epsilon"].get<double>(), eps80);
  EXPECT_EQ(summary["privacy"]["steps"].get<int64_t>(), 60);
}

TEST(DatacenterPrivacy, ZeroNoiseIsReportedAsNotPrivateEverywhere) {
  const std::string dir = MakeTempDir("dc_dp_zero");
  const std::string out = dir + "/out";
  const Finished run = RunToEnd(Launcher(WriteJob(dir, "zero",
                                                  {.epochs = 2,
                                                   .dp_sgd = "noise_multiplier: 0, clip_norm: 1.0, "
                                                             "expected_batch_size: 60"}),
                                         out, 2),
                                dir + "/run.log", seconds(120));
  ASSERT_EQ(run.exit_code, 0) << run.log;
  const auto metrics = JsonLines(out + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 2u);
  for (const auto& m : metrics) {
    EXPECT_TRUE(m["epsilon"].is_null()) << m;
    EXPECT_EQ(m["private"], false) << m;
    EXPECT_TRUE(m.contains("nominal_epsilon")) << m;  // +inf, written as null
  }
  const auto summary = JsonFile(out + "/summary.json");
  EXPECT_TRUE(summary["privacy"]["epsilon"].is_null()) << summary;
  EXPECT_EQ(summary["privacy"]["private"], false);
  EXPECT_EQ(summary["privacy"]["noise_source"], "none (NOT PRIVATE)");
  const auto report = JsonFile(out + "/privacy.json");
  EXPECT_TRUE(report["epsilon"].is_null()) << report;
  EXPECT_EQ(report["private"], false);
  ASSERT_FALSE(report["not_private_because"].empty());
  EXPECT_TRUE(Contains(report["not_private_because"][0].get<std::string>(), "noise_multiplier 0"));
  for (const auto& e : ReadLedger(out).entries) EXPECT_EQ(e["noise"], "none (NOT PRIVATE)");
  // The terminal: the plan, every epoch and the end say NOT PRIVATE, and no epsilon is a number.
  const std::string log = ReadAll(dir + "/run.log");
  for (size_t at = log.find("epsilon "); at != std::string::npos;
       at = log.find("epsilon ", at + 1)) {
    EXPECT_FALSE(std::isdigit(static_cast<unsigned char>(log[at + 8]))) << log;
  }
  int epochs = 0;
  for (const std::string& line : ReadLines(dir + "/run.log")) {
    if (line.starts_with("epoch ") || line.starts_with("done:") ||
        line.starts_with("DP-SGD across ranks")) {
      EXPECT_TRUE(Contains(line, "epsilon: NOT PRIVATE")) << line;
      epochs += line.starts_with("epoch ") ? 1 : 0;
    }
  }
  EXPECT_EQ(epochs, 2) << log;
}

// Under DP-SGD metrics.jsonl holds only public or DP-protected values; the training loss and
// accuracy (private data, no noise), counts and timings are the operator's. Without DP-SGD the
// files are as they always were.
TEST(DatacenterPrivacy, PublicAndOperatorOnlyOutputsAreApart) {
  if (!FashionMnistInstalled()) {
    GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
  }
  const std::string dir = MakeTempDir("dc_dp_split");
  const std::string out = dir + "/out";
  const Finished run =
      RunToEnd(Launcher(WriteJob(dir, "dp",
                                 {.epochs = 2,
                                  .dp_sgd = "noise_multiplier: 1.0, clip_norm: 1.0, "
                                            "expected_batch_size: 50",
                                  .evaluate = true}),
                        out, 2),
               dir + "/run.log", seconds(120));
  ASSERT_EQ(run.exit_code, 0) << run.log;
  const auto metrics = JsonLines(out + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 2u);
  for (const auto& m : metrics) {
    std::vector<std::string> keys;
    for (const auto& [key, value] : m.items()) keys.push_back(key);
    EXPECT_EQ(keys, (std::vector<std::string>{"delta", "epoch", "epsilon", "ledger_steps",
                                              "private", "steps", "test_accuracy", "test_loss"}))
        << m;
  }
  const auto op = JsonLines(out + "/operator_metrics.jsonl");
  ASSERT_EQ(op.size(), 2u);
  for (const auto& m : op) {
    for (const char* key : {"train_loss", "train_accuracy", "seconds", "epoch_seconds"}) {
      EXPECT_TRUE(m.contains(key)) << key << " in " << m;
    }
    EXPECT_EQ(m["dp_protected"], false);
  }
  const auto summary = JsonFile(out + "/summary.json");
  for (const char* key :
       {"train_loss", "train_accuracy", "seconds_this_session", "reduce_seconds", "wait_seconds"}) {
    EXPECT_FALSE(summary.contains(key)) << key << " in " << summary;
    EXPECT_TRUE(summary["operator"].contains(key)) << key << " in " << summary;
  }
  EXPECT_EQ(summary["operator"]["note"], "operator-only: not DP-protected");
  EXPECT_EQ(summary["final_test_accuracy"], metrics[1]["test_accuracy"]);
  int labelled = 0;
  for (const std::string& line : ReadLines(dir + "/run.log")) {
    if (!line.starts_with("epoch ")) continue;
    EXPECT_TRUE(Contains(line, "(not private) train loss")) << line;
    EXPECT_LT(line.find("test loss"), line.find("(not private)")) << line;
    ++labelled;
  }
  EXPECT_EQ(labelled, 2);

  // Without DP-SGD: train_loss in metrics.jsonl, no operator file, no ledger, no report.
  const std::string plain = dir + "/plain";
  const Finished run2 =
      RunToEnd(Launcher(WriteJob(dir, "plain", {.epochs = 1, .evaluate = true}), plain, 2),
               dir + "/plain.log", seconds(120));
  ASSERT_EQ(run2.exit_code, 0) << run2.log;
  const auto plain_metrics = JsonLines(plain + "/metrics.jsonl");
  ASSERT_EQ(plain_metrics.size(), 1u);
  EXPECT_TRUE(plain_metrics[0].contains("train_loss"));
  EXPECT_TRUE(plain_metrics[0].contains("test_accuracy"));
  EXPECT_TRUE(plain_metrics[0].contains("seconds"));
  EXPECT_TRUE(JsonFile(plain + "/summary.json").contains("train_loss"));
  EXPECT_FALSE(JsonFile(plain + "/summary.json").contains("operator"));
  for (const char* file : {"operator_metrics.jsonl", "privacy_ledger.jsonl", "privacy.json"}) {
    EXPECT_FALSE(std::filesystem::exists(plain + "/" + file)) << file;
  }
}

TEST(DatacenterPrivacy, PrivacyJsonDescribesTheGuaranteeFromTheLedger) {
  const std::string dir = MakeTempDir("dc_dp_report");
  const std::string out = dir + "/out";
  const std::string dp = std::string(kDp) + ", epsilon: 10";
  const Finished first =
      RunToEnd(Launcher(WriteJob(dir, "two", {.epochs = 2, .dp_sgd = dp}), out, 2),
               dir + "/first.log", seconds(120));
  ASSERT_EQ(first.exit_code, 0) << first.log;
  auto report = JsonFile(out + "/privacy.json");
  EXPECT_EQ(report["job"], "dc-it");
  EXPECT_EQ(report["scope"], "datacenter");
  EXPECT_EQ(report["private"], true);
  EXPECT_EQ(report["epsilon"].get<double>(), Epsilon(0.05, 1.0, 40));
  EXPECT_EQ(report["epsilon"], JsonFile(out + "/summary.json")["privacy"]["epsilon"]);
  EXPECT_EQ(report["delta"].get<double>(), kDelta);
  EXPECT_EQ(report["budget_epsilon"].get<double>(), 10.0);
  EXPECT_EQ(report["unit_of_privacy"], "example");
  EXPECT_EQ(report["adjacency"], "add_remove");
  EXPECT_EQ(report["accountant"], "rdp");
  EXPECT_EQ(report["noise_source"], "os-csprng");
  EXPECT_EQ(report["ledger"], "privacy_ledger.jsonl");
  const std::string mechanism = report["mechanism"];
  EXPECT_TRUE(Contains(mechanism, "across 2 ranks")) << mechanism;
  EXPECT_TRUE(Contains(mechanism, "exact discrete Gaussian")) << mechanism;
  EXPECT_TRUE(Contains(report["sampling"].get<std::string>(), "60 / 1200")) << report["sampling"];
  ASSERT_EQ(report["releases"].size(), 1u);
  const auto& run = report["releases"][0];
  EXPECT_EQ(run["rounds"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(run["releases"], 2);
  EXPECT_EQ(run["steps"], 40);
  EXPECT_EQ(run["sampling_rate"].get<double>(), 0.05);
  EXPECT_EQ(run["noise_multiplier"].get<double>(), 1.0);
  EXPECT_EQ(run["clip_norm"].get<double>(), 1.0);
  EXPECT_GE(report["assumptions"].size(), 5u);
  EXPECT_TRUE(Contains(report["not_covered"].dump(), "operator_metrics.jsonl"));

  // A second session adds its releases; the report still counts them all.
  const Finished more =
      RunToEnd(Resume(Launcher(WriteJob(dir, "three", {.epochs = 3, .dp_sgd = dp}), out, 2)),
               dir + "/more.log", seconds(120));
  ASSERT_EQ(more.exit_code, 0) << more.log;
  report = JsonFile(out + "/privacy.json");
  ASSERT_EQ(report["releases"].size(), 1u);
  EXPECT_EQ(report["releases"][0]["steps"], 60);
  EXPECT_EQ(report["releases"][0]["rounds"], nlohmann::json::array({1, 3}));
  EXPECT_EQ(report["epsilon"].get<double>(), Epsilon(0.05, 1.0, 60));
}

}  // namespace
}  // namespace huddle::testing
