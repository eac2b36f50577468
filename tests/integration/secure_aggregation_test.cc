// Secure aggregation end to end, in one process: the real coordinator and real client agents over
// the in-process transport, each agent driving a trainer whose update is known. The global model
// moves by the survivors' (weighted) mean update, to within the quantization step, whoever drops
// at whichever stage; below the minimum nothing is released; a hostile member's messages are
// refused without stopping the others.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aggregation/secagg/wire.h"
#include "client/agent.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "tests/testing/corrupt_outgoing.h"
#include "tests/testing/temp_dir.h"
#include "transport/inproc_transport.h"

namespace huddle {
namespace {

using testing::CorruptOutgoing;
using testing::EditPayload;
using testing::EditWords;

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

// A client agent that may go silent from a given secure-aggregation stage on (a dropout there), or
// rewrite its answers (a hostile member). Its identity: a signing key the test's project certified.
class AgentPeer final : public transport::InProcPeer {
 public:
  AgentPeer(std::string id, float shift, int64_t n, const SigningKey& project,
            aggregation::secagg::SignatureCache* cache)
      : trainer_(shift, n), agent_(id, &trainer_, false) {
    client::SecAggIdentity identity;
    identity.id = id;
    identity.policy.project_key = project.public_key();
    identity.policy.corrupt_fraction = 0.1;
    identity.policy.cache = cache;
    MemberCertificate c;
    c.id = id;
    c.transport_key = aggregation::secagg::Hash(
        std::span(reinterpret_cast<const uint8_t*>(id.data()), id.size()));
    c.signing_key = identity.key.public_key();
    certificate_ = Certify(c, project);
    agent_.set_secagg_identity(std::move(identity));
  }
  // Silent from the first message of `stage` on (0: from the fit instruction: it never trains).
  void DropAt(aggregation::secagg::Stage stage) { drop_at_ = stage; }
  void DropAtFit() { drop_at_fit_ = true; }
  // Its answers rewritten before they leave (testing::CorruptOutgoing).
  void set_rewrite(testing::OutgoingRewrite r) { rewrite_ = std::move(r); }
  const MemberCertificate& certificate() const { return certificate_; }
  client::ClientAgent& agent() { return agent_; }

  std::vector<wire::Message> OnStart() override { return {agent_.MakeJoin()}; }
  StatusOr<std::vector<wire::Message>> OnMessage(const wire::Message& msg) override {
    if (drop_at_fit_ && msg.type() == wire::MessageType::kFitInstruction) gone_ = true;
    if (drop_at_ && msg.type() == wire::MessageType::kSecAggData &&
        std::get<wire::SecAggData>(msg.body).stage == static_cast<uint32_t>(*drop_at_)) {
      gone_ = true;
    }
    if (gone_) return std::vector<wire::Message>{};
    HUDDLE_ASSIGN_OR_RETURN(std::vector<wire::Message> out, agent_.Handle(msg));
    if (rewrite_) rewrite_(out);
    return out;
  }

 private:
  ShiftTrainer trainer_;
  client::ClientAgent agent_;
  MemberCertificate certificate_;
  std::optional<aggregation::secagg::Stage> drop_at_;
  bool drop_at_fit_ = false;
  bool gone_ = false;
  testing::OutgoingRewrite rewrite_;
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
                                                   sites_[i].examples, project_, &cache_));
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
    o.secure_aggregation.certificates =
        [this](const std::string& id) -> std::optional<MemberCertificate> {
      for (auto& p : peers_) {
        if (p->certificate().id == id) return p->certificate();
      }
      return std::nullopt;
    };
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

  SigningKey project_ = SigningKey::Generate();
  aggregation::secagg::SignatureCache cache_;
  std::vector<Site> sites_;
  std::vector<std::unique_ptr<AgentPeer>> peers_;
  std::vector<coordinator::RoundMetrics> metrics_;
  TensorList model_;
};

// The mean of `survivors`' shifts (uniform weights, the default under secure aggregation).
double UniformShift(const std::vector<Site>& sites, const std::vector<int>& survivors) {
  double sum = 0;
  for (int i : survivors) sum += sites[static_cast<size_t>(i)].shift;
  return sum / static_cast<double>(survivors.size());
}

TEST_F(SecureAggregationTest, TheModelMovesByTheMeanOfTheMaskedUpdates) {
  const Status st = Run(Options());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_EQ(metrics_[0].results, 10);
  ExpectModelMovedBy(UniformShift(sites_, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // The round says what ran: the session's settings and what happened in it.
  ASSERT_TRUE(metrics_[0].secure_aggregation.has_value());
  const auto& a = *metrics_[0].secure_aggregation;
  EXPECT_TRUE(a.released);
  EXPECT_EQ(a.members, 10);
  EXPECT_EQ(a.listed, 10);
  EXPECT_EQ(a.masked, 10);
  EXPECT_EQ(a.signed_survivors, 10);
  EXPECT_GE(a.consistency_quorum, 6);
  EXPECT_TRUE(a.blamed.empty());
  EXPECT_NE(metrics_[0].ToJson().find("\"secure_aggregation\""), std::string::npos);
  EXPECT_NE(metrics_[0].ProgressLine().find("secure sum of 10"), std::string::npos);
  // Weighing uniformly, the coordinator learns no example count, and no member reports a loss.
  EXPECT_NE(metrics_[0].ToJson().find("\"examples\":null"), std::string::npos);
  EXPECT_NE(metrics_[0].ToJson().find("\"train_loss\":null"), std::string::npos);
}

TEST_F(SecureAggregationTest, WeightingByExamplesIsAnOptInWithItsTotalChecked) {
  coordinator::CoordinatorOptions o = Options();
  o.secure_aggregation.weight_by_examples = true;
  const Status st = Run(o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_EQ(metrics_[0].examples, 100 * 10 + 50 * 45);
  ExpectModelMovedBy(WeightedShift({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

// A member that lies about its weight inside the masked words: the audit moved the total to 1 (the
// mean 6584 times too long) or to 2^31 (training frozen). Now a total no honest members can send
// is found and the update discarded.
TEST_F(SecureAggregationTest, AWeightNoHonestMembersCouldSendIsFoundAndTheUpdateDiscarded) {
  coordinator::CoordinatorOptions o = Options();
  o.secure_aggregation.weight_by_examples = true;
  // site-2 adds 2^31 - 10^6 to its masked weight word: the total decodes far above 10 x the cap.
  peers_[2]->set_rewrite(
      CorruptOutgoing(wire::MessageType::kSecAggMaskedInput, [](wire::Message& m) {
        EditWords(m.tensors.back(), [](std::vector<uint32_t>& words) {
          ASSERT_EQ(words.size(), 1u);  // the weight word
          words[0] += (1u << 31) - 1'000'000u;
        });
      }));
  const Status st = Run(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;  // the job's only round: nothing trained
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_FALSE(metrics_[0].updated);
  ASSERT_TRUE(metrics_[0].secure_aggregation.has_value());
  EXPECT_FALSE(metrics_[0].secure_aggregation->released);
  EXPECT_NE(metrics_[0].secure_aggregation->failure.find("a member lied about its weight"),
            std::string::npos)
      << metrics_[0].secure_aggregation->failure;
  ExpectModelMovedBy(0);
}

// An input out of range (within the word width: masked inputs cannot be checked one by one) makes
// the unmasked sum longer than its survivors' clipped updates can: found, and discarded.
TEST_F(SecureAggregationTest, AnInputOutOfRangeIsFoundInTheSumAndDiscarded) {
  peers_[4]->set_rewrite(
      CorruptOutgoing(wire::MessageType::kSecAggMaskedInput, [](wire::Message& m) {
        EditWords(m.tensors[0], [](std::vector<uint32_t>& words) {
          words[0] += 0x7f000000u;  // near the word's half range on one value
        });
      }));
  const Status st = Run(Options());
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_NE(metrics_[0].secure_aggregation->failure.find("out of range"), std::string::npos)
      << metrics_[0].secure_aggregation->failure;
  ExpectModelMovedBy(0);
}

TEST_F(SecureAggregationTest, MembersDroppingAtEveryStageLeaveTheSurvivorsMean) {
  using aggregation::secagg::Stage;
  // site-1 never trains, site-3 drops when the member list comes (after advertising), site-5
  // when the share list comes (after sharing), site-7 when the unmask request comes (after
  // sending its masked input and signing the survivors).
  peers_[1]->DropAtFit();
  peers_[3]->DropAt(Stage::kMemberList);
  peers_[5]->DropAt(Stage::kShareList);
  peers_[7]->DropAt(Stage::kUnmask);
  const Status st = Run(Options());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  // Masked inputs from everyone but 1, 3 and 5 (7's input counts: it was sent before it left).
  EXPECT_EQ(metrics_[0].results, 7);
  ExpectModelMovedBy(UniformShift(sites_, {0, 2, 4, 6, 7, 8, 9}));
  // site-3 advertised but never revealed its randomness: the session's graph needs every
  // member's, so it started again without site-3 (one restart).
  const auto& a = *metrics_[0].secure_aggregation;
  EXPECT_EQ(a.restarts, 1);
  EXPECT_EQ(a.listed, 8);
  EXPECT_EQ(a.shared, 7);
  EXPECT_EQ(a.masked, 7);
  EXPECT_EQ(a.answered, 6);
}

TEST_F(SecureAggregationTest, BelowTheMinimumNothingIsReleased) {
  for (int i = 0; i < 6; ++i) {
    peers_[static_cast<size_t>(i)]->DropAt(aggregation::secagg::Stage::kShareList);
  }
  const Status st = Run(Options());
  // The only round released nothing: the job says so and fails.
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_EQ(metrics_[0].results, 0);
  EXPECT_FALSE(metrics_[0].updated);
  ExpectModelMovedBy(0);
}

TEST_F(SecureAggregationTest, AHostileMembersMessagesAreRefusedAndTheOthersAggregate) {
  // site-2 advertises a small-order mask key, and site-4 sends a masked input of the wrong width:
  // both are refused, and count as dropouts; so is site-6 below.
  using aggregation::secagg::Advertisement;
  peers_[2]->set_rewrite(
      CorruptOutgoing(aggregation::secagg::Stage::kAdvertise, [](wire::Message& m) {
        EditPayload<Advertisement>(m, [](Advertisement& keys) { keys.mask_key = {}; });
      }));
  peers_[4]->set_rewrite(
      CorruptOutgoing(wire::MessageType::kSecAggMaskedInput, [](wire::Message& m) {
        for (wire::TensorPayload& t : m.tensors) {
          t.spec.dtype = DType::kUint64;
          t.spec.shape.back() = 1;  // and a shape that still fits its bytes' count
          t.bytes = t.bytes.first(8);
        }
      }));
  // site-6 sends a well-formed masked input whose first tensor has another name.
  peers_[6]->set_rewrite(CorruptOutgoing(wire::MessageType::kSecAggMaskedInput,
                                         [](wire::Message& m) { m.tensors[0].spec.name = "x"; }));
  const Status st = Run(Options());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_EQ(metrics_[0].results, 7);
  EXPECT_EQ(metrics_[0].rejected, 3);
  ExpectModelMovedBy(UniformShift(sites_, {0, 1, 3, 5, 7, 8, 9}));
}

// A member that seals garbage to its neighbours (signed: it is the member's own doing) and one
// that reveals wrong shares at unmasking: neither stops the round. The first is complained of and
// left out (nobody holds its shares), the second named and its shares set aside; the sum is the
// honest survivors' exactly.
TEST_F(SecureAggregationTest, LyingMembersAreNamedAndTheRoundCompletes) {
  using aggregation::secagg::Stage;
  using aggregation::secagg::UnmaskResponse;
  peers_[3]->set_rewrite(CorruptOutgoing(Stage::kUnmaskResponse, [](wire::Message& m) {
    EditPayload<UnmaskResponse>(m, [](UnmaskResponse& r) {
      for (auto& share : r.self_mask_shares) share.share.y[1] ^= 1;
    });
  }));
  const Status st = Run(Options());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  EXPECT_EQ(metrics_[0].results, 10);
  ExpectModelMovedBy(UniformShift(sites_, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  const auto& a = *metrics_[0].secure_aggregation;
  ASSERT_EQ(a.blamed.size(), 1u);
  EXPECT_EQ(a.blamed[0].first, "site-3");
  EXPECT_NE(a.blamed[0].second.find("not the one its dealer signed"), std::string::npos);
}

TEST_F(SecureAggregationTest, LocalDpUpdatesAreAggregatedSecurelyToo) {
  // Each client clips to C = 1 and adds its own noise (z = 0.001: std 0.001 per value) before
  // masking; the coordinator unmasks the sum of the noised updates and takes their uniform mean.
  coordinator::CoordinatorOptions o = Options();
  o.max_update_norm = 0;
  o.privacy.mode = privacy::PrivacyMode::kLocal;
  o.privacy.clip_norm = 1.0;
  o.privacy.schedule = {privacy::ScheduleRange{1, 1, 0.001, std::nullopt, std::nullopt}};
  const testing::ScopedTempDir out("secagg_local", /*create=*/false);
  o.out_dir = out.path();
  const Status st = Run(o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  double uniform = 0;
  for (const Site& site : sites_) uniform += site.shift / 10.0;
  // The mean of 10 clients' noise: std 0.001 / sqrt(10) per value; 1007 values stay within 6 std.
  for (const Tensor& t : model_) {
    for (float v : t.data) ASSERT_NEAR(v, uniform, 6 * 0.001 / std::sqrt(10.0)) << t.name();
  }
}

TEST_F(SecureAggregationTest, DistributedDpNoiseComesFromTheMembersShares) {
  // Each client clips to C = 1, quantizes and adds its own discrete Gaussian share; the shares of
  // the fewest honest members an unmasked sum may hold (min_survivors 6, the consistency quorum
  // of 10 with 1 colluder; less that colluder: 5) carry noise of multiplier z = 0.01. All 10
  // survive, so the sum holds 10/5 of that variance.
  coordinator::CoordinatorOptions o = Options();
  o.max_update_norm = 0;
  o.privacy.mode = privacy::PrivacyMode::kDistributed;
  o.privacy.clip_norm = 1.0;
  o.privacy.schedule = {privacy::ScheduleRange{1, 1, 0.01, std::nullopt, std::nullopt}};
  o.secure_aggregation.graph.corrupt_fraction = 0.1;
  const testing::ScopedTempDir out("secagg_distributed", /*create=*/false);
  o.out_dir = out.path();
  const Status st = Run(o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 1u);
  ASSERT_TRUE(metrics_[0].privacy.has_value());

  // The ledger holds the round as the sum of 5 honest shares, at least the configured z.
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

  // The mean's noise: std z C sqrt(10 / 5) / 10 per value (the grid's rounding adds < 1e-5).
  double uniform = 0;
  for (const Site& site : sites_) uniform += site.shift / 10.0;
  const double sd = e.noise_multiplier * std::sqrt(10.0 / 5.0) / 10.0;
  EXPECT_EQ(metrics_[0].secure_aggregation->honest_shares, 5);
  // The metric is the std of the noise in the sum the 5 honest shares guarantee, per value.
  EXPECT_NEAR(metrics_[0].privacy->noise_stddev, e.noise_multiplier * 1.0, 1e-3 * 0.01);
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
  const testing::ScopedTempDir out("secagg_budget", /*create=*/false);
  o.out_dir = out.path();
  const Status st = Run(o);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(metrics_.size(), 2u);
  ASSERT_TRUE(metrics_.back().privacy.has_value());
  EXPECT_LE(metrics_.back().privacy->epsilon, 7.5);
  auto ledger = privacy::PrivacyLedger::Open(o.out_dir + "/privacy_ledger.jsonl");
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_EQ(ledger->entries().size(), 2u);
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
