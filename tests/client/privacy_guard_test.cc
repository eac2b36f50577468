// A client's own privacy policy against a coordinator that asks for too little noise, asks twice
// for the same round, or wants to learn about the client's data: the agent with a PrivacyGuard.
#include "client/privacy_guard.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "client/agent.h"
#include "client/config.h"
#include "models/wire_spec.h"
#include "tests/models/test_data.h"

namespace huddle::client {
namespace {

class PrivacyGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = models::Blobs(96, 6, 3, 3);
    view_.base = &data_;
    spec_.input_dim = 6;
    spec_.hidden = {4};
    spec_.num_classes = 3;
    global_ = models::InitModel(spec_, 5);
    dir_ =
        std::filesystem::path(::testing::TempDir()) /
        ("guard_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Ledger() const { return (dir_ / "ledger.jsonl").string(); }
  static std::string ReadText(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // The guard refuses to open the ledger, saying how to recover.
  void ExpectRefused(const std::string& what) const {
    auto guard = PrivacyGuard::Open(LocalPolicy());
    ASSERT_FALSE(guard.ok()) << what << ": opened with " << guard->entries().size() << " entries";
    EXPECT_TRUE(absl::IsDataLoss(guard.status())) << what << ": " << guard.status();
    EXPECT_NE(guard.status().message().find("privacy.acknowledge_ledger_loss"),
              absl::string_view::npos)
        << what << ": " << guard.status();
  }

  // A policy that requires local DP with z >= 1 and at most `max_epsilon`.
  ClientPrivacyPolicy LocalPolicy(std::optional<double> max_epsilon = std::nullopt) const {
    ClientPrivacyPolicy p;
    p.local.emplace();
    p.local->require = true;
    p.local->min_noise_multiplier = 1.0;
    p.local->max_epsilon = max_epsilon;
    p.ledger_path = Ledger();
    return p;
  }

  ClientAgent Agent(ClientPrivacyPolicy policy) {
    ClientAgent agent("edge-1", &view_);
    auto guard = PrivacyGuard::Open(std::move(policy));
    EXPECT_TRUE(guard.ok()) << guard.status();
    agent.set_privacy_guard(*std::move(guard));
    agent.set_noise_source(privacy::NoiseSource::SeededForTesting(17));
    EXPECT_TRUE(
        agent.Handle(wire::MakeMessage(wire::Welcome{"job", models::ModelSpecToWire(spec_), 500}))
            .ok());
    return agent;
  }

  // A fit instruction; `nonce` and `seed` differ between a first request and a coordinator's
  // restarted request for the same round.
  wire::Message Fit(uint64_t round, wire::UpdatePrivacy privacy, uint64_t seed = 99,
                    char nonce = 'n', const TensorList* global = nullptr) {
    wire::FitInstruction fit;
    fit.model_version = round - 1;
    fit.train.batch_size = 8;
    fit.train.learning_rate = 0.1;
    fit.train.momentum = 0.0;
    fit.seed = seed;
    fit.nonce = std::string(wire::kNonceBytes, nonce);
    fit.privacy = privacy;
    wire::Message m = wire::MakeMessage(fit, round);
    for (const Tensor& t : global ? *global : global_) {
      m.tensors.push_back(wire::TensorPayload::CopyOf(t));
    }
    return m;
  }
  static wire::UpdatePrivacy LocalDp(double z, double clip = 1.0) {
    return {wire::UpdatePrivacy::Mode::kLocal, clip, z};
  }

  // The FitResult the agent uploads after a grant.
  static wire::Message Upload(ClientAgent& agent, uint64_t round) {
    auto up = agent.Handle(wire::MakeMessage(wire::UploadGrant{}, round));
    EXPECT_TRUE(up.ok() && up->size() == 1u);
    return up.ok() && !up->empty() ? (*up)[0] : wire::Message{};
  }
  static std::vector<float> Flat(const wire::Message& m) {
    std::vector<float> out;
    for (const auto& t : m.tensors) out.insert(out.end(), t.floats().begin(), t.floats().end());
    return out;
  }

  data::Dataset data_;
  data::DatasetView view_;
  models::MlpSpec spec_;
  TensorList global_;
  std::filesystem::path dir_;
};

TEST_F(PrivacyGuardTest, TooLittleNoiseIsDeclinedAndNothingIsTrained) {
  ClientAgent agent = Agent(LocalPolicy());
  auto replies = agent.Handle(Fit(1, LocalDp(0.5)));
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 1u);
  ASSERT_EQ((*replies)[0].type(), wire::MessageType::kError);
  const auto& err = std::get<wire::Error>((*replies)[0].body);
  EXPECT_EQ(err.code, wire::ErrorCode::kRejected);
  EXPECT_NE(err.message.find("min_noise_multiplier"), std::string::npos) << err.message;
  EXPECT_EQ(agent.rounds_trained(), 0);
  EXPECT_TRUE(agent.privacy_guard().entries().empty());
  // Central mode or no DP at all: refused too (the policy requires local DP).
  for (auto mode : {wire::UpdatePrivacy::Mode::kCentral, wire::UpdatePrivacy::Mode::kNone}) {
    auto r = agent.Handle(Fit(1, {mode, 1.0, 0}));
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->size(), 1u);
    EXPECT_EQ((*r)[0].type(), wire::MessageType::kError);
  }
}

TEST_F(PrivacyGuardTest, TheClientsEpsilonIsCappedByItsOwnDurableLedger) {
  // Replace-one: z = 4 is the Gaussian of multiplier 2 per round.
  const std::vector<privacy::DpEvent> two = {{1.0, 2.0, 2}}, three = {{1.0, 2.0, 3}};
  const double eps2 =
      privacy::ComputeEpsilon(two, 1e-5, privacy::AccountantKind::kAnalytic)->epsilon;
  const double eps3 =
      privacy::ComputeEpsilon(three, 1e-5, privacy::AccountantKind::kAnalytic)->epsilon;
  const double cap = (eps2 + eps3) / 2;
  {
    ClientAgent agent = Agent(LocalPolicy(cap));
    for (uint64_t round = 1; round <= 2; ++round) {
      auto r = agent.Handle(Fit(round, LocalDp(4.0)));
      ASSERT_TRUE(r.ok());
      ASSERT_EQ((*r)[0].type(), wire::MessageType::kUploadRequest) << round;
    }
    EXPECT_DOUBLE_EQ(agent.privacy_guard().LocalSpent()->epsilon, eps2);
  }
  // A new process (the client restarted): the ledger remembers, so round 3 would pass the cap.
  ClientAgent agent = Agent(LocalPolicy(cap));
  EXPECT_EQ(agent.privacy_guard().entries().size(), 2u);
  auto r = agent.Handle(Fit(3, LocalDp(4.0)));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ((*r)[0].type(), wire::MessageType::kError);
  EXPECT_NE(std::get<wire::Error>((*r)[0].body).message.find("max_epsilon"), std::string::npos);
  const privacy::LedgerEntry& e = agent.privacy_guard().entries()[0];
  EXPECT_EQ(e.adjacency, privacy::kReplaceOne);
  EXPECT_EQ(e.event().noise_multiplier, 2.0);
  EXPECT_EQ(e.job, "job");
  EXPECT_FALSE(e.release.empty());
}

TEST_F(PrivacyGuardTest, ARoundAskedAgainGetsTheSameNoisedUpdateNeverASecondDraw) {
  std::vector<float> first;
  {
    ClientAgent agent = Agent(LocalPolicy());
    ASSERT_EQ((*agent.Handle(Fit(5, LocalDp(2.0))))[0].type(), wire::MessageType::kUploadRequest);
    first = Flat(Upload(agent, 5));
    // The coordinator restarted (new nonce, new seed) and asks for round 5 of the same model.
    ASSERT_EQ((*agent.Handle(Fit(5, LocalDp(2.0), 1234, 'm')))[0].type(),
              wire::MessageType::kUploadRequest);
    const wire::Message again = Upload(agent, 5);
    EXPECT_EQ(std::get<wire::FitResult>(again.body).nonce, std::string(wire::kNonceBytes, 'm'));
    const std::vector<float> second = Flat(again);
    ASSERT_EQ(second.size(), first.size());
    EXPECT_EQ(std::memcmp(second.data(), first.data(), first.size() * 4), 0);
    EXPECT_EQ(agent.privacy_guard().entries().size(), 1u);
    EXPECT_EQ(agent.rounds_trained(), 1);
  }
  // The client restarted too: the kept release is read back from disk.
  ClientAgent agent = Agent(LocalPolicy());
  ASSERT_EQ((*agent.Handle(Fit(5, LocalDp(2.0), 77, 'k')))[0].type(),
            wire::MessageType::kUploadRequest);
  const std::vector<float> third = Flat(Upload(agent, 5));
  ASSERT_EQ(third.size(), first.size());
  EXPECT_EQ(std::memcmp(third.data(), first.data(), first.size() * 4), 0);
  EXPECT_EQ(agent.privacy_guard().entries().size(), 1u);
  // Another model (or round, or noise setting) is another release, accounted.
  TensorList other = global_;
  other[0].data[0] += 1;
  ASSERT_EQ((*agent.Handle(Fit(5, LocalDp(2.0), 77, 'k', &other)))[0].type(),
            wire::MessageType::kUploadRequest);
  EXPECT_EQ(agent.privacy_guard().entries().size(), 2u);
}

// A client's ledger that lost entries (truncated, torn, its last line dropped or deleted by an
// operator, an attacker or a crash) is refused: opening it would let the client spend again what
// it spent already, and noise a release twice.
TEST_F(PrivacyGuardTest, ALedgerThatLostReleasesIsRefusedWithHowToRecover) {
  {
    ClientAgent agent = Agent(LocalPolicy());
    for (uint64_t round = 1; round <= 2; ++round) {
      ASSERT_EQ((*agent.Handle(Fit(round, LocalDp(2.0))))[0].type(),
                wire::MessageType::kUploadRequest);
    }
  }
  const std::string intact = ReadText(Ledger());
  const size_t last = intact.rfind('\n', intact.size() - 2) + 1;  // where the last line starts
  const std::vector<std::pair<std::string, std::string>> damaged = {
      {"the last line dropped", intact.substr(0, last)},
      {"the last line torn", intact.substr(0, last + 20)},
      {"only the last newline torn", intact.substr(0, intact.size() - 1)},
      {"truncated to nothing", ""},
  };
  for (const auto& [what, text] : damaged) {
    std::ofstream(Ledger(), std::ios::binary | std::ios::trunc) << text;
    ExpectRefused(what);
  }
  std::filesystem::remove(Ledger());
  ExpectRefused("deleted");
  // Its mark deleted too: the kept release says a release was made.
  std::filesystem::remove(Ledger() + ".mark");
  ExpectRefused("deleted with its mark");
  // Restored from a backup, it opens again.
  std::filesystem::remove(Ledger());
  std::ofstream(Ledger(), std::ios::binary) << intact;
  std::filesystem::remove(Ledger() + ".mark");
  auto guard = PrivacyGuard::Open(LocalPolicy());
  EXPECT_FALSE(guard.ok()) << "a chained ledger without its mark";
}

TEST_F(PrivacyGuardTest, ACorruptKeptReleaseOfAnIntactLedgerIsIgnored) {
  {
    ClientAgent agent = Agent(LocalPolicy());
    ASSERT_EQ((*agent.Handle(Fit(1, LocalDp(2.0))))[0].type(), wire::MessageType::kUploadRequest);
  }
  std::ofstream(Ledger() + ".last_release", std::ios::trunc) << "garbage";
  auto reopened = PrivacyGuard::Open(LocalPolicy());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(reopened->entries().size(), 1u);
}

// End to end: the ledger deleted after round 2's release, the client restarted, and the
// coordinator asks for round 2 again. The client must never send a second noised version of it.
TEST_F(PrivacyGuardTest, AfterALostLedgerARoundIsNeverNoisedTwice) {
  std::vector<float> first;
  {
    ClientAgent agent = Agent(LocalPolicy(/*max_epsilon=*/45));
    ASSERT_EQ((*agent.Handle(Fit(1, LocalDp(2.0))))[0].type(), wire::MessageType::kUploadRequest);
    ASSERT_EQ((*agent.Handle(Fit(2, LocalDp(2.0))))[0].type(), wire::MessageType::kUploadRequest);
    first = Flat(Upload(agent, 2));
  }
  std::filesystem::remove(Ledger());
  auto refused = PrivacyGuard::Open(LocalPolicy(45));
  ASSERT_FALSE(refused.ok()) << "a deleted ledger opened: round 2 would be noised again";
  EXPECT_TRUE(absl::IsDataLoss(refused.status())) << refused.status();
  // The operator acknowledges the loss: the client goes on, round 2 asked again gets the very
  // bytes sent before, and the lost releases count as an unbounded spend.
  ClientPrivacyPolicy acknowledged = LocalPolicy(45);
  acknowledged.acknowledge_ledger_loss = true;
  {
    ClientAgent agent = Agent(acknowledged);
    ASSERT_EQ((*agent.Handle(Fit(2, LocalDp(2.0), 5, 'z')))[0].type(),
              wire::MessageType::kUploadRequest);
    const std::vector<float> second = Flat(Upload(agent, 2));
    ASSERT_EQ(second.size(), first.size());
    EXPECT_EQ(std::memcmp(second.data(), first.data(), first.size() * 4), 0)
        << "round 2 was noised and released twice";
    EXPECT_EQ(agent.rounds_trained(), 0);
    EXPECT_TRUE(std::isinf(agent.privacy_guard().LocalSpent()->epsilon));
    auto r3 = agent.Handle(Fit(3, LocalDp(2.0)));
    ASSERT_TRUE(r3.ok());
    ASSERT_EQ((*r3)[0].type(), wire::MessageType::kError);
    EXPECT_NE(std::get<wire::Error>((*r3)[0].body).message.find("max_epsilon"), std::string::npos);
  }
  // Recovered: the ledger opens without the acknowledgement, still unbounded.
  auto reopened = PrivacyGuard::Open(LocalPolicy(45));
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_TRUE(std::isinf(reopened->LocalSpent()->epsilon));
}

TEST_F(PrivacyGuardTest, TheAcknowledgementIsAClientConfigKey) {
  const std::string path = (dir_ / "client.yaml").string();
  std::ofstream(path) << "coordinator: tcp://h:1\nclient_id: a\n"
                         "security: {server_public_key: s.pub, secret_key: a.key}\n"
                         "privacy: {ledger: ledger.jsonl, acknowledge_ledger_loss: true,\n"
                         "          local: {max_epsilon: 8}}\n";
  auto config = LoadClientConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->privacy.acknowledge_ledger_loss);
}

TEST_F(PrivacyGuardTest, UnderLocalDpNothingElseAboutTheDataIsSent) {
  ClientAgent agent = Agent(LocalPolicy());
  const wire::Message join = agent.MakeJoin();
  EXPECT_EQ(std::get<wire::Join>(join.body).num_examples, 0u);
  auto replies = agent.Handle(Fit(1, LocalDp(2.0)));
  ASSERT_TRUE(replies.ok());
  EXPECT_EQ(std::get<wire::UploadRequest>((*replies)[0].body).num_examples, 1u);
  const wire::Message uploaded = Upload(agent, 1);
  const auto& result = std::get<wire::FitResult>(uploaded.body);
  EXPECT_EQ(result.num_examples, 1u);
  EXPECT_EQ(result.train_loss, 0.0);
  EXPECT_EQ(result.train_accuracy, 0.0);
  EXPECT_EQ(result.train_seconds, 0.0);
  EXPECT_FALSE(result.within_clip);
}

TEST_F(PrivacyGuardTest, ThePolicysClipNormBoundsTheUpdate) {
  ClientPrivacyPolicy policy = LocalPolicy();
  policy.local->clip_norm = 0.01;
  ClientAgent agent = Agent(policy);
  ASSERT_EQ((*agent.Handle(Fit(1, LocalDp(1.0, /*clip=*/100.0))))[0].type(),
            wire::MessageType::kUploadRequest);
  EXPECT_EQ(agent.privacy_guard().entries()[0].clip_norm, 0.01);
  // Noise of std z * 0.01 on 43 coordinates: the update is far below the coordinator's 100.
  double norm2 = 0;
  for (float v : Flat(Upload(agent, 1))) norm2 += static_cast<double>(v) * v;
  EXPECT_LT(std::sqrt(norm2), 1.0);
}

TEST_F(PrivacyGuardTest, DpSgdIsAccountedAndCappedByTheClient) {
  ClientPrivacyPolicy policy;
  policy.dp_sgd.emplace();
  policy.dp_sgd->min_noise_multiplier = 0.8;
  policy.dp_sgd->max_epsilon = 50;
  policy.ledger_path = Ledger();
  ClientAgent agent = Agent(policy);
  auto dp_fit = [&](uint64_t round, double z) {
    wire::Message m = Fit(round, {});
    auto& fit = std::get<wire::FitInstruction>(m.body);
    fit.train.dp_sgd.emplace();
    fit.train.dp_sgd->noise_multiplier = z;
    fit.train.dp_sgd->expected_batch_size = 32;
    return m;
  };
  auto low = agent.Handle(dp_fit(1, 0.5));
  ASSERT_TRUE(low.ok());
  EXPECT_EQ((*low)[0].type(), wire::MessageType::kError);
  auto ok = agent.Handle(dp_fit(1, 1.0));
  ASSERT_TRUE(ok.ok());
  ASSERT_EQ((*ok)[0].type(), wire::MessageType::kUploadRequest);
  ASSERT_EQ(agent.privacy_guard().entries().size(), 1u);
  const privacy::LedgerEntry& e = agent.privacy_guard().entries()[0];
  EXPECT_EQ(e.unit, privacy::kUnitExample);
  EXPECT_EQ(e.steps, 3);  // round(1 epoch * 96 / 32)
  EXPECT_DOUBLE_EQ(e.sampling_rate, 32.0 / 96.0);
  // Nothing computed from the examples without noise is reported.
  const wire::Message uploaded = Upload(agent, 1);
  const auto& result = std::get<wire::FitResult>(uploaded.body);
  EXPECT_EQ(result.num_examples, 1u);
  EXPECT_EQ(result.train_loss, 0.0);
  // A budget for the examples: the rounds stop being admitted before it is passed.
  int admitted = 1;
  for (uint64_t round = 2; round <= 200; ++round) {
    auto r = agent.Handle(dp_fit(round, 1.0));
    ASSERT_TRUE(r.ok());
    if ((*r)[0].type() == wire::MessageType::kError) break;
    ++admitted;
  }
  EXPECT_LT(admitted, 200);
  EXPECT_LE(agent.privacy_guard().DpSgdSpent()->epsilon, 50.0);
}

TEST_F(PrivacyGuardTest, BadPoliciesNameTheKey) {
  ClientPrivacyPolicy p = LocalPolicy();
  p.local->min_noise_multiplier = -1;
  auto st = PrivacyGuard::Open(p);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("privacy.local.min_noise_multiplier"),
            absl::string_view::npos);
  p = LocalPolicy();
  p.local->adjacency = "swap";
  EXPECT_FALSE(PrivacyGuard::Open(p).ok());
  p = LocalPolicy();
  p.local->delta = 2;
  EXPECT_FALSE(PrivacyGuard::Open(p).ok());
}

// Under local DP the coordinator is the adversary, and when a client answers shows how long it
// trained, so how much data it has: the reply is held to a fixed time after the instruction.
TEST_F(PrivacyGuardTest, RepliesAreHeldToAFixedTimeWhateverTheTrainingTook) {
  auto elapsed_ms = [](ClientAgent& agent, const wire::Message& fit) {
    const auto start = std::chrono::steady_clock::now();
    auto replies = agent.Handle(fit);
    EXPECT_TRUE(replies.ok()) << replies.status();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  // By default, half the deadline of the job's first instruction, fixed for the job.
  ClientAgent agent = Agent(LocalPolicy());
  wire::Message first = Fit(1, LocalDp(2.0));
  std::get<wire::FitInstruction>(first.body).deadline_ms = 600;
  EXPECT_GE(elapsed_ms(agent, first), 298);  // (the hold counts whole milliseconds)
  wire::Message second = Fit(2, LocalDp(2.0));
  std::get<wire::FitInstruction>(second.body).deadline_ms = 60;  // a shorter one changes nothing
  EXPECT_GE(elapsed_ms(agent, second), 298);
  // The client's own setting; 0 turns it off.
  ClientPrivacyPolicy fixed = LocalPolicy();
  fixed.reply_after_ms = 0;
  fixed.ledger_path = (dir_ / "off.jsonl").string();
  ClientAgent off = Agent(fixed);
  EXPECT_LT(elapsed_ms(off, first), 250);
}

// Distributed DP: the client checks the session's noise share by its own count of the honest
// members in any unmasked sum (its secure-aggregation policy's colluders: 1 of 10), and accounts
// each share it adds in its own ledger, when the masked input that carries it leaves.
class DistributedGuardTest : public PrivacyGuardTest {
 protected:
  static constexpr int kScale = 20;
  static constexpr uint32_t kMembers = 10;

  ClientPrivacyPolicy Policy() const {
    ClientPrivacyPolicy p;
    p.distributed.emplace();
    p.distributed->require = true;
    p.distributed->min_noise_multiplier = 1.0;
    p.ledger_path = Ledger();
    return p;
  }
  ClientAgent SecAggAgent(ClientPrivacyPolicy policy) {
    ClientAgent agent = Agent(std::move(policy));
    SecAggIdentity identity;
    identity.id = "edge-1";
    identity.policy.project_key = SigningKey::Generate().public_key();
    identity.policy.corrupt_fraction = 0.1;  // 1 of 10
    agent.set_secagg_identity(std::move(identity));
    return agent;
  }
  int64_t Dim() const {
    int64_t d = 0;
    for (const Tensor& t : global_) d += static_cast<int64_t>(t.data.size());
    return d;
  }
  double Sensitivity() const { return std::ldexp(1.0, kScale) + std::sqrt(double(Dim())); }
  // A session (the complete graph of 10) whose shares give z to a sum of `honest` members.
  wire::Message Fit(uint64_t round, uint32_t min_survivors, double z, uint32_t honest) {
    wire::SecureAggregation s;
    s.session = std::string(wire::kSecAggSessionBytes, 's');
    s.index = 0;
    s.members = kMembers;
    s.threshold = 3;
    s.edge_threshold = uint64_t{1} << 32;
    s.bits = 32;
    s.length = static_cast<uint64_t>(Dim());
    s.min_survivors = min_survivors;
    s.scale_exponent = kScale;
    s.noise_variance =
        static_cast<uint64_t>(std::ceil(z * z * Sensitivity() * Sensitivity() / honest));
    s.clip_norm = 1.0;
    wire::Message m =
        PrivacyGuardTest::Fit(round, {wire::UpdatePrivacy::Mode::kDistributed, 1.0, 0});
    std::get<wire::FitInstruction>(m.body).secure_aggregation = s;
    return m;
  }
  // The guard's view of that round, with `honest` shares by the client's count.
  StatusOr<privacy::LedgerEntry> Release(const PrivacyGuard& guard, const wire::Message& fit,
                                         int64_t honest) {
    RoundRequest r;
    r.job = "job";
    r.round = fit.round;
    r.fit = &std::get<wire::FitInstruction>(fit.body);
    r.model_values = Dim();
    r.honest_shares = honest;
    return guard.Distributed(r, "release");
  }
  static std::string Refusal(const StatusOr<std::vector<wire::Message>>& replies) {
    if (!replies.ok() || replies->size() != 1u ||
        (*replies)[0].type() != wire::MessageType::kError) {
      return "";
    }
    return std::get<wire::Error>((*replies)[0].body).message;
  }
};

TEST_F(DistributedGuardTest, ASessionsShareIsCheckedAndAccountedByTheClient) {
  ClientAgent agent = SecAggAgent(Policy());
  // min_survivors 6, 1 colluder: 5 honest shares, sized for z = 2. The agent trains and
  // advertises; nothing is in its ledger until its masked input leaves.
  const wire::Message fit = Fit(1, 6, 2.0, 5);
  auto replies = agent.Handle(fit);
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 1u);
  EXPECT_EQ((*replies)[0].type(), wire::MessageType::kSecAggData);
  EXPECT_TRUE(agent.privacy_guard().entries().empty());
  // The release the share makes, by the client's count, as the agent records it then.
  auto guard = PrivacyGuard::Open(Policy());
  ASSERT_TRUE(guard.ok());
  auto e = Release(*guard, fit, 5);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->mechanism, privacy::kMechanismDistributed);
  EXPECT_EQ(e->adjacency, privacy::kReplaceOne);
  EXPECT_EQ(e->dimension, Dim());
  EXPECT_GE(e->noise_multiplier, 2.0);
  EXPECT_LT(e->noise_multiplier, 2.0 * (1 + 1e-6));
  ASSERT_TRUE(guard->RecordDistributed(*e, "test").ok());
  // Durable: the ledger file has it.
  auto ledger = privacy::PrivacyLedger::Open(Ledger());
  ASSERT_TRUE(ledger.ok());
  EXPECT_EQ(ledger->entries().size(), 1u);
}

TEST_F(DistributedGuardTest, TooSmallAShareByTheClientsOwnCountIsDeclined) {
  ClientAgent agent = SecAggAgent(Policy());
  // Sized for z = 2 over 9 shares: the client counts 5 (6 - 1 colluder), z = 2 sqrt(5/9) < 1.6.
  EXPECT_NE(
      Refusal(agent.Handle(Fit(1, 6, 1.2, 9))).find("privacy.distributed.min_noise_multiplier"),
      std::string::npos);
  // A session unmasking sums of a single input: no honest share is guaranteed.
  EXPECT_NE(Refusal(agent.Handle(Fit(1, 1, 5.0, 1))).find("guarantees no honest member"),
            std::string::npos);
  // A session for another model: its words are not this model's values.
  wire::Message other = Fit(1, 6, 2.0, 5);
  std::get<wire::FitInstruction>(other.body).secure_aggregation->length += 5;
  EXPECT_NE(Refusal(agent.Handle(other)).find("values and the model has"), std::string::npos);
  // A threshold its own count of colluders could rebuild alone (t 1 <= 1 colluder).
  wire::Message weak = Fit(1, 6, 2.0, 5);
  std::get<wire::FitInstruction>(weak.body).secure_aggregation->threshold = 1;
  EXPECT_NE(Refusal(agent.Handle(weak)).find("fails against 1 colluders"), std::string::npos);
  // Local DP, or no DP: refused (the policy requires distributed DP).
  EXPECT_NE(Refusal(agent.Handle(PrivacyGuardTest::Fit(1, LocalDp(5.0)))).find("distributed"),
            std::string::npos);
  EXPECT_EQ(agent.rounds_trained(), 0);
  EXPECT_TRUE(agent.privacy_guard().entries().empty());
  // Without an identity for secure aggregation (no project key pinned), no session at all.
  ClientAgent unpinned = Agent(Policy());
  EXPECT_NE(Refusal(unpinned.Handle(Fit(1, 6, 2.0, 5))).find("project"), std::string::npos);
}

TEST_F(DistributedGuardTest, TheClientsEpsilonIsCappedByItsOwnLedger) {
  ClientPrivacyPolicy p = Policy();
  p.distributed->max_epsilon = 3.0;
  auto guard = PrivacyGuard::Open(p);
  ASSERT_TRUE(guard.ok());
  int admitted = 0;
  for (uint64_t round = 1; round <= 20; ++round) {
    auto e = Release(*guard, Fit(round, 6, 4.0, 5), 5);  // z / 2 = 2 a round: epsilon ~2 each
    if (!e.ok()) {
      EXPECT_NE(e.status().message().find("privacy.distributed.max_epsilon"), std::string::npos);
      break;
    }
    ASSERT_TRUE(guard->RecordDistributed(*e, "test").ok());
    ++admitted;
  }
  EXPECT_GT(admitted, 0);
  EXPECT_LT(admitted, 20);
  auto spent = guard->LocalSpent();
  ASSERT_TRUE(spent.ok());
  EXPECT_LE(spent->epsilon, 3.0);
}

}  // namespace
}  // namespace huddle::client
