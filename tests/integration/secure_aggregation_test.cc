// Secure aggregation end to end, in one process: the real coordinator and real client agents over
// the in-process transport, each agent driving a trainer whose update is known. The global model
// moves by the survivors' (weighted) mean update, to within the quantization step, whoever drops
// at whichever stage; below the minimum nothing is released; a hostile member's messages are
// refused without stopping the others.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/agent.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "transport/inproc_transport.h"

namespace huddle {
namespace {

// Training adds `shift` to every value of the two-tensor external model.
class ShiftTrainer final : public client::Trainer {
 public:
  ShiftTrainer(float shift, int64_t n) : shift_(shift), n_(n) {}
  int64_t num_examples() const override { return n_; }
  client::FitResult Fit(const client::NamedTensors& global, const client::FitConfig&) override {
    client::FitResult r;
    r.tensors = global;
    for (client::NamedTensor& t : r.tensors) {
      for (float& v : t.values) v += shift_;
    }
    r.num_examples = n_;
    return r;
  }

 private:
  float shift_;
  int64_t n_;
};

// A client agent that may go silent from a given message type on (a dropout at that stage), or
// rewrite its answers (a hostile member).
class AgentPeer final : public transport::InProcPeer {
 public:
  using Rewrite = std::function<void(std::vector<wire::Message>&)>;
  AgentPeer(std::string id, float shift, int64_t n)
      : trainer_(shift, n), agent_(id, &trainer_, false) {}
  void DropAt(wire::MessageType type) { drop_at_ = type; }
  void set_rewrite(Rewrite r) { rewrite_ = std::move(r); }

  std::vector<wire::Message> OnStart() override { return {agent_.MakeJoin()}; }
  StatusOr<std::vector<wire::Message>> OnMessage(const wire::Message& msg) override {
    if (drop_at_ && msg.type() == *drop_at_) gone_ = true;
    if (gone_) return std::vector<wire::Message>{};
    HUDDLE_ASSIGN_OR_RETURN(std::vector<wire::Message> out, agent_.Handle(msg));
    if (rewrite_) rewrite_(out);
    return out;
  }

 private:
  ShiftTrainer trainer_;
  client::ClientAgent agent_;
  std::optional<wire::MessageType> drop_at_;
  bool gone_ = false;
  Rewrite rewrite_;
};

const ModelLayout kLayout = {{"w", DType::kFloat32, {40, 25}}, {"b", DType::kFloat32, {7}}};

struct Site {
  float shift;
  int64_t examples;
};

class SecureAggregationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 10; ++i)
      sites_.push_back({0.001f * static_cast<float>(i + 1), 100 + 50 * i});
    for (size_t i = 0; i < sites_.size(); ++i) {
      peers_.push_back(std::make_unique<AgentPeer>("site-" + std::to_string(i), sites_[i].shift,
                                                   sites_[i].examples));
    }
  }

  coordinator::CoordinatorOptions Options() {
    coordinator::CoordinatorOptions o;
    o.job_name = "secagg-e2e";
    o.rounds = 1;
    o.model = models::ModelSpec::External(kLayout);
    TensorList initial;
    for (const TensorSpec& s : kLayout) initial.emplace_back(s.name, s.shape);
    o.initial_model = std::make_shared<const TensorList>(initial);
    o.cohort.size = static_cast<int64_t>(sites_.size());
    o.min_clients = o.cohort.size;
    o.quorum = 1;
    o.client_timeout_ms = 0;
    o.wait_for_clients_ms = 30'000;
    o.round_deadline_ms = 3'000;  // training is instant here: stage 0 waits only for dropouts
    o.eval_every = 0;
    o.max_update_norm = 10;
    o.secure_aggregation.enabled = true;
    o.secure_aggregation.stage_timeout_ms = 2'000;
    o.secure_aggregation.min_survivor_fraction = 0.5;
    o.secure_aggregation.graph.dropout_fraction = 0.3;
    return o;
  }

  // Runs the job; the coordinator's status.
  Status Run(const coordinator::CoordinatorOptions& o) {
    std::vector<transport::InProcPeer*> raw;
    for (auto& p : peers_) raw.push_back(p.get());
    transport::InProcServerTransport transport(raw, 2);
    transport.Start();
    coordinator::Coordinator coord(
        o, &transport, SteadyClock::Get(), {},
        [&](const coordinator::RoundMetrics& m) { metrics_.push_back(m); });
    Status st = coord.Run();
    model_ = coord.model();
    return st;
  }

  // The FedAvg step of `survivors`: their example-weighted mean shift.
  double WeightedShift(const std::vector<int>& survivors) const {
    double num = 0, den = 0;
    for (int i : survivors) {
      num += static_cast<double>(sites_[i].shift) * static_cast<double>(sites_[i].examples);
      den += static_cast<double>(sites_[i].examples);
    }
    return num / den;
  }

  void ExpectModelMovedBy(double step) const {
    for (const Tensor& t : model_) {
      for (float v : t.data) ASSERT_NEAR(v, step, 1e-6) << t.name();
    }
  }

  std::vector<Site> sites_;
  std::vector<std::unique_ptr<AgentPeer>> peers_;
  std::vector<coordinator::RoundMetrics> metrics_;
  TensorList model_;
};

TEST_F(SecureAggregationTest, TheModelMovesByTheWeightedMeanOfTheMaskedUpdates) {
  const Status st = Run(Options());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_EQ(metrics_[0].results, 10);
  EXPECT_EQ(metrics_[0].examples, 100 * 10 + 50 * 45);
  ExpectModelMovedBy(WeightedShift({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST_F(SecureAggregationTest, MembersDroppingAtEveryStageLeaveTheSurvivorsMean) {
  // site-1 never advertises (it drops while training), site-3 after advertising, site-5 after
  // sharing its keys, site-7 after sending its masked input (before helping unmask).
  peers_[1]->DropAt(wire::MessageType::kFitInstruction);
  peers_[3]->DropAt(wire::MessageType::kSecAggKeyList);
  peers_[5]->DropAt(wire::MessageType::kSecAggShareList);
  peers_[7]->DropAt(wire::MessageType::kSecAggUnmask);
  const Status st = Run(Options());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  // Masked inputs from everyone but 1, 3 and 5 (7's input counts: it was sent before it left).
  EXPECT_EQ(metrics_[0].results, 7);
  ExpectModelMovedBy(WeightedShift({0, 2, 4, 6, 7, 8, 9}));
}

TEST_F(SecureAggregationTest, BelowTheMinimumNothingIsReleased) {
  for (int i = 0; i < 6; ++i)
    peers_[static_cast<size_t>(i)]->DropAt(wire::MessageType::kSecAggShareList);
  const Status st = Run(Options());
  // The only round released nothing: the job says so and fails.
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_EQ(metrics_[0].results, 0);
  EXPECT_FALSE(metrics_[0].updated);
  ExpectModelMovedBy(0);
}

TEST_F(SecureAggregationTest, AHostileMembersMessagesAreRefusedAndTheOthersAggregate) {
  // site-2 replays its advertisement's keys as all zeros (a small-order point), and site-4 sends a
  // masked input of the wrong width: both are refused, and count as dropouts; so is site-6 below.
  peers_[2]->set_rewrite([](std::vector<wire::Message>& out) {
    for (wire::Message& m : out) {
      if (m.type() == wire::MessageType::kSecAggAdvertise) {
        std::get<wire::SecAggAdvertise>(m.body).mask_key.assign(32, '\0');
      }
    }
  });
  peers_[4]->set_rewrite([](std::vector<wire::Message>& out) {
    for (wire::Message& m : out) {
      if (m.type() == wire::MessageType::kSecAggMaskedInput) {
        for (wire::TensorPayload& t : m.tensors) {
          t.spec.dtype = DType::kUint64;
          t.spec.shape.back() = 1;  // and a shape that still fits its bytes' count
          t.bytes = t.bytes.first(8);
        }
      }
    }
  });
  // site-6 sends a well-formed masked input whose first tensor has another name.
  peers_[6]->set_rewrite([](std::vector<wire::Message>& out) {
    for (wire::Message& m : out) {
      if (m.type() == wire::MessageType::kSecAggMaskedInput) m.tensors[0].spec.name = "x";
    }
  });
  const Status st = Run(Options());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_EQ(metrics_[0].results, 7);
  EXPECT_EQ(metrics_[0].rejected, 3);
  ExpectModelMovedBy(WeightedShift({0, 1, 3, 5, 7, 8, 9}));
}

TEST_F(SecureAggregationTest, LocalDpUpdatesAreAggregatedSecurelyToo) {
  // Each client clips to C = 1 and adds its own noise (z = 0.001: std 0.001 per value) before
  // masking; the coordinator unmasks the sum of the noised updates and takes their uniform mean.
  coordinator::CoordinatorOptions o = Options();
  o.max_update_norm = 0;
  o.privacy.mode = privacy::PrivacyMode::kLocal;
  o.privacy.clip_norm = 1.0;
  o.privacy.schedule = {privacy::ScheduleRange{1, 1, 0.001, std::nullopt, std::nullopt}};
  o.out_dir = (std::filesystem::temp_directory_path() /
               ("huddle_secagg_local_" + std::to_string(::getpid())))
                  .string();
  std::filesystem::remove_all(o.out_dir);
  const Status st = Run(o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  double uniform = 0;
  for (const Site& site : sites_) uniform += site.shift / 10.0;
  // The mean of 10 clients' noise: std 0.001 / sqrt(10) per value; 1007 values stay within 6 std.
  for (const Tensor& t : model_) {
    for (float v : t.data) ASSERT_NEAR(v, uniform, 6 * 0.001 / std::sqrt(10.0)) << t.name();
  }
  std::filesystem::remove_all(o.out_dir);
}

TEST_F(SecureAggregationTest, DistributedDpNoiseComesFromTheMembersShares) {
  // Each client clips to C = 1, quantizes and adds its own discrete Gaussian share; the shares of
  // the fewest honest members an unmasked sum may hold (min_survivors 5, less 1 colluder: 4)
  // carry noise of multiplier z = 0.01. All 10 survive, so the sum holds 10/4 of that variance.
  coordinator::CoordinatorOptions o = Options();
  o.max_update_norm = 0;
  o.privacy.mode = privacy::PrivacyMode::kDistributed;
  o.privacy.clip_norm = 1.0;
  o.privacy.schedule = {privacy::ScheduleRange{1, 1, 0.01, std::nullopt, std::nullopt}};
  o.secure_aggregation.graph.corrupt_fraction = 0.1;
  o.out_dir = (std::filesystem::temp_directory_path() /
               ("huddle_secagg_distributed_" + std::to_string(::getpid())))
                  .string();
  std::filesystem::remove_all(o.out_dir);
  const Status st = Run(o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  ASSERT_TRUE(metrics_[0].privacy.has_value());

  // The ledger holds the round as the sum of 4 honest shares, at least the configured z.
  auto ledger = privacy::PrivacyLedger::Open(o.out_dir + "/privacy_ledger.jsonl");
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  ASSERT_EQ(ledger->entries().size(), 1u);
  const privacy::LedgerEntry& e = ledger->entries()[0];
  EXPECT_EQ(e.mechanism, privacy::kMechanismDistributed);
  EXPECT_EQ(e.adjacency, privacy::kReplaceOne);
  EXPECT_EQ(e.sampling_rate, 1.0);
  EXPECT_EQ(e.dimension, 1007);
  EXPECT_LT(e.tau, 1e-316);  // every term of tau underflows: a few subnormals
  EXPECT_GE(e.noise_multiplier, 0.01);
  EXPECT_LT(e.noise_multiplier, 0.01 * 1.001);
  EXPECT_GT(metrics_[0].privacy->epsilon, 0);

  // The mean's noise: std z C sqrt(10 / 4) / 10 per value (the grid's rounding adds < 1e-5).
  double uniform = 0;
  for (const Site& site : sites_) uniform += site.shift / 10.0;
  const double sd = e.noise_multiplier * std::sqrt(10.0 / 4.0) / 10.0;
  double sum_sq = 0;
  int64_t count = 0;
  for (const Tensor& t : model_) {
    for (float v : t.data) {
      ASSERT_NEAR(v, uniform, 6 * sd) << t.name();
      sum_sq += (v - uniform) * (v - uniform);
      ++count;
    }
  }
  // 1007 values: the sample std is within ~4.5% of sd (one standard error); allow 15%.
  const double measured = std::sqrt(sum_sq / static_cast<double>(count));
  EXPECT_GT(measured, 0.85 * sd);
  EXPECT_LT(measured, 1.15 * sd);
  std::filesystem::remove_all(o.out_dir);
}

TEST_F(SecureAggregationTest, DistributedDpStopsBeforeTheRoundThatWouldPassTheBudget) {
  // z = 2 a round (z / 2 under replace-one): epsilon ~4.9 after one round, ~7 after two, ~8.6
  // after three at delta 1e-5; a total of 7.5 stops the job after round 2.
  coordinator::CoordinatorOptions o = Options();
  o.rounds = 3;
  o.max_update_norm = 0;
  o.privacy.mode = privacy::PrivacyMode::kDistributed;
  o.privacy.schedule = {privacy::ScheduleRange{1, 3, 2.0, std::nullopt, std::nullopt}};
  o.privacy.total_epsilon = 7.5;
  o.out_dir = (std::filesystem::temp_directory_path() /
               ("huddle_secagg_budget_" + std::to_string(::getpid())))
                  .string();
  std::filesystem::remove_all(o.out_dir);
  const Status st = Run(o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 2u);
  ASSERT_TRUE(metrics_.back().privacy.has_value());
  EXPECT_LE(metrics_.back().privacy->epsilon, 7.5);
  auto ledger = privacy::PrivacyLedger::Open(o.out_dir + "/privacy_ledger.jsonl");
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_EQ(ledger->entries().size(), 2u);
  std::filesystem::remove_all(o.out_dir);
}

TEST_F(SecureAggregationTest, DistributedDpNeedsSecureAggregation) {
  coordinator::CoordinatorOptions o = Options();
  o.max_update_norm = 0;
  o.secure_aggregation.enabled = false;
  o.privacy.mode = privacy::PrivacyMode::kDistributed;
  o.privacy.schedule = {privacy::ScheduleRange{1, 1, 1.0, std::nullopt, std::nullopt}};
  const Status st = Run(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("secure aggregation"), std::string::npos) << st;
  // Nor with a minimum that the colluders alone could make up.
  o.secure_aggregation.enabled = true;
  o.secure_aggregation.min_survivor_fraction = 0.1;
  o.secure_aggregation.graph.corrupt_fraction = 0.1;
  const Status few = Run(o);
  EXPECT_EQ(few.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(few.message().find("above corrupt_fraction"), std::string::npos) << few;
}

TEST_F(SecureAggregationTest, AJobWithoutABoundOnUpdatesIsRefused) {
  coordinator::CoordinatorOptions o = Options();
  o.max_update_norm = 0;
  const Status st = Run(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("max_update_norm"), std::string::npos) << st;
}

}  // namespace
}  // namespace huddle
