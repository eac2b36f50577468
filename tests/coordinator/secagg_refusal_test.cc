// A secure-aggregation member whose message the coordinator refuses, at any stage after training,
// is a dropout at once: the stage it was due to answer ends as soon as every other member due has
// answered, not at stage_timeout. The real coordinator and real client agents over the in-process
// transport; stage_timeout is long (60 s) so that a stage held open by a refused member shows as a
// round that lasts that long, while a round that ends on its answers takes well under a second.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aggregation/secagg/wire.h"
#include "client/agent.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "tests/testing/corrupt_outgoing.h"
#include "transport/inproc_transport.h"

namespace huddle {
namespace {

namespace secagg = aggregation::secagg;
using testing::IsStage;

constexpr int64_t kStageTimeoutMs = 60'000;

// Training adds 0.01 to every value.
class ShiftTrainer final : public client::Trainer {
 public:
  int64_t num_examples() const override { return 100; }
  client::FitResult Fit(const client::NamedTensors& global, const client::FitConfig&) override {
    client::FitResult r;
    r.tensors = global;
    for (client::NamedTensor& t : r.tensors) {
      for (float& v : t.values) v += 0.01f;
    }
    r.num_examples = 100;
    return r;
  }
};

// A certified client agent whose outgoing messages a test may rewrite (a hostile member).
class MemberPeer final : public transport::InProcPeer {
 public:
  using Rewrite = std::function<void(std::vector<wire::Message>&)>;
  MemberPeer(std::string id, const SigningKey& project, secagg::SignatureCache* cache)
      : agent_(id, &trainer_, false) {
    client::SecAggIdentity identity;
    identity.id = id;
    identity.policy.project_key = project.public_key();
    identity.policy.corrupt_fraction = 0.1;
    identity.policy.cache = cache;
    MemberCertificate c;
    c.id = id;
    c.transport_key =
        secagg::Hash(std::span(reinterpret_cast<const uint8_t*>(id.data()), id.size()));
    c.signing_key = identity.key.public_key();
    certificate_ = Certify(c, project);
    agent_.set_secagg_identity(std::move(identity));
  }
  void set_rewrite(Rewrite r) { rewrite_ = std::move(r); }
  const MemberCertificate& certificate() const { return certificate_; }

  std::vector<wire::Message> OnStart() override { return {agent_.MakeJoin()}; }
  StatusOr<std::vector<wire::Message>> OnMessage(const wire::Message& msg) override {
    HUDDLE_ASSIGN_OR_RETURN(std::vector<wire::Message> out, agent_.Handle(msg));
    if (rewrite_) rewrite_(out);
    return out;
  }

 private:
  ShiftTrainer trainer_;
  client::ClientAgent agent_;
  MemberCertificate certificate_;
  Rewrite rewrite_;
};

// The in-process transport, authenticated as the CurveZMQ one is (each peer's messages carry its
// enrolled id), with one peer's key revoked right after the coordinator sends it a chosen message:
// the revocation is reported at once, and every later message of that peer arrives as refused, as
// the ZeroMQ transport reports a revoked key's connection until it is cut.
class RevokingTransport final : public transport::ServerTransport {
 public:
  using Trigger = std::function<bool(const wire::Message&)>;
  RevokingTransport(transport::ServerTransport* inner, std::vector<std::string> ids,
                    transport::PeerId victim, Trigger trigger)
      : inner_(inner), ids_(std::move(ids)), victim_(std::move(victim)), trigger_(trigger) {}

  Status Send(const transport::PeerId& peer, const wire::Message& msg) override {
    Status st = inner_->Send(peer, msg);
    if (peer == victim_ && !revoked_ && trigger_(msg)) {
      revoked_ = true;
      pending_.push_back(Refused(victim_));
    }
    return st;
  }
  StatusOr<std::optional<transport::Inbound>> Receive(int64_t timeout_ms) override {
    if (!pending_.empty()) {
      transport::Inbound in = std::move(pending_.front());
      pending_.erase(pending_.begin());
      return std::optional<transport::Inbound>(std::move(in));
    }
    HUDDLE_ASSIGN_OR_RETURN(std::optional<transport::Inbound> in, inner_->Receive(timeout_ms));
    if (!in) return in;
    if (revoked_ && in->peer == victim_) return std::optional<transport::Inbound>(Refused(victim_));
    in->auth_id = ids_.at(std::stoul(in->peer));
    return in;
  }
  uint64_t bytes_in() const override { return inner_->bytes_in(); }
  uint64_t bytes_out() const override { return inner_->bytes_out(); }
  bool authenticates() const override { return true; }
  bool revoked() const { return revoked_; }

 private:
  transport::Inbound Refused(const transport::PeerId& peer) const {
    transport::Inbound in;
    in.peer = peer;
    in.auth_id = ids_.at(std::stoul(peer));
    in.message = absl::PermissionDeniedError(absl::StrCat(
        "the key of client '", in.auth_id, "' was removed from the allow-list (revoked)"));
    return in;
  }

  transport::ServerTransport* inner_;
  std::vector<std::string> ids_;
  transport::PeerId victim_;
  Trigger trigger_;
  bool revoked_ = false;
  std::vector<transport::Inbound> pending_;
};

const ModelLayout kLayout = {{"w", DType::kFloat32, {8, 4}}, {"b", DType::kFloat32, {3}}};

class SecAggRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 8; ++i) {
      peers_.push_back(
          std::make_unique<MemberPeer>("site-" + std::to_string(i), project_, &cache_));
    }
  }

  coordinator::CoordinatorOptions Options() {
    coordinator::CoordinatorOptions o;
    o.job_name = "secagg-refusal";
    o.rounds = 1;
    o.model = models::ModelSpec::External(kLayout);
    TensorList initial;
    for (const TensorSpec& s : kLayout) initial.emplace_back(s.name, s.shape);
    o.initial_model = std::make_shared<const TensorList>(initial);
    o.cohort.size = static_cast<int64_t>(peers_.size());
    o.min_clients = o.cohort.size;
    o.quorum = 1;
    o.client_timeout_ms = 0;
    o.wait_for_clients_ms = 30'000;
    o.round_deadline_ms = kStageTimeoutMs;  // training ends when every member has trained
    o.eval_every = 0;
    o.max_update_norm = 10;
    o.secure_aggregation.enabled = true;
    o.secure_aggregation.stage_timeout_ms = kStageTimeoutMs;
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

  // Runs the one-round job; its status. metrics_ holds the round's metrics.
  Status Run() {
    std::vector<transport::InProcPeer*> raw;
    for (auto& p : peers_) raw.push_back(p.get());
    transport::InProcServerTransport transport(raw, 2);
    transport.Start();
    coordinator::Coordinator coord(
        Options(), &transport, SteadyClock::Get(), {},
        [&](const coordinator::RoundMetrics& m) { metrics_.push_back(m); });
    return coord.Run();
  }

  // Runs the one-round job over a RevokingTransport that revokes site-3's key right after
  // `trigger` matches a message sent to it; its status.
  Status RunRevoking(RevokingTransport::Trigger trigger, bool* revoked) {
    std::vector<transport::InProcPeer*> raw;
    std::vector<std::string> ids;
    for (auto& p : peers_) {
      raw.push_back(p.get());
      ids.push_back(p->certificate().id);
    }
    transport::InProcServerTransport inproc(raw, 2);
    RevokingTransport transport(&inproc, ids, "3", std::move(trigger));
    inproc.Start();
    coordinator::Coordinator coord(
        Options(), &transport, SteadyClock::Get(), {},
        [&](const coordinator::RoundMetrics& m) { metrics_.push_back(m); });
    Status st = coord.Run();
    *revoked = transport.revoked();
    return st;
  }

  // The round ended on its members' answers: every stage closed when its last due member
  // answered, none at stage_timeout (the round would have lasted at least that long).
  void ExpectNoStageTimedOut() const {
    ASSERT_EQ(metrics_.size(), 1u);
    EXPECT_LT(metrics_[0].duration_s * 1000, kStageTimeoutMs / 2)
        << "a stage waited for a refused member until stage_timeout";
  }

  // site-3's message of `stage` is rewritten by `corrupt`.
  void CorruptAt(secagg::Stage stage, testing::MessageEdit corrupt) {
    peers_[3]->set_rewrite(testing::CorruptOutgoing(stage, std::move(corrupt)));
  }

  SigningKey project_ = SigningKey::Generate();
  secagg::SignatureCache cache_;
  std::vector<std::unique_ptr<MemberPeer>> peers_;
  std::vector<coordinator::RoundMetrics> metrics_;
};

// The payload of a secure-aggregation message replaced by bytes that do not decode.
void GarblePayload(wire::Message& m) {
  auto junk = std::make_shared<std::vector<uint8_t>>(16, 0xab);
  m.tensors[0].spec.shape = {16};
  m.tensors[0].bytes = std::as_bytes(std::span(*junk));
  m.tensors[0].owner = junk;
}

// A nonce of the wrong length: the codec refuses the whole message (a malformed message).
void MalformNonce(wire::Message& m) { std::get<wire::SecAggData>(m.body).nonce = "abc"; }

TEST_F(SecAggRefusalTest, AMemberWhoseRevealIsMalformedDoesNotHoldItsStageOpen) {
  CorruptAt(secagg::Stage::kReveal, MalformNonce);
  ASSERT_TRUE(Run().ok());
  ExpectNoStageTimedOut();
  EXPECT_EQ(metrics_[0].results, 7);
}

TEST_F(SecAggRefusalTest, AMemberWhoseSharesDoNotDecodeDoesNotHoldItsStageOpen) {
  CorruptAt(secagg::Stage::kShares, GarblePayload);
  ASSERT_TRUE(Run().ok());
  ExpectNoStageTimedOut();
  EXPECT_EQ(metrics_[0].results, 7);
  EXPECT_GE(metrics_[0].rejected, 1);
}

TEST_F(SecAggRefusalTest, AMemberWhoseUploadRequestIsMalformedDoesNotHoldTheMaskingStageOpen) {
  peers_[3]->set_rewrite(testing::CorruptOutgoing(
      wire::MessageType::kUploadRequest,
      [](wire::Message& m) { std::get<wire::UploadRequest>(m.body).nonce = "abc"; }));
  ASSERT_TRUE(Run().ok());
  ExpectNoStageTimedOut();
  EXPECT_EQ(metrics_[0].results, 7);
  EXPECT_EQ(metrics_[0].rejected, 1);
  // Each masked input's upload is timed from its grant; site-3 was never granted one.
  ASSERT_TRUE(metrics_[0].secure_aggregation.has_value());
  EXPECT_EQ(metrics_[0].secure_aggregation->masked, 7);
  ASSERT_EQ(metrics_[0].upload_seconds.size(), 7u);
  for (double s : metrics_[0].upload_seconds) {
    EXPECT_GE(s, 0);
    EXPECT_LT(s * 1000, kStageTimeoutMs);
  }
}

TEST_F(SecAggRefusalTest, AMemberWhoseConsistencyIsMalformedDoesNotHoldItsStageOpen) {
  CorruptAt(secagg::Stage::kConsistency, MalformNonce);
  ASSERT_TRUE(Run().ok());
  ExpectNoStageTimedOut();
}

TEST_F(SecAggRefusalTest, AMemberSendingAMessageNoClientMaySendDoesNotHoldItsStageOpen) {
  // Instead of its reveal, a Welcome (a coordinator's message).
  CorruptAt(secagg::Stage::kReveal,
            [](wire::Message& m) { m = wire::MakeMessage(wire::Welcome{}, m.round, m.sender); });
  ASSERT_TRUE(Run().ok());
  ExpectNoStageTimedOut();
}

}  // namespace
}  // namespace huddle

namespace huddle {
namespace {

// A member whose key is revoked at any point of a secure-aggregation round leaves the federation
// there: the round goes on without it (a dropout at once, no stage held open) and the job ends
// normally. No stage may look it up among the clients after it was removed.
class SecAggRevocationTest : public SecAggRefusalTest, public ::testing::WithParamInterface<int> {};

TEST_P(SecAggRevocationTest, AMemberRevokedMidRoundIsADropoutAndTheJobEnds) {
  const int when = GetParam();  // 0: after its fit instruction; else after this stage was sent
  bool revoked = false;
  Status st = RunRevoking(
      [when](const wire::Message& m) {
        return when == 0 ? m.type() == wire::MessageType::kFitInstruction
                         : IsStage(m, static_cast<secagg::Stage>(when));
      },
      &revoked);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(revoked) << "the trigger never matched";
  ExpectNoStageTimedOut();
  EXPECT_GE(metrics_[0].results, 7);
}

INSTANTIATE_TEST_SUITE_P(EveryStage, SecAggRevocationTest,
                         ::testing::Values(0, static_cast<int>(secagg::Stage::kMemberList),
                                           static_cast<int>(secagg::Stage::kSeeds),
                                           static_cast<int>(secagg::Stage::kShareList),
                                           static_cast<int>(secagg::Stage::kMask),
                                           static_cast<int>(secagg::Stage::kSurvivors),
                                           static_cast<int>(secagg::Stage::kUnmask)),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return param.param == 0 ? std::string("AfterItsFitInstruction")
                                                   : "AfterStage" + std::to_string(param.param);
                         });

}  // namespace
}  // namespace huddle
