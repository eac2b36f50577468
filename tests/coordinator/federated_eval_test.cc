// Federated evaluation (coordinator/federated_eval.cc): the clients evaluate the global model
// between rounds. Answers are averaged by their (capped) example counts; hostile answers are
// refused or bounded; an evaluation without answers is reported, not fatal; the training rounds
// are bitwise those of a job without evaluation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "coordinator/checkpoint.h"
#include "coordinator/coordinator.h"
#include "tests/coordinator/fake_federation.h"
#include "tests/coordinator/run_job.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tensors.h"

namespace huddle::coordinator {
namespace {

using testing::Behaviour;
using testing::FakeFederation;
using testing::ManualClock;
using testing::SyntheticClient;

// What a client reports for its evaluation.
struct Report {
  uint64_t examples = 100;
  double loss = 0.5;
  double accuracy = 0.5;
};

// The EvaluateResult answering `instruction` with `r` (its nonce, round and version unless edited).
wire::Message Answer(const std::string& peer, const wire::Message& instruction, const Report& r) {
  const auto& e = std::get<wire::EvaluateInstruction>(instruction.body);
  return wire::MakeMessage(
      wire::EvaluateResult{r.examples, r.loss, r.accuracy, e.model_version, e.nonce},
      instruction.round, peer);
}

class FederatedEvalTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options(int64_t rounds, int64_t cohort) {
    CoordinatorOptions o;
    o.job_name = "fedeval";
    o.seed = 3;
    o.rounds = rounds;
    o.model = models::MlpSpec{6, {5}, 3};
    o.cohort.size = cohort;
    o.min_clients = cohort;
    o.upload_slots = 2;
    o.client_timeout_ms = 0;
    o.eval_mode = CoordinatorOptions::EvalMode::kFederated;
    o.eval_every = 1;
    o.federated_eval.clients = 100;
    o.federated_eval.deadline_ms = 20'000;
    return o;
  }

  std::vector<SyntheticClient> Clients(int n) {
    std::vector<SyntheticClient> out;
    for (int i = 0; i < n; ++i) out.push_back({"c" + std::to_string(i), Behaviour::kHonest, 100});
    return out;
  }

  // Runs a job whose clients answer evaluations with `answer`; metrics of every round.
  Status Run(const CoordinatorOptions& o, std::vector<SyntheticClient> clients,
             FakeFederation::EvaluateAnswer answer, std::vector<RoundMetrics>* metrics = nullptr,
             uint64_t delivery_seed = 1, bool authenticated = false) {
    job_ = testing::RunJob(o, {.clients = std::move(clients),
                               .delivery_seed = delivery_seed,
                               .authenticated = authenticated,
                               .before =
                                   [this, &answer](FakeFederation& f) {
                                     fed_ = &f;  // answers may use it while the job runs
                                     f.set_evaluate_answer(std::move(answer));
                                   },
                               .clock = &clock_});
    if (metrics) metrics->insert(metrics->end(), job_.metrics.begin(), job_.metrics.end());
    return job_.status;
  }

  // Every client answers with the report `reports` holds for it (a default one otherwise).
  static FakeFederation::EvaluateAnswer Reports(std::map<std::string, Report> reports) {
    return [reports](const std::string& peer, const wire::Message& instruction) {
      auto it = reports.find(peer);
      return std::vector<wire::Message>{
          Answer(peer, instruction, it == reports.end() ? Report{} : it->second)};
    };
  }

  // A fresh directory (not yet created: the coordinator makes it), removed after the test.
  std::string TempDir(const std::string& name) { return dirs_.Make("fedeval_" + name, false); }
  testing::TempDirs dirs_;

  ManualClock clock_;
  testing::JobRun job_;                      // what Run's last job produced
  FakeFederation* fed_ = nullptr;            // the federation of the test's current job
  std::unique_ptr<FakeFederation> own_fed_;  // that of a test that runs its own coordinator
};

TEST_F(FederatedEvalTest, AnswersAreAveragedByTheirExampleCounts) {
  CoordinatorOptions o = Options(1, 4);
  o.out_dir = TempDir("average");
  const std::map<std::string, Report> reports = {{"c0", {100, 0.5, 0.80}},
                                                 {"c1", {200, 0.25, 0.90}},
                                                 {"c2", {300, 1.0, 0.60}},
                                                 {"c3", {400, 0.75, 0.70}}};
  std::vector<RoundMetrics> metrics;
  ASSERT_TRUE(Run(o, Clients(4), Reports(reports), &metrics).ok());
  ASSERT_EQ(metrics.size(), 1u);
  const RoundMetrics& m = metrics[0];
  ASSERT_TRUE(m.federated_eval.has_value());
  EXPECT_EQ(m.federated_eval->asked, 4);
  EXPECT_EQ(m.federated_eval->answered, 4);
  EXPECT_EQ(m.federated_eval->rejected, 0);
  EXPECT_EQ(m.federated_eval->weight, 1000);
  EXPECT_EQ(m.federated_eval->weight_capped, 0);  // cap: 4 x the lower median 200
  ASSERT_TRUE(m.test_accuracy && m.test_loss);
  EXPECT_NEAR(*m.test_accuracy, (80 + 180 + 180 + 280) / 1000.0, 1e-12);
  EXPECT_NEAR(*m.test_loss, (50 + 50 + 300 + 300) / 1000.0, 1e-12);
  EXPECT_EQ(job_.summary.final_test_accuracy, m.test_accuracy);
  EXPECT_EQ(job_.summary.best_round, 1u);
  EXPECT_FALSE(job_.summary.final_evaluation_unanswered);

  // Where server-side evaluation writes its values, marked as federated.
  const auto line = nlohmann::json::parse(ReadFile(o.out_dir + "/metrics.jsonl").value());
  EXPECT_NEAR(line["test_accuracy"].get<double>(), 0.72, 1e-12);
  EXPECT_EQ(line["evaluation"]["mode"], "federated");
  EXPECT_EQ(line["evaluation"]["clients_answered"], 4);
  EXPECT_NE(m.ProgressLine().find("test acc 0.7200 loss 0.7000 (federated, 4/4 clients)"),
            std::string::npos)
      << m.ProgressLine();
  const auto summary = nlohmann::json::parse(ReadFile(o.out_dir + "/summary.json").value());
  EXPECT_NEAR(summary["final_test_accuracy"].get<double>(), 0.72, 1e-12);
  EXPECT_EQ(summary["evaluation"]["mode"], "federated");
  EXPECT_EQ(summary["evaluation"]["evaluations"], 1);
  EXPECT_EQ(summary["evaluation"]["without_answers"], 0);
  std::filesystem::remove_all(o.out_dir);
}

TEST_F(FederatedEvalTest, RunsEveryNRoundsAndAfterTheLastOnTheRoundsModel) {
  CoordinatorOptions o = Options(5, 3);
  o.eval_every = 2;
  std::vector<RoundMetrics> metrics;
  ASSERT_TRUE(Run(o, Clients(3), Reports({}), &metrics).ok());
  ASSERT_EQ(metrics.size(), 5u);
  std::vector<uint64_t> evaluated;
  for (const RoundMetrics& m : metrics) {
    if (m.federated_eval) evaluated.push_back(m.round);
    EXPECT_EQ(m.test_accuracy.has_value(), m.federated_eval.has_value()) << m.round;
  }
  EXPECT_EQ(evaluated, (std::vector<uint64_t>{2, 4, 5}));
  ASSERT_EQ(fed_->evaluations().size(), 9u);  // 3 clients x 3 evaluations
  const auto& last = fed_->evaluations().back();
  EXPECT_EQ(last.round, 5u);
  EXPECT_EQ(last.model_version, 5u);
  EXPECT_TRUE(testing::BitwiseEqual(last.model, job_.model)) << "the instruction carries the model";
  std::set<std::string> nonces;
  for (const auto& e : fed_->evaluations()) nonces.insert(e.nonce);
  EXPECT_EQ(nonces.size(), 9u) << "a fresh nonce per instruction";
}

TEST_F(FederatedEvalTest, AsksUpToKLiveClientsSampledFromTheJobSeed) {
  CoordinatorOptions o = Options(2, 6);
  o.federated_eval.clients = 3;
  ASSERT_TRUE(Run(o, Clients(6), Reports({})).ok());
  std::vector<std::vector<std::string>> asked(3);
  for (const auto& e : fed_->evaluations()) asked[e.round].push_back(e.peer);
  EXPECT_EQ(asked[1].size(), 3u);
  EXPECT_EQ(asked[2].size(), 3u);
  // The same under another arrival order: the sample depends on the seed and the round alone.
  ASSERT_TRUE(Run(o, Clients(6), Reports({}), nullptr, /*delivery_seed=*/9).ok());
  std::vector<std::vector<std::string>> again(3);
  for (const auto& e : fed_->evaluations()) again[e.round].push_back(e.peer);
  EXPECT_EQ(again, asked);
}

TEST_F(FederatedEvalTest, HostileAnswersAreRefusedOrBounded) {
  CoordinatorOptions o = Options(1, 9);
  o.aggregation.max_weight = 1'000'000;
  FakeFederation* fed = nullptr;
  auto answer = [&fed](const std::string& peer,
                       const wire::Message& in) -> std::vector<wire::Message> {
    const Report honest{100, 0.5, 0.8};
    if (peer == "c0" || peer == "c1") return {Answer(peer, in, honest)};
    if (peer == "c2") return {Answer(peer, in, {100, 0.5, 7.0})};  // accuracy 7
    if (peer == "c3") {
      return {Answer(peer, in, {100, std::numeric_limits<double>::quiet_NaN(), 0.8})};
    }
    if (peer == "c4") {  // a nonce it was never sent
      wire::Message m = Answer(peer, in, {100, 0.0, 1.0});
      std::get<wire::EvaluateResult>(m.body).nonce = std::string(wire::kNonceBytes, 'x');
      return {m};
    }
    if (peer == "c5") return {Answer(peer, in, honest), Answer(peer, in, honest)};  // twice
    if (peer == "c6") return {Answer(peer, in, {2'000'000, 0.0, 1.0})};  // past max_examples
    if (peer == "c7") return {Answer(peer, in, {900'000, 0.0, 1.0})};    // within it: capped
    // c8: bytes that do not decode; it fails for the evaluation at once.
    fed->InjectGarbage(peer);
    return {};
  };
  std::vector<RoundMetrics> metrics;
  own_fed_ = std::make_unique<FakeFederation>(Clients(9), models::Layout(o.model), &clock_, 2);
  fed_ = own_fed_.get();
  fed = fed_;
  fed_->set_evaluate_answer(answer);
  Coordinator coord(o, fed_, &clock_, Evaluator{},
                    [&](const RoundMetrics& m) { metrics.push_back(m); });
  ASSERT_TRUE(coord.Run().ok());
  ASSERT_EQ(metrics.size(), 1u);
  const RoundMetrics::FederatedEval& f = *metrics[0].federated_eval;
  EXPECT_EQ(f.asked, 9);
  // c0, c1, c5 (first answer), c7 (capped): the rest refused.
  EXPECT_EQ(f.answered, 4);
  EXPECT_EQ(f.rejected, 6);  // c2, c3, c4, c5's second, c6, c8's garbage
  EXPECT_EQ(f.weight_capped, 1);
  EXPECT_EQ(f.weight, 100 + 100 + 100 + 400);  // c7 capped at 4 x the lower median (100)
  // The liar c7 takes 400/700 of the weight, not 900000/900300.
  EXPECT_NEAR(*metrics[0].test_accuracy, (300 * 0.8 + 400 * 1.0) / 700.0, 1e-12);
  EXPECT_NEAR(*metrics[0].test_loss, (300 * 0.5) / 700.0, 1e-12);
  for (const char* liar : {"c2", "c3", "c4", "c5", "c6"}) {
    EXPECT_EQ(fed_->ErrorsSent(liar, wire::ErrorCode::kRejected), 1) << liar;
  }
  EXPECT_NE(fed_->LastErrorText("c2").find("accuracy 7 is outside [0, 1]"), std::string::npos);
  EXPECT_NE(fed_->LastErrorText("c3").find("loss nan is not a finite value >= 0"),
            std::string::npos)
      << fed_->LastErrorText("c3");
  EXPECT_NE(fed_->LastErrorText("c4").find("nonce does not match"), std::string::npos);
  EXPECT_NE(fed_->LastErrorText("c5").find("has no pending evaluation"), std::string::npos);
  EXPECT_NE(fed_->LastErrorText("c6").find("num_examples 2000000 is outside [1, 1000000]"),
            std::string::npos);
  EXPECT_TRUE(metrics[0].updated) << "the round itself is untouched";
}

// Issue 32: one answer with loss DBL_MAX overflowed the weighted mean to inf, and the checkpoint
// written with it was refused by the coordinator itself on --resume. Now every value is bounded on
// receipt (refused, naming the client and the value), the means stay finite, and the job resumes.
TEST_F(FederatedEvalTest, ExtremeAnswersAreRefusedAndTheJobResumes) {
  constexpr double kMax = std::numeric_limits<double>::max();
  CoordinatorOptions o = Options(1, 8);
  o.out_dir = TempDir("extreme");
  o.aggregation.max_weight = int64_t{1} << 40;  // as large as the aggregator's sum allows
  const auto answers = Reports({
      {"c0", {100, 0.5, 0.8}},
      {"c1", {100, 0.7, 0.6}},
      {"c2", {100, kMax, 0.5}},
      {"c3", {100, -kMax, 0.5}},
      {"c4", {100, std::numeric_limits<double>::infinity(), 0.5}},
      {"c5", {100, std::numeric_limits<double>::quiet_NaN(), 0.5}},
      {"c6", {UINT64_MAX, 0.5, 0.5}},
      {"c7", {uint64_t{1} << 40, 1e100, 1.0}},  // at every bound: accepted, its weight capped
  });
  std::vector<RoundMetrics> metrics;
  const Status first = Run(o, Clients(8), answers, &metrics);
  ASSERT_TRUE(first.ok()) << first;
  ASSERT_EQ(metrics.size(), 1u);
  const RoundMetrics::FederatedEval& f = *metrics[0].federated_eval;
  EXPECT_EQ(f.answered, 3);
  EXPECT_EQ(f.rejected, 5);
  EXPECT_EQ(f.weight, 100 + 100 + 400);
  ASSERT_TRUE(metrics[0].test_loss.has_value());
  EXPECT_TRUE(std::isfinite(*metrics[0].test_loss)) << *metrics[0].test_loss;
  EXPECT_NEAR(*metrics[0].test_loss / 1e100, 400.0 / 600, 1e-9);
  EXPECT_NEAR(*metrics[0].test_accuracy, (100 * 0.8 + 100 * 0.6 + 400 * 1.0) / 600, 1e-12);
  for (const char* liar : {"c2", "c3", "c4", "c5", "c6"}) {
    EXPECT_EQ(fed_->ErrorsSent(liar, wire::ErrorCode::kRejected), 1) << liar;
  }
  EXPECT_NE(fed_->LastErrorText("c2").find("loss 1.79769e+308 exceeds 1e+100"), std::string::npos)
      << fed_->LastErrorText("c2");
  EXPECT_NE(fed_->LastErrorText("c6").find("num_examples 18446744073709551615 is outside"),
            std::string::npos)
      << fed_->LastErrorText("c6");

  // The checkpoint holds the round's record and reads back; the job resumes from it.
  auto ckpt = ReadCheckpoint(o.out_dir + "/checkpoint.bin");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_DOUBLE_EQ(ckpt->final_test_loss, *metrics[0].test_loss);
  CoordinatorOptions resumed = o;
  resumed.rounds = 2;
  resumed.resume = true;
  metrics.clear();
  const Status st = Run(resumed, Clients(8), answers, &metrics);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].round, 2u);
}

TEST_F(FederatedEvalTest, WrongRoundOrVersionAndLateAnswersAreRefused) {
  CoordinatorOptions o = Options(2, 3);
  std::vector<wire::Message> late;
  auto answer = [&](const std::string& peer,
                    const wire::Message& in) -> std::vector<wire::Message> {
    wire::Message m = Answer(peer, in, {100, 0.5, 0.5});
    if (peer == "c1") m.round += 1;
    if (peer == "c2") {
      std::get<wire::EvaluateResult>(m.body).model_version += 7;
      late.push_back(Answer(peer, in, {100, 0.5, 0.5}));  // kept for later: a straggler
    }
    return {m};
  };
  std::vector<RoundMetrics> metrics;
  own_fed_ = std::make_unique<FakeFederation>(Clients(3), models::Layout(o.model), &clock_, 1);
  fed_ = own_fed_.get();
  fed_->set_evaluate_answer(answer);
  Coordinator coord(o, fed_, &clock_, Evaluator{}, [&](const RoundMetrics& m) {
    metrics.push_back(m);
    // Round 1's evaluation is over: its straggling answer arrives during round 2.
    if (m.round == 1) fed_->Inject("c2", late.front());
  });
  ASSERT_TRUE(coord.Run().ok());
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_EQ(metrics[0].federated_eval->answered, 1);  // c0
  EXPECT_EQ(metrics[0].federated_eval->rejected, 1);  // c2's version
  EXPECT_NE(fed_->LastErrorText("c2").find("evaluation is of model version 9; version 2 was sent"),
            std::string::npos)
      << fed_->LastErrorText("c2");
  // c1's answers name a model not being evaluated (each round); c2's straggler from round 1
  // arrives in round 2.
  EXPECT_EQ(metrics[0].stale, 1);
  EXPECT_EQ(metrics[1].stale, 2);
  EXPECT_EQ(fed_->ErrorsSent("c1", wire::ErrorCode::kWrongRound), 2);
  EXPECT_EQ(fed_->ErrorsSent("c2", wire::ErrorCode::kWrongRound), 1);
}

TEST_F(FederatedEvalTest, ClientsThatCannotEvaluateDeclineWithAnError) {
  CoordinatorOptions o = Options(1, 3);
  auto answer = [](const std::string& peer, const wire::Message& in) {
    if (peer == "c0") return std::vector<wire::Message>{Answer(peer, in, {50, 0.3, 0.9})};
    return std::vector<wire::Message>{wire::MakeError(
        wire::ErrorCode::kRejected, "this client's trainer cannot evaluate", in.round)};
  };
  std::vector<RoundMetrics> metrics;
  ASSERT_TRUE(Run(o, Clients(3), answer, &metrics).ok());
  const RoundMetrics::FederatedEval& f = *metrics[0].federated_eval;
  EXPECT_EQ(f.answered, 1);
  EXPECT_EQ(f.declined, 2);
  EXPECT_NEAR(*metrics[0].test_accuracy, 0.9, 1e-12);
  // The errors were the evaluation's: the round's counts are untouched.
  EXPECT_EQ(metrics[0].declined, 0);
  EXPECT_EQ(metrics[0].rejected, 0);
}

TEST_F(FederatedEvalTest, NoAnswersIsAWarningAndTheSummarySaysSo) {
  CoordinatorOptions o = Options(2, 3);
  o.out_dir = TempDir("silent");
  std::vector<RoundMetrics> metrics;
  const int64_t start = clock_.NowMs();
  ASSERT_TRUE(Run(o, Clients(3), /*answer=*/{}, &metrics).ok()) << "the job trained: it succeeds";
  ASSERT_EQ(metrics.size(), 2u);
  for (const RoundMetrics& m : metrics) {
    ASSERT_TRUE(m.federated_eval.has_value());
    EXPECT_EQ(m.federated_eval->asked, 3);
    EXPECT_EQ(m.federated_eval->answered, 0);
    EXPECT_FALSE(m.test_accuracy.has_value());
    EXPECT_NE(m.ProgressLine().find("federated evaluation: no answers (3 clients asked)"),
              std::string::npos)
        << m.ProgressLine();
    EXPECT_TRUE(m.updated);
  }
  // Each evaluation waited for its deadline, and no longer.
  EXPECT_GE(clock_.NowMs() - start, 2 * o.federated_eval.deadline_ms);
  EXPECT_LT(clock_.NowMs() - start, 2 * o.federated_eval.deadline_ms + 5'000);
  const JobSummary& s = job_.summary;
  EXPECT_EQ(s.federated_evaluations, 2);
  EXPECT_EQ(s.evaluations_without_answers, 2);
  EXPECT_TRUE(s.final_evaluation_unanswered);
  EXPECT_FALSE(s.final_test_accuracy.has_value());
  const auto summary = nlohmann::json::parse(ReadFile(o.out_dir + "/summary.json").value());
  EXPECT_TRUE(summary["final_test_accuracy"].is_null());
  EXPECT_EQ(summary["evaluation"]["without_answers"], 2);
  EXPECT_NE(summary["evaluation"]["final"].get<std::string>().find("no answers"),
            std::string::npos);
  EXPECT_FALSE(summary.contains("failed"));
  std::filesystem::remove_all(o.out_dir);
}

TEST_F(FederatedEvalTest, TrainingRoundsAreThoseOfAJobWithoutEvaluation) {
  // Cohorts of 3 of 4 clients: sampling draws from the job seed's stream every round.
  CoordinatorOptions plain = Options(4, 3);
  plain.eval_every = 0;
  std::vector<RoundMetrics> reference_metrics;
  ASSERT_TRUE(Run(plain, Clients(4), {}, &reference_metrics).ok());
  const TensorList reference = job_.model;

  // Evaluations every round, some of them hostile or silent.
  CoordinatorOptions evaluated = Options(4, 3);
  auto answer = [](const std::string& peer, const wire::Message& in) {
    if (peer == "c1") return std::vector<wire::Message>{};
    if (peer == "c2") return std::vector<wire::Message>{Answer(peer, in, {5, -1.0, 2.0})};
    return std::vector<wire::Message>{Answer(peer, in, {100, 0.4, 0.6})};
  };
  std::vector<RoundMetrics> metrics;
  ASSERT_TRUE(Run(evaluated, Clients(4), answer, &metrics).ok());
  EXPECT_TRUE(testing::BitwiseEqual(job_.model, reference));
  ASSERT_EQ(metrics.size(), reference_metrics.size());
  for (size_t r = 0; r < metrics.size(); ++r) {
    EXPECT_EQ(metrics[r].results, reference_metrics[r].results);
    EXPECT_EQ(metrics[r].clients_sampled, reference_metrics[r].clients_sampled);
    EXPECT_EQ(metrics[r].rejected, 0);
    EXPECT_EQ(metrics[r].federated_eval->answered, 2);
    EXPECT_EQ(metrics[r].federated_eval->rejected, 1);
  }
}

// A client whose key is revoked while its evaluation is pending leaves the federation: its
// evaluation fails at once (the coordinator looked it up among the clients and threw), the others'
// answers count, and the next round goes on without it.
TEST_F(FederatedEvalTest, AClientRevokedWhileEvaluatingFailsItsEvaluationAndTheJobGoesOn) {
  CoordinatorOptions o = Options(2, 3);
  o.min_clients = 3;
  o.client_timeout_ms = 60'000;
  auto answer = [this](const std::string& peer, const wire::Message& in) {
    if (peer != "c2") return std::vector<wire::Message>{Answer(peer, in, {100, 0.4, 0.6})};
    // c2 is revoked before it answers; the transport reports it, and once more for a message of
    // the revoked connection still read.
    for (int i = 0; i < 2; ++i) {
      fed_->InjectDecodeError(
          peer, absl::PermissionDeniedError(
                    "the key of client 'c2' was removed from the allow-list (revoked)"));
    }
    return std::vector<wire::Message>{};
  };
  std::vector<RoundMetrics> metrics;
  Status st = Run(o, Clients(4), answer, &metrics, /*delivery_seed=*/1, /*authenticated=*/true);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics.size(), 2u);
  ASSERT_TRUE(metrics[0].federated_eval.has_value());
  const bool c2_asked_first = std::any_of(
      fed_->evaluations().begin(), fed_->evaluations().end(),
      [](const FakeFederation::SeenEvaluate& e) { return e.round == 1 && e.peer == "c2"; });
  ASSERT_TRUE(c2_asked_first) << "c2 must be asked to evaluate for the revocation to matter";
  EXPECT_EQ(metrics[0].federated_eval->answered, metrics[0].federated_eval->asked - 1);
  for (const FakeFederation::SeenFit& fit : fed_->fits()) {
    EXPECT_FALSE(fit.round == 2 && fit.peer == "c2") << "a revoked client was sampled";
  }
  EXPECT_EQ(metrics[1].results, 3);
}

TEST_F(FederatedEvalTest, ARefusedConfigurationDoesNotStart) {
  CoordinatorOptions dp = Options(1, 2);
  dp.privacy.mode = privacy::PrivacyMode::kCentral;
  Status st = Run(dp, Clients(2), {});
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("without noise"), absl::string_view::npos) << st;

  CoordinatorOptions zero = Options(1, 2);
  zero.federated_eval.clients = 0;
  st = Run(zero, Clients(2), {});
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
}

}  // namespace
}  // namespace huddle::coordinator
