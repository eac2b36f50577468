// The secure aggregation of one round as a part of its own (coordinator/secure_round.h), driven
// directly: real certified members (client::SecAggMember) answer its stage messages through a
// scripted host, which grants upload slots at once and records what the session asks of it.
// Simulated time: a stage that waits for a member shows only as a clock that had to be advanced.
#include "coordinator/secure_round.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "client/secagg_member.h"
#include "common/member_certificate.h"
#include "privacy/noise.h"
#include "tests/coordinator/fake_federation.h"

namespace huddle::coordinator {
namespace {

namespace secagg = aggregation::secagg;

const ModelLayout kLayout = {{"w", DType::kFloat32, {8, 4}}, {"b", DType::kFloat32, {3}}};
constexpr int64_t kStageTimeoutMs = 60'000;
constexpr uint64_t kRound = 7;
constexpr int64_t kUploadMs = 40;  // each member's upload, from its grant to its masked input

// Member i's update: small values, distinct per member and coordinate.
TensorList UpdateOf(int i) {
  TensorList update;
  int k = 0;
  for (const TensorSpec& spec : kLayout) {
    Tensor& t = update.emplace_back(spec.name, spec.shape);
    for (float& v : t.data) v = 0.01f * static_cast<float>((i + 1) * ((k++ % 5) - 2));
  }
  return update;
}

// The session's host and its members: what it sends is delivered to the members, whose answers go
// back to the session; every call it makes is recorded.
class Federation : public SecureRoundHost {
 public:
  explicit Federation(int n) {
    for (int i = 0; i < n; ++i) {
      const std::string id = "site-" + std::to_string(i);
      ids_.push_back(id);
      client::SecAggIdentity identity;
      identity.id = id;
      identity.policy.project_key = project_.public_key();
      identity.policy.corrupt_fraction = 0.1;
      identity.policy.cache = &cache_;
      MemberCertificate c;
      c.id = id;
      c.transport_key =
          secagg::Hash(std::span(reinterpret_cast<const uint8_t*>(id.data()), id.size()));
      c.signing_key = identity.key.public_key();
      certificates_[id] = Certify(c, project_);
      identities_.emplace(id, std::move(identity));
      members_[id] = MemberState::kTraining;
    }
    options_.enabled = true;
    options_.stage_timeout_ms = kStageTimeoutMs;
    options_.min_survivor_fraction = 0.5;
    options_.graph.dropout_fraction = 0.3;
    options_.certificates = [this](const std::string& id) -> std::optional<MemberCertificate> {
      auto c = certificates_.find(id);
      if (c == certificates_.end()) return std::nullopt;
      return c->second;
    };
  }

  SecureRoundSettings Settings() const {
    SecureRoundSettings s;
    s.round = kRound;
    s.deadline_ms = clock_.NowMs() + 10'000;
    s.job_name = "secure-round-test";
    s.options = &options_;
    s.layout = kLayout;
    s.quorum = 1;
    s.clip_norm = 10;
    return s;
  }

  // Starts the session for every member; nullptr when it trains nothing.
  std::unique_ptr<SecureRound> Start(SecureRoundSettings settings) {
    auto started =
        SecureRound::Start(std::move(settings), ids_, &members_, &excluded_, this, &clock_);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return nullptr;
    round_ptr_ = started->get();
    return std::move(*started);
  }

  // Member `id` trains: its part in the session from the instruction, then its advertisement.
  Status Train(SecureRound& round, const std::string& id) {
    const std::string nonce = "nonce-" + id;
    nonces_[id] = nonce;
    auto member = client::SecAggMember::Create(round.Instruction(id), nonce, UpdateOf(Index(id)),
                                               100, noise_, identities_.at(id));
    if (!member.ok()) return member.status();
    parts_.insert_or_assign(id, std::move(*member));
    return round.OnMessage(id, parts_.at(id).Advertise(kRound, id), nonce, 0);
  }

  // Steps the session and delivers its messages until it is over; members in `silent` never
  // answer. Bounded: a session that needs more steps fails the test.
  void Run(SecureRound& round, const std::set<std::string>& silent = {}) {
    for (int step = 0; step < 200 && round.Step(); ++step) {
      bool delivered = false;
      while (!outbox_.empty()) {
        auto [id, msg] = std::move(outbox_.front());
        outbox_.pop_front();
        if (silent.count(id) != 0 || parts_.count(id) == 0) continue;
        auto replies = parts_.at(id).OnMessage(msg, "coordinator");
        ASSERT_TRUE(replies.ok()) << id << ": " << replies.status();
        for (const wire::Message& reply : *replies) {
          Status st = round.OnMessage(id, reply, nonces_[id], 0);
          ASSERT_TRUE(st.ok()) << id << ": " << st;
        }
        delivered = true;
      }
      // Stage 4: every member asked to mask gets its upload slot at once, and uploads in
      // kUploadMs.
      std::vector<std::string> granted;
      for (auto& [id, state] : members_) {
        if (state != MemberState::kSecAggMasking || silent.count(id) != 0) continue;
        state = MemberState::kUploading;
        round.OnUploadGranted(id, &uploads_);
        granted.push_back(id);
      }
      if (!granted.empty()) clock_.Advance(kUploadMs);
      for (const std::string& id : granted) {
        ASSERT_TRUE(parts_.at(id).masked());
        Status st =
            round.OnMessage(id, parts_.at(id).MaskedInput(kRound, 0, id, kLayout), nonces_[id], 0);
        ASSERT_TRUE(st.ok()) << id << ": " << st;
        delivered = true;
      }
      if (!delivered) clock_.Advance(round.TimeoutMs() + 1);  // nothing moved: wait it out
    }
  }

  // SecureRoundHost.
  Status SendToMember(const std::string& id, const wire::Message& msg) override {
    if (left_.count(id) != 0) return absl::NotFoundError("left");
    if (msg.type() == wire::MessageType::kSecAggData &&
        std::get<wire::SecAggData>(msg.body).stage ==
            static_cast<uint32_t>(secagg::Stage::kUnmask)) {
      unmask_requests_++;
      if (accounted_ == 0) unmask_before_account_ = true;
    }
    outbox_.emplace_back(id, msg);
    return absl::OkStatus();
  }
  void FailMember(const std::string& id, const char* why) override {
    auto m = members_.find(id);
    if (m == members_.end() || !IsOpen(m->second)) return;
    m->second = MemberState::kFailed;
    failed_[id] = why;
    if (round_ptr_ != nullptr) round_ptr_->OnMemberFailed(id);
  }
  void SendFit(const std::string& id, int64_t deadline_ms) override {
    fits_.push_back(id);
    deadline_ms_ = deadline_ms;
  }
  StatusOr<std::pair<privacy::Spend, bool>> WouldSpend(const privacy::LedgerEntry&) override {
    return std::pair<privacy::Spend, bool>{privacy::Spend{}, false};
  }
  Status Account(const privacy::LedgerEntry& entry) override {
    accounted_++;
    ledger_.push_back(entry);
    return absl::OkStatus();
  }

  int Index(const std::string& id) const {
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i] == id) return static_cast<int>(i);
    }
    return -1;
  }
  // The plain sum of the updates of `ids`.
  TensorList PlainSum(const std::vector<std::string>& ids) const {
    TensorList sum = UpdateOf(0);
    for (Tensor& t : sum) std::fill(t.data.begin(), t.data.end(), 0.0f);
    for (const std::string& id : ids) {
      TensorList u = UpdateOf(Index(id));
      for (size_t i = 0; i < sum.size(); ++i) {
        for (size_t j = 0; j < sum[i].data.size(); ++j) sum[i].data[j] += u[i].data[j];
      }
    }
    return sum;
  }

  testing::ManualClock clock_;
  SecureAggregationOptions options_;
  SigningKey project_ = SigningKey::Generate();
  secagg::SignatureCache cache_;
  privacy::NoiseSource noise_ = privacy::NoiseSource::SeededForTesting(5);
  std::vector<std::string> ids_;
  std::map<std::string, client::SecAggIdentity> identities_;
  std::map<std::string, MemberCertificate> certificates_;
  std::map<std::string, client::SecAggMember> parts_;
  std::map<std::string, std::string> nonces_;
  RoundMembers members_;
  std::set<std::string> excluded_;
  std::set<std::string> left_;
  std::deque<std::pair<std::string, wire::Message>> outbox_;
  std::map<std::string, std::string> failed_;
  std::vector<std::string> fits_;
  int64_t deadline_ms_ = 0;
  int accounted_ = 0;
  int unmask_requests_ = 0;
  bool unmask_before_account_ = false;
  std::vector<privacy::LedgerEntry> ledger_;
  SecureRound* round_ptr_ = nullptr;  // the session FailMember reports to
  std::vector<double> uploads_;       // the masked inputs' upload durations (OnUploadGranted)
};

void ExpectNear(const TensorList& got, const TensorList& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].data.size(), want[i].data.size());
    for (size_t j = 0; j < got[i].data.size(); ++j) {
      EXPECT_NEAR(got[i].data[j], want[i].data[j], tolerance)
          << got[i].spec.name << "[" << j << "]";
    }
  }
}

TEST(SecureRound, ReleasesTheMembersSumAndTheirMean) {
  Federation f(6);
  std::unique_ptr<SecureRound> round = f.Start(f.Settings());
  ASSERT_NE(round, nullptr);
  EXPECT_EQ(round->metrics().members, 6);
  for (const std::string& id : f.ids_) ASSERT_TRUE(f.Train(*round, id).ok());
  f.Run(*round);
  ASSERT_TRUE(round->sum().has_value()) << round->failure();
  EXPECT_EQ(round->failure(), "");
  EXPECT_EQ(round->survivors(), 6);
  EXPECT_EQ(round->examples(), -1);  // uniform weights: no example count
  // Stochastic rounding moves each value by less than one grid step per member.
  ExpectNear(*round->sum(), f.PlainSum(f.ids_), 1e-4);
  TensorList mean;
  ASSERT_TRUE(round->Mean(&mean).ok());
  TensorList want = *round->sum();
  for (Tensor& t : want) {
    for (float& v : t.data) v = static_cast<float>(v / 6.0);
  }
  ExpectNear(mean, want, 0);
  for (const auto& [id, state] : f.members_) EXPECT_EQ(state, MemberState::kDone) << id;
  EXPECT_TRUE(round->metrics().released);
  EXPECT_EQ(round->metrics().masked, 6);
  // Each masked input's upload, timed from its grant.
  EXPECT_EQ(f.uploads_, std::vector<double>(6, kUploadMs / 1000.0));
  EXPECT_TRUE(f.failed_.empty());
  EXPECT_EQ(f.accounted_, 0);  // no DP: nothing for the ledger
  EXPECT_FALSE(round->Step());
}

TEST(SecureRound, AMemberSilentAfterTheRevealIsADropoutAndTheOthersSumIsReleased) {
  Federation f(8);
  std::unique_ptr<SecureRound> round = f.Start(f.Settings());
  ASSERT_NE(round, nullptr);
  for (const std::string& id : f.ids_) ASSERT_TRUE(f.Train(*round, id).ok());
  // site-5 reveals, then stops answering: it fails for its shares at the stage's deadline.
  ASSERT_TRUE(round->Step());  // stage 0 ends: every member advertised
  std::deque<std::pair<std::string, wire::Message>> list = std::exchange(f.outbox_, {});
  for (auto& [id, msg] : list) {
    auto replies = f.parts_.at(id).OnMessage(msg, "coordinator");
    ASSERT_TRUE(replies.ok()) << replies.status();
    for (const wire::Message& reply : *replies) {
      ASSERT_TRUE(round->OnMessage(id, reply, f.nonces_[id], 0).ok());
    }
  }
  f.Run(*round, {"site-5"});
  ASSERT_TRUE(round->sum().has_value()) << round->failure();
  EXPECT_EQ(f.failed_.count("site-5"), 1u);
  EXPECT_EQ(f.members_["site-5"], MemberState::kFailed);
  std::vector<std::string> others;
  for (const std::string& id : f.ids_) {
    if (id != "site-5") others.push_back(id);
  }
  EXPECT_EQ(round->survivors(), 7);
  EXPECT_EQ(f.uploads_.size(), 7u) << "the silent member uploaded nothing";
  ExpectNear(*round->sum(), f.PlainSum(others), 1e-4);
}

TEST(SecureRound, ACohortOfOneTrainsNothing) {
  Federation f(1);
  auto started = SecureRound::Start(f.Settings(), f.ids_, &f.members_, &f.excluded_, &f, &f.clock_);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(*started, nullptr);
}

TEST(SecureRound, RefusesUncertifiedOutOfTurnAndUngrantedMessages) {
  Federation f(4);
  f.certificates_.erase("site-2");
  std::unique_ptr<SecureRound> round = f.Start(f.Settings());
  ASSERT_NE(round, nullptr);
  Status uncertified = f.Train(*round, "site-2");
  EXPECT_EQ(uncertified.code(), absl::StatusCode::kFailedPrecondition) << uncertified;
  EXPECT_NE(uncertified.message().find("client site-2 has no certificate"), std::string::npos)
      << uncertified;
  ASSERT_TRUE(f.Train(*round, "site-0").ok());
  // A second advertisement from a member no longer training.
  Status again = round->OnMessage("site-0", f.parts_.at("site-0").Advertise(kRound, "site-0"),
                                  f.nonces_["site-0"], 0);
  EXPECT_NE(again.message().find("out of turn"), std::string::npos) << again;
  // A stale nonce.
  Status stale = round->OnMessage("site-3", f.parts_.at("site-0").Advertise(kRound, "site-3"),
                                  "another nonce", 0);
  EXPECT_NE(stale.message().find("stale nonce"), std::string::npos) << stale;
  // A masked input before stage 4, without a grant.
  wire::Message masked =
      wire::MakeMessage(wire::SecAggMaskedInput{f.nonces_["site-0"], 0}, kRound, "site-0");
  Status ungranted = round->OnMessage("site-0", masked, f.nonces_["site-0"], 0);
  EXPECT_NE(ungranted.message().find("without an upload grant"), std::string::npos) << ungranted;
}

TEST(SecureRound, NoAdvertisementByTheDeadlineRefusesTheSessionAndReleasesNothing) {
  Federation f(4);
  std::unique_ptr<SecureRound> round = f.Start(f.Settings());
  ASSERT_NE(round, nullptr);
  EXPECT_TRUE(round->Step());  // members still training before the deadline
  EXPECT_GT(round->TimeoutMs(), 0);
  f.clock_.Advance(round->TimeoutMs());
  EXPECT_FALSE(round->Step());
  EXPECT_FALSE(round->sum().has_value());
  EXPECT_NE(round->failure(), "");
  EXPECT_FALSE(round->metrics().released);
  EXPECT_EQ(round->metrics().failure, round->failure());
  for (const std::string& id : f.ids_) {
    EXPECT_EQ(f.failed_[id], "missed the deadline") << id;
  }
}

TEST(SecureRound, AMemberThatLeftTheFederationFailsWhenItsStageIsSent) {
  Federation f(6);
  std::unique_ptr<SecureRound> round = f.Start(f.Settings());
  ASSERT_NE(round, nullptr);
  for (const std::string& id : f.ids_) ASSERT_TRUE(f.Train(*round, id).ok());
  f.left_.insert("site-4");  // its key was revoked after it advertised
  ASSERT_TRUE(round->Step());
  EXPECT_EQ(f.failed_["site-4"], "left the federation during secure aggregation");
  EXPECT_FALSE(round->Awaits("site-4", MemberState::kFailed));
  EXPECT_TRUE(round->Awaits("site-1", MemberState::kSecAgg));
}

TEST(SecureRound, DistributedDpIsAccountedBeforeAnyUnmaskingShareIsAskedFor) {
  Federation f(10);
  SecureRoundSettings s = f.Settings();
  s.dp = true;
  s.distributed = true;
  s.clip_norm = 1;
  s.noise_multiplier = 1.0;
  s.options = &f.options_;
  std::unique_ptr<SecureRound> round = f.Start(s);
  ASSERT_NE(round, nullptr);
  ASSERT_TRUE(round->distributed().has_value());
  EXPECT_FALSE(round->accounted());
  for (const std::string& id : f.ids_) ASSERT_TRUE(f.Train(*round, id).ok());
  f.Run(*round);
  ASSERT_TRUE(round->sum().has_value()) << round->failure();
  EXPECT_TRUE(round->accounted());
  EXPECT_EQ(f.accounted_, 1);
  EXPECT_GT(f.unmask_requests_, 0);
  EXPECT_FALSE(f.unmask_before_account_);
  ASSERT_EQ(f.ledger_.size(), 1u);
  EXPECT_EQ(f.ledger_[0].round, kRound);
  EXPECT_EQ(f.ledger_[0].job, "secure-round-test");
  EXPECT_GT(round->SumNoiseStddev(), 0);
}

}  // namespace
}  // namespace huddle::coordinator
