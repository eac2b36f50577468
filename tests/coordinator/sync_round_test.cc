// The synchronous round as a part (coordinator/sync_round.h): instructions with fresh nonces,
// upload slots granted in request order, results folded under their grant, refusals through the
// host, and the round's end at its deadline.
#include "coordinator/sync_round.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/coordinator/fake_federation.h"

namespace huddle::coordinator {
namespace {

// Records every message sent, by peer.
class RecordingTransport final : public transport::ServerTransport {
 public:
  Status Send(const transport::PeerId& peer, const wire::Message& msg) override {
    sent.push_back({peer, msg});
    return absl::OkStatus();
  }
  StatusOr<std::optional<transport::Inbound>> Receive(int64_t) override {
    return std::optional<transport::Inbound>();
  }
  uint64_t bytes_in() const override { return 0; }
  uint64_t bytes_out() const override { return 0; }
  // The messages of `type` sent to `peer`.
  std::vector<wire::Message> To(const std::string& peer, wire::MessageType type) const {
    std::vector<wire::Message> out;
    for (const auto& [p, msg] : sent) {
      if (p == peer && msg.type() == type) out.push_back(msg);
    }
    return out;
  }
  std::vector<std::pair<transport::PeerId, wire::Message>> sent;
};

class RecordingHost final : public SyncRoundHost {
 public:
  void CountStale() override { ++stale; }
  void Warn(const std::string& what, const std::string&,
            const std::function<std::string()>&) override {
    warnings.push_back(what);
  }
  void Refuse(const transport::PeerId& peer, wire::ErrorCode code, const std::string&,
              uint64_t) override {
    refusals.push_back({peer, code});
  }
  int stale = 0;
  std::vector<std::string> warnings;
  std::vector<std::pair<transport::PeerId, wire::ErrorCode>> refusals;
};

class SyncRoundTest : public ::testing::Test {
 protected:
  SyncRoundTest() {
    options_.upload_slots = 1;
    options_.client_timeout_ms = 0;
    options_.max_update_norm = 0;
    options_.auto_norm_factor = 0;
    layout_ = {TensorSpec{"w", DType::kFloat32, {2, 3}}, TensorSpec{"b", DType::kFloat32, {3}}};
    for (const char* id : {"a", "b", "c"}) {
      population_.Join(id, absl::StrCat("peer-", id), 100, 0);
    }
    auto agg = aggregation::StreamingAggregator::Create(layout_, options_.aggregation);
    EXPECT_TRUE(agg.ok()) << agg.status();
    aggregator_.emplace(std::move(*agg));
    auto privacy = RoundPrivacy::Open(&options_, 0, 0);
    EXPECT_TRUE(privacy.ok()) << privacy.status();
    privacy_.emplace(std::move(*privacy));
    sync_.emplace(SyncRound::Parts{&options_, &transport_, &clock_, &population_, &slots_,
                                   &*aggregator_, &*privacy_, layout_, &host_});
  }

  // Round `number` open for `ids` (kTraining), each sent its instruction.
  void Open(uint64_t number, const std::vector<std::string>& ids) {
    round_.number = number;
    round_.deadline_ms = clock_.NowMs() + 60'000;
    round_.global = std::make_shared<const TensorList>(testing::HonestDelta(layout_, 0, "model"));
    for (const std::string& id : ids) round_.members.emplace(id, MemberState::kTraining);
    sync_->Begin(&round_, /*model_version=*/7);
    round_.weight_cap = sync_->WeightCap();
    for (const std::string& id : ids) sync_->SendFit(id);
  }

  wire::Message UploadRequest(const std::string& id) {
    wire::UploadRequest req;
    req.num_examples = 100;
    req.nonce = round_.nonces[id];
    return wire::MakeMessage(req, round_.number, id);
  }

  wire::Message Result(const std::string& id) {
    wire::FitResult r;
    r.num_examples = 100;
    r.train_loss = 0.5;
    r.model_version = 7;
    r.nonce = round_.nonces[id];
    wire::Message msg = wire::MakeMessage(r, round_.number, id);
    msg.tensors = wire::ShareAll(
        std::make_shared<const TensorList>(testing::HonestDelta(layout_, round_.number, id)));
    return msg;
  }

  CoordinatorOptions options_;
  testing::ManualClock clock_;
  RecordingTransport transport_;
  RecordingHost host_;
  ModelLayout layout_;
  Population population_{&clock_, 0};
  UploadSlots slots_{&transport_, &clock_, 1, 60'000};
  std::optional<aggregation::StreamingAggregator> aggregator_;
  std::optional<RoundPrivacy> privacy_;
  std::optional<SyncRound> sync_;
  Round round_;
};

TEST_F(SyncRoundTest, EachMemberGetsTheModelWithAFreshNonce) {
  Open(1, {"a", "b"});
  const auto fits = transport_.To("peer-a", wire::MessageType::kFitInstruction);
  ASSERT_EQ(fits.size(), 1u);
  const auto& fit = std::get<wire::FitInstruction>(fits[0].body);
  EXPECT_EQ(fit.model_version, 7u);
  EXPECT_EQ(fit.nonce, round_.nonces["a"]);
  EXPECT_NE(round_.nonces["a"], round_.nonces["b"]);
  EXPECT_EQ(fits[0].tensors.size(), layout_.size());
  EXPECT_EQ(round_.fits_sent["a"], 1);
}

TEST_F(SyncRoundTest, SlotsAreGrantedInRequestOrderAndResultsFoldUnderTheirGrant) {
  Open(1, {"a", "b"});
  sync_->OnUploadRequest("b", UploadRequest("b"));
  sync_->OnUploadRequest("a", UploadRequest("a"));
  EXPECT_EQ(round_.members["b"], MemberState::kUploading);
  EXPECT_EQ(round_.members["a"], MemberState::kWaitingSlot) << "one slot, b asked first";
  EXPECT_EQ(transport_.To("peer-a", wire::MessageType::kUploadGrant).size(), 0u);

  sync_->OnFitResult("a", Result("a"));
  EXPECT_EQ(round_.metrics.rejected, 1) << "a holds no grant yet";
  EXPECT_EQ(host_.refusals.back().second, wire::ErrorCode::kRejected);

  sync_->OnFitResult("b", Result("b"));
  EXPECT_EQ(round_.members["b"], MemberState::kDone);
  EXPECT_EQ(round_.members["a"], MemberState::kUploading) << "b's slot went to a";
  sync_->OnFitResult("a", Result("a"));
  EXPECT_EQ(round_.metrics.results, 2);
  EXPECT_EQ(round_.metrics.examples, 200);
  EXPECT_DOUBLE_EQ(round_.weighted_loss, 100.0);

  int64_t wait_ms = 0;
  EXPECT_FALSE(sync_->Step(&wait_ms)) << "every member is done";
}

TEST_F(SyncRoundTest, EachFoldedResultsUploadIsTimedFromItsGrant) {
  Open(1, {"a", "b", "c"});
  sync_->OnUploadRequest("b", UploadRequest("b"));  // granted now
  sync_->OnUploadRequest("a", UploadRequest("a"));  // waits for b's slot
  sync_->OnUploadRequest("c", UploadRequest("c"));
  clock_.Advance(250);
  sync_->OnFitResult("b", Result("b"));  // a is granted now
  clock_.Advance(1'500);
  sync_->OnFitResult("a", Result("a"));  // c is granted now
  clock_.Advance(40);
  wire::Message bad = Result("c");
  std::get<wire::FitResult>(bad.body).model_version = 6;
  sync_->OnFitResult("c", bad);
  EXPECT_EQ(round_.members["c"], MemberState::kFailed);
  EXPECT_EQ(round_.metrics.results, 2);
  // The waits for a slot are not the uploads'; a refused result contributed nothing.
  EXPECT_EQ(round_.metrics.upload_seconds, (std::vector<double>{0.25, 1.5}));
}

TEST_F(SyncRoundTest, StaleRoundsNoncesAndErrorsAreRefusedThroughTheHost) {
  Open(2, {"a", "b", "c"});
  wire::Message old = UploadRequest("a");
  old.round = 1;
  sync_->OnUploadRequest("a", old);
  EXPECT_EQ(host_.stale, 1);
  EXPECT_EQ(host_.refusals.back(),
            std::make_pair(std::string("peer-a"), wire::ErrorCode::kWrongRound));

  wire::Message replay = UploadRequest("a");
  std::get<wire::UploadRequest>(replay.body).nonce = round_.nonces["b"];
  sync_->OnUploadRequest("a", replay);
  EXPECT_EQ(round_.metrics.rejected, 1);
  EXPECT_EQ(round_.members["a"], MemberState::kTraining) << "still due to answer";

  sync_->OnClientError("b", wire::MakeError(wire::ErrorCode::kRejected, "policy", 2));
  EXPECT_EQ(round_.metrics.declined, 1);
  EXPECT_EQ(round_.members["b"], MemberState::kFailed);

  sync_->OnUploadRequest("c", UploadRequest("c"));
  wire::Message bad = Result("c");
  std::get<wire::FitResult>(bad.body).model_version = 6;
  sync_->OnFitResult("c", bad);
  EXPECT_EQ(round_.members["c"], MemberState::kFailed);
  EXPECT_EQ(host_.refusals.back().second, wire::ErrorCode::kInvalidUpdate);
  EXPECT_FALSE(round_.first_rejection.empty());
  EXPECT_EQ(slots_.held(), 0) << "a refused result gives its slot back";
}

TEST_F(SyncRoundTest, TheDeadlineFailsOpenMembersAndEndClosesTheRound) {
  Open(1, {"a", "b"});
  int64_t wait_ms = 0;
  ASSERT_TRUE(sync_->Step(&wait_ms));
  EXPECT_EQ(wait_ms, 60'000);
  clock_.Advance(60'000);
  EXPECT_FALSE(sync_->Step(&wait_ms));
  EXPECT_EQ(round_.members["a"], MemberState::kFailed);
  EXPECT_EQ(round_.members["b"], MemberState::kFailed);

  sync_->End();
  sync_->OnFitResult("a", Result("a"));
  EXPECT_EQ(host_.stale, 1) << "no round is open";
  sync_->FailMember("a", "no round: a no-op");
}

}  // namespace
}  // namespace huddle::coordinator
