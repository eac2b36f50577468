// Secure aggregation end to end in one process: a Server and n certified Clients exchanging the
// protocol's messages, members dropping before every stage, hostile messages, lying members, and
// what the coordinator's view looks like. (Attacks by a cheating coordinator:
// secagg_attacks_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "aggregation/secagg/protocol.h"
#include "tests/aggregation/secagg_session.h"

namespace huddle::aggregation::secagg {
namespace {

using testing::Drops;
using testing::Options;
using testing::RandomSubset;
using testing::Session;
using testing::Tampering;

TEST(SecAgg, WithoutDropoutsTheSumIsExact) {
  for (int bits : {32, 64}) {
    Session s(Options(20, bits, 1000));
    auto sum = s.Run({});
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(s.server().survivors().size(), 20u);
    EXPECT_EQ(*sum, s.PlainSum()) << bits << " bits";
    EXPECT_TRUE(s.server().blames().empty());
  }
}

// 100 members, 10% of those left dropping before every stage after the reveal (a member that
// does not reveal ends the session: the graph needs everyone's randomness): the unmasked sum is
// exactly the survivors' plain sum.
TEST(SecAgg, DropoutsAtEveryStageLeaveTheSurvivorsSumExact) {
  std::mt19937_64 rng(11);
  GraphOptions g;
  g.dropout_fraction = 1 - std::pow(0.9, 6);
  g.corrupt_fraction = 0.05;
  g.reliability_bits = 10;
  Session s(Options(100, 32, 5000, 60, g));
  Drops d;
  d.advertise = RandomSubset(100, 0.1, rng);
  d.share = RandomSubset(100, 0.05, rng);
  d.verdict = RandomSubset(100, 0.05, rng);
  d.mask = RandomSubset(100, 0.05, rng);
  d.consistency = RandomSubset(100, 0.05, rng);
  d.unmask = RandomSubset(100, 0.05, rng);
  auto sum = s.Run(d);
  const SessionConfig& c = s.server().config();
  ASSERT_TRUE(sum.ok()) << sum.status() << " (t " << c.threshold << ", p "
                        << EdgeProbability(c.edge_threshold) << ")";
  EXPECT_EQ(*sum, s.PlainSum());
  EXPECT_LT(s.server().shared().size(), s.server().listed());
  EXPECT_LT(s.server().survivors().size(), s.server().shared().size());
  EXPECT_LT(s.server().responders().size(), s.server().survivors().size());
  EXPECT_TRUE(s.server().blames().empty());
  std::printf("t %u, expected degree %.1f; L %zu, U2 %zu, S %zu, signed %zu, answered %zu\n",
              c.threshold, EdgeProbability(c.edge_threshold) * (s.server().listed() - 1),
              s.server().listed(), s.server().shared().size(), s.server().survivors().size(),
              s.server().signers().size(), s.server().responders().size());
}

TEST(SecAgg, AMemberThatDoesNotRevealEndsTheSessionBeforeAnythingIsShared) {
  Session s(Options(10, 32, 16));
  Drops d;
  d.reveal = {3};
  auto sum = s.Run(d);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  EXPECT_NE(sum.status().message().find("did not reveal"), std::string::npos) << sum.status();
}

TEST(SecAgg, TooFewSharesRefuseTheRoundAndRevealNothing) {
  ServerOptions o = Options(30, 32, 100, 20);
  o.config.threshold = 20;
  o.config.edge_threshold = kCompleteGraph;
  Session s(o, 1, std::nullopt, 0.01);
  Drops d;
  for (uint32_t i = 0; i < 12; ++i) d.unmask.insert(i);  // 18 answer: < 20
  auto sum = s.Run(d);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  EXPECT_NE(sum.status().message().find("fewer than the threshold"), std::string::npos);
}

TEST(SecAgg, BelowTheMinimumSurvivorsNothingIsUnmasked) {
  ServerOptions o = Options(30, 32, 100, 25);
  Session s(o);
  Drops d;
  for (uint32_t i = 0; i < 6; ++i) d.mask.insert(i);  // 24 masked inputs
  auto sum = s.Run(d);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  EXPECT_NE(sum.status().message().find("minimum is 25"), std::string::npos) << sum.status();
}

TEST(SecAgg, AMaskedInputLooksUniform) {
  // The coordinator's view of a member's masked input when every input word is the same (0, then
  // a constant): the 32-bit words' top bytes are uniform. Chi-square over 256 bins of 2^16 words:
  // 255 degrees of freedom, so the statistic is 255 +- 23; above 400 has p < 1e-10.
  for (uint64_t constant : {uint64_t{0}, uint64_t{123456789}}) {
    Session s(Options(10, 32, 1 << 16), 1, constant);
    ASSERT_TRUE(s.Run({}).ok());
    for (uint32_t i : {0u, 3u}) {
      const std::vector<uint64_t>& y = s.masked().at(i);
      std::vector<int> bins(256, 0);
      for (uint64_t w : y) ++bins[w >> 24];
      const double expected = static_cast<double>(y.size()) / 256;
      double chi2 = 0;
      for (int c : bins) chi2 += (c - expected) * (c - expected) / expected;
      EXPECT_LT(chi2, 400) << "member " << i << ", inputs " << constant;
      EXPECT_GT(chi2, 150) << "member " << i << ", inputs " << constant;  // not too flat either
    }
  }
}

// The coordinator cannot invent members nor substitute keys: every member checks every
// certificate against the project key it pinned, and its own entry.
TEST(SecAgg, MembersAcceptOnlyCertifiedMembersAndTheirOwnEntry) {
  Session s(Options(6, 32, 8));
  for (uint32_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(s.server().OnAdvertise(i, s.enrolled(i).certificate, s.client(i).Advertise()).ok());
  }
  auto list = s.server().EndAdvertise();
  ASSERT_TRUE(list.ok()) << list.status();
  // Another project's member in the list.
  testing::Project other;
  MemberList forged = *list;
  forged.members[2].certificate = other.Enrol("member-2").certificate;
  auto r = s.client(0).OnMemberList(forged);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  // A field of a certificate altered (the coordinator's own signing key for member 2).
  MemberList altered = *list;
  altered.members[2].certificate.signing_key = SigningKey::Generate().public_key();
  EXPECT_EQ(s.client(0).OnMemberList(altered).status().code(), absl::StatusCode::kPermissionDenied);
  // The member's own entry with other keys.
  MemberList swapped = *list;
  std::swap(swapped.members[0].keys, swapped.members[1].keys);
  EXPECT_EQ(s.client(0).OnMemberList(swapped).status().code(), absl::StatusCode::kInvalidArgument);
  // The same client twice.
  MemberList twice = *list;
  twice.members[3].certificate = twice.members[4].certificate;
  EXPECT_EQ(s.client(0).OnMemberList(twice).status().code(), absl::StatusCode::kInvalidArgument);
  // An expired certificate.
  ServerOptions o = Options(3, 32, 8);
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok());
  testing::Project project;
  MemberPolicy policy = project.Policy(0.1);
  policy.now_unix = [] { return uint64_t{2000}; };
  std::vector<testing::Enrolled> members = {project.Enrol("a"), project.Enrol("b", 1000),
                                            project.Enrol("c")};
  std::vector<Client> clients;
  for (uint32_t i = 0; i < 3; ++i) {
    clients.push_back(*Client::Create(server->config(), i, members[i].id, members[i].key, policy));
    ASSERT_TRUE(server->OnAdvertise(i, members[i].certificate, clients[i].Advertise()).ok());
  }
  auto three = server->EndAdvertise();
  ASSERT_TRUE(three.ok());
  auto expired = clients[0].OnMemberList(*three);
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kPermissionDenied) << expired.status();
  EXPECT_NE(expired.status().message().find("expired"), std::string::npos);
}

// A lying member cannot make honest members leave: garbage sealed to its neighbours is a
// complaint (they do not hold its share), and the session completes with the honest survivors'
// exact sum.
TEST(SecAgg, AMemberThatSealsGarbageIsComplainedOfAndTheSessionCompletes) {
  GraphOptions g;
  g.corrupt_fraction = 0.1;
  Session s(Options(30, 32, 200, 0, g));
  Tampering t;
  t.shares = [&](uint32_t member, ShareKeys& sk) {
    if (member != 4) return;
    for (ShareRecord& r : sk.shares) r.ciphertext[40] ^= 1;  // the seal fails...
    s.Resign(4, sk);                                         // ...though its member signed it
  };
  auto sum = s.Run({}, t);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, s.PlainSum());
  // Every neighbour of member 4 complained of it, and member 4 left U2 (nobody holds its shares).
  size_t complaints = 0;
  for (const auto& [member, v] : s.verdicts()) {
    for (const ComplaintRecord& c : v.complaints) {
      EXPECT_EQ(s.Cohort(c.peer), 4u);
      EXPECT_EQ(c.reason, Complaint::kUnreadable);
      ++complaints;
    }
  }
  EXPECT_GT(complaints, 0u);
  EXPECT_EQ(s.server().shared().size(), 29u);
  EXPECT_EQ(s.server().survivors().size(), 29u);
}

// A member that reveals a wrong share at unmasking is named, its share set aside, and the
// secret rebuilt from the others: the session completes.
TEST(SecAgg, AMemberThatRevealsAWrongShareIsBlamedAndTheSessionCompletes) {
  Session s(Options(30, 64, 100, 0, GraphOptions{0.1, 0.1, 40, 20}));
  Tampering t;
  t.unmask = [](uint32_t member, UnmaskResponse& r) {
    if (member != 7) return;
    for (RevealedShare& share : r.self_mask_shares) {
      share.share.y[0] = FieldAdd(share.share.y[0], 1);
    }
  };
  auto sum = s.Run({}, t);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, s.PlainSum());
  ASSERT_FALSE(s.server().blames().empty());
  for (const Blame& b : s.server().blames()) {
    EXPECT_EQ(s.Cohort(b.member), 7u);
    EXPECT_NE(b.reason.find("not the one its dealer signed"), std::string::npos) << b.reason;
  }
}

// A member that claims a valid record's signature is bad is found out (the coordinator forwarded
// that very record) and left out; the one it accused stays.
TEST(SecAgg, AFalseComplaintOfABadSignatureBlamesTheComplainer) {
  Session s(Options(20, 32, 50));
  Tampering t;
  t.verdict = [&](uint32_t member, Verdict& v) {
    if (member != 2 || !v.complaints.empty()) return;
    v.complaints.push_back({s.client(2).neighbours()[0], Complaint::kBadSignature});
  };
  auto sum = s.Run({}, t);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, s.PlainSum());
  ASSERT_EQ(s.server().blames().size(), 1u);
  EXPECT_EQ(s.Cohort(s.server().blames()[0].member), 2u);
  EXPECT_EQ(s.server().survivors().size(), 19u);
}

// Shares that each match what their dealer signed but do not rebuild the secret it committed to: a
// bad dealing, found only when the secret is rebuilt. The session ends with nothing released and
// the dealer named (the one failure a member can still cause; docs/security.md).
TEST(SecAgg, ABadDealingEndsTheSessionAndNamesTheDealer) {
  Session s(Options(12, 32, 20));
  auto sum = s.Run({}, Tampering{[&](uint32_t member, ShareKeys& sk) {
                     if (member != 5) return;
                     // Commits to another seed than the one it shared, and signs every record anew.
                     sk.self_mask_commitment[0] ^= 1;
                     s.Resign(5, sk);
                   }});
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kDataLoss) << sum.status();
  ASSERT_EQ(s.server().blames().size(), 1u);
  EXPECT_EQ(s.Cohort(s.server().blames()[0].member), 5u);
  EXPECT_NE(s.server().blames()[0].reason.find("committed to"), std::string::npos);
}

TEST(SecAgg, HostileMessagesAreRefusedAndChangeNothing) {
  Session s(Options(6, 32, 8));
  Server& server = s.server();
  PublicKey zero{};
  Advertisement bad = s.client(0).Advertise();
  bad.cipher_key = zero;
  EXPECT_EQ(server.OnAdvertise(0, s.enrolled(0).certificate, bad).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server.OnAdvertise(6, s.enrolled(0).certificate, s.client(0).Advertise()).code(),
            absl::StatusCode::kInvalidArgument);
  for (uint32_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(server.OnAdvertise(i, s.enrolled(i).certificate, s.client(i).Advertise()).ok());
  }
  EXPECT_EQ(server.OnAdvertise(1, s.enrolled(1).certificate, s.client(1).Advertise()).code(),
            absl::StatusCode::kInvalidArgument);  // twice
  auto list = server.EndAdvertise();
  ASSERT_TRUE(list.ok());
  std::vector<Reveal> reveals;
  for (uint32_t p = 0; p < 6; ++p) reveals.push_back(*s.client(p).OnMemberList(*list));
  Reveal forged = reveals[1];
  forged.seed[0] ^= 1;  // does not open the commitment
  EXPECT_EQ(server.OnReveal(1, forged).code(), absl::StatusCode::kInvalidArgument);
  Reveal unsigned_reveal = reveals[1];
  unsigned_reveal.signature[0] ^= 1;
  EXPECT_EQ(server.OnReveal(1, unsigned_reveal).code(), absl::StatusCode::kInvalidArgument);
  for (uint32_t p = 0; p < 6; ++p) ASSERT_TRUE(server.OnReveal(p, reveals[p]).ok()) << p;
  auto seeds = server.EndReveal();
  ASSERT_TRUE(seeds.ok());
  // A member told of a seed list with one reveal changed: it shares nothing.
  SeedList tampered = *seeds;
  tampered.reveals[3].seed[5] ^= 1;
  EXPECT_EQ(s.client(0).OnSeeds(tampered).status().code(), absl::StatusCode::kInvalidArgument);
  std::map<uint32_t, ShareKeys> sealed;
  for (uint32_t p = 0; p < 6; ++p) sealed[p] = *s.client(p).OnSeeds(*seeds);
  ShareKeys short_one = sealed[0];
  short_one.shares.pop_back();
  EXPECT_EQ(server.OnShareKeys(0, short_one).code(), absl::StatusCode::kInvalidArgument);
  ShareKeys self_addressed = sealed[0];
  self_addressed.shares[0].peer = 0;
  EXPECT_EQ(server.OnShareKeys(0, self_addressed).code(), absl::StatusCode::kInvalidArgument);
  ShareKeys truncated = sealed[0];
  truncated.shares[0].ciphertext.resize(10);
  EXPECT_EQ(server.OnShareKeys(0, truncated).code(), absl::StatusCode::kInvalidArgument);
  for (auto& [p, sk] : sealed) ASSERT_TRUE(server.OnShareKeys(p, sk).ok()) << p;
  auto share_lists = server.EndShareKeys();
  ASSERT_TRUE(share_lists.ok());
  for (auto& [p, shares] : *share_lists) {
    Verdict v = *s.client(p).OnShareList(shares);
    EXPECT_TRUE(v.complaints.empty()) << p;
    Verdict stranger = v;
    stranger.complaints.push_back({p, Complaint::kMissing});  // of itself: not a neighbour
    EXPECT_EQ(server.OnVerdict(p, stranger).code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(server.OnVerdict(p, v).ok());
  }
  auto masks = server.EndVerdicts();
  ASSERT_TRUE(masks.ok());
  std::map<uint32_t, std::vector<uint64_t>> y;
  for (auto& [p, request] : *masks) y[p] = *s.client(p).MaskInput(request, s.input(p));
  // Wrong length, and a word out of range after valid ones: refused, the sum untouched.
  std::vector<uint64_t> longer = y[0];
  longer.push_back(1);
  EXPECT_EQ(server.OnMaskedInput(0, std::span<const uint64_t>(longer)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint64_t> wide = y[0];
  wide[5] = uint64_t{1} << 40;
  EXPECT_EQ(server.OnMaskedInput(0, std::span<const uint64_t>(wide)).code(),
            absl::StatusCode::kInvalidArgument);
  for (auto& [p, words] : y) {
    ASSERT_TRUE(server.OnMaskedInput(p, std::span<const uint64_t>(words)).ok());
  }
  EXPECT_EQ(server.OnMaskedInput(0, std::span<const uint64_t>(y[0])).code(),
            absl::StatusCode::kInvalidArgument);  // twice
  auto survivors = server.EndMaskedInput();
  ASSERT_TRUE(survivors.ok());
  std::map<uint32_t, Consistency> signatures;
  for (auto& [p, sets] : *survivors) signatures[p] = *s.client(p).OnSurvivors(sets);
  Consistency forged_sig = signatures[0];
  forged_sig.signature[7] ^= 1;
  EXPECT_EQ(server.OnConsistency(0, forged_sig).code(), absl::StatusCode::kInvalidArgument);
  for (auto& [p, c] : signatures) ASSERT_TRUE(server.OnConsistency(p, c).ok()) << p;
  auto requests = server.EndConsistency();
  ASSERT_TRUE(requests.ok());
  std::map<uint32_t, UnmaskResponse> responses;
  for (auto& [p, request] : *requests) responses[p] = *s.client(p).OnUnmask(request);
  // A key share of a survivor (it would unmask that survivor's pairwise masks): refused.
  UnmaskResponse greedy = responses[0];
  greedy.mask_key_shares.push_back(greedy.self_mask_shares[0]);
  EXPECT_EQ(server.OnUnmask(0, greedy).code(), absl::StatusCode::kInvalidArgument);
  for (auto& [p, r] : responses) ASSERT_TRUE(server.OnUnmask(p, r).ok()) << p;
  auto sum = server.Finish();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, s.PlainSum());
}

}  // namespace
}  // namespace huddle::aggregation::secagg
