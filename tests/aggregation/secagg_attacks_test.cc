// A coordinator that cheats, driving the real members (secagg::Client) as an attacker would: the
// four ways an independent audit recovered one victim's exact update from the protocol of commit
// 48257fd (key swap, split unmasking, threshold lie, graph choice), each now refused by the victim
// or its peers before anything of the victim's is revealed. (A member that lies:
// secagg_protocol_test.cc; the weight word: tests/integration/secure_aggregation_test.cc.)
//
// The attacker holds what a coordinator holds: every message it relays, keys it makes itself, a
// project key of its own (not the privacy owner's), and whatever its colluding members give it.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "aggregation/secagg/protocol.h"
#include "tests/aggregation/secagg_session.h"

namespace huddle::aggregation::secagg {
namespace {

using testing::Options;
using testing::Session;

// Runs stages A and B honestly for every member of `s`: the member list and every reveal.
struct Revealed {
  MemberList list;
  std::vector<Reveal> reveals;
};
Revealed AdvertiseAndReveal(Session& s, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_TRUE(s.server().OnAdvertise(i, s.enrolled(i).certificate, s.client(i).Advertise()).ok());
  }
  Revealed out;
  out.list = *s.server().EndAdvertise();
  for (uint32_t p = 0; p < n; ++p) {
    auto r = s.client(p).OnMemberList(out.list);
    EXPECT_TRUE(r.ok()) << r.status();
    out.reveals.push_back(*r);
  }
  return out;
}

// 1. Key swap. The old members accepted any key list; the coordinator played all of the victim's
// neighbours with keys it made, opened the victim's sealed shares and rebuilt both its secrets.
// Now every key comes with a certificate by the project key, and is signed by its holder.
TEST(SecAggAttack, KeySwapIsRefused) {
  Session s(Options(10, 32, 64));
  for (uint32_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(s.server().OnAdvertise(i, s.enrolled(i).certificate, s.client(i).Advertise()).ok());
  }
  const MemberList genuine = *s.server().EndAdvertise();
  // (a) Puppets the coordinator made, certified by a project key of its own: the victim (member 0)
  // pins the privacy owner's project key.
  testing::Project own;
  MemberList puppets = genuine;
  for (uint32_t p = 1; p < 10; ++p) {
    puppets.members[p].certificate = own.Enrol(genuine.members[p].certificate.id).certificate;
    puppets.members[p].keys.cipher_key = KeyPair::Generate().public_key();
  }
  auto a = s.client(0).OnMemberList(puppets);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kPermissionDenied) << a.status();
  // (b) The real members' certificates, with the coordinator's own keys for the session: the
  // victim accepts the list (it cannot know another member's fresh keys)...
  MemberList swapped = genuine;
  for (uint32_t p = 1; p < 10; ++p)
    swapped.members[p].keys.cipher_key = KeyPair::Generate().public_key();
  auto victim_reveal = s.client(0).OnMemberList(swapped);
  ASSERT_TRUE(victim_reveal.ok()) << victim_reveal.status();
  // ...but the real members signed the list they saw, whose hash differs: no set of their
  // reveals convinces the victim, so it shares nothing.
  SeedList seeds;
  seeds.reveals.push_back(*victim_reveal);
  for (uint32_t p = 1; p < 10; ++p) seeds.reveals.push_back(*s.client(p).OnMemberList(genuine));
  auto shares = s.client(0).OnSeeds(seeds);
  EXPECT_EQ(shares.status().code(), absl::StatusCode::kInvalidArgument) << shares.status();
  EXPECT_NE(shares.status().message().find("not its signature over this member list"),
            std::string::npos);
}

// Runs a whole honest session up to the survivor sets; then the coordinator shows each member the
// sets it chooses (`sets_for`), collects their signatures, and hands each member the signatures
// that `signatures_for` picks. Returns, per member, whether it revealed anything.
std::map<uint32_t, StatusOr<UnmaskResponse>> SplitUnmasking(
    Session& s, uint32_t n, const std::function<Survivors(uint32_t)>& sets_for) {
  Revealed r = AdvertiseAndReveal(s, n);
  for (uint32_t p = 0; p < n; ++p) EXPECT_TRUE(s.server().OnReveal(p, r.reveals[p]).ok());
  SeedList seeds = *s.server().EndReveal();
  for (uint32_t p = 0; p < n; ++p) {
    EXPECT_TRUE(s.server().OnShareKeys(p, *s.client(p).OnSeeds(seeds)).ok());
  }
  auto lists = s.server().EndShareKeys();
  EXPECT_TRUE(lists.ok()) << lists.status();
  if (!lists.ok()) return {};
  for (auto& [p, list] : *lists) {
    EXPECT_TRUE(s.server().OnVerdict(p, *s.client(p).OnShareList(list)).ok());
  }
  auto masks = s.server().EndVerdicts();
  EXPECT_TRUE(masks.ok()) << masks.status();
  if (!masks.ok()) return {};
  for (auto& [p, request] : *masks) {
    auto y = s.client(p).MaskInput(request, s.input(p));
    EXPECT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(s.server().OnMaskedInput(p, std::span<const uint64_t>(*y)).ok());
  }
  // The attack: each member sees the sets the coordinator chooses for it, and signs them.
  std::map<std::vector<uint32_t>, UnmaskRequest> signed_by_set;
  std::map<uint32_t, Survivors> shown;
  for (uint32_t p = 0; p < n; ++p) {
    shown[p] = sets_for(p);
    auto c = s.client(p).OnSurvivors(shown[p]);
    if (c.ok()) signed_by_set[shown[p].survivors].signatures.push_back({p, c->signature});
  }
  // Every member gets every signature over the set it was shown: the most it could be shown.
  std::map<uint32_t, StatusOr<UnmaskResponse>> out;
  for (uint32_t p = 0; p < n; ++p) {
    out.emplace(p, s.client(p).OnUnmask(signed_by_set[shown[p].survivors]));
  }
  return out;
}

// 2. Split unmasking. The old unmask requests were per member and unsigned: telling half of the
// victim's neighbours it survived (they revealed its self-mask seed) and half it dropped (they
// revealed its mask key) rebuilt both its secrets, with no colluder, at 10 and 100 members. Now
// each member signs the one survivor set it is shown, and reveals nothing before more than half
// of the members (its colluders aside) signed that same set: two sets cannot both get there.
TEST(SecAggAttack, SplitUnmaskingGetsNoShareFromAnyone) {
  for (uint32_t n : {10u, 100u}) {
    GraphOptions g;
    g.corrupt_fraction = n == 10 ? 0.2 : 0.1;
    Session s(Options(n, 32, 64, 0, g));
    std::vector<uint32_t> all(n);
    std::iota(all.begin(), all.end(), 0u);
    std::vector<uint32_t> without_victim(all.begin() + 1, all.end());
    // Members 1..n/2 (and the victim) are told the victim survived; the rest that it dropped.
    auto responses = SplitUnmasking(s, n, [&](uint32_t p) {
      return p <= n / 2 ? Survivors{all, all} : Survivors{all, without_victim};
    });
    for (auto& [p, response] : responses) {
      EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition)
          << "member " << p << " of " << n << ": " << response.status();
    }
    // Told one consistent set, the same members unmask (the check is not merely a refusal).
    Session honest(Options(n, 32, 64, 0, g));
    auto fine = SplitUnmasking(honest, n, [&](uint32_t) { return Survivors{all, all}; });
    for (auto& [p, response] : fine) EXPECT_TRUE(response.ok()) << p << ": " << response.status();
  }
}

// Colluders sign both sets: still no set reaches the quorum, because the quorum counts them.
TEST(SecAggAttack, SplitUnmaskingWithColludersSigningBothSetsStillFails) {
  const uint32_t n = 10;
  GraphOptions g;
  g.corrupt_fraction = 0.2;  // 2 colluders assumed: quorum (10 + 2) / 2 + 1 = 7
  Session s(Options(n, 32, 64, 0, g));
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  std::vector<uint32_t> without_victim(all.begin() + 1, all.end());
  Revealed r = AdvertiseAndReveal(s, n);
  for (uint32_t p = 0; p < n; ++p) ASSERT_TRUE(s.server().OnReveal(p, r.reveals[p]).ok());
  SeedList seeds = *s.server().EndReveal();
  for (uint32_t p = 0; p < n; ++p) {
    ASSERT_TRUE(s.server().OnShareKeys(p, *s.client(p).OnSeeds(seeds)).ok());
  }
  auto lists = s.server().EndShareKeys();
  ASSERT_TRUE(lists.ok());
  for (auto& [p, list] : *lists) {
    ASSERT_TRUE(s.server().OnVerdict(p, *s.client(p).OnShareList(list)).ok());
  }
  auto masks = s.server().EndVerdicts();
  ASSERT_TRUE(masks.ok());
  for (auto& [p, request] : *masks) {
    auto y = s.client(p).MaskInput(request, s.input(p));
    ASSERT_TRUE(y.ok());
    ASSERT_TRUE(s.server().OnMaskedInput(p, std::span<const uint64_t>(*y)).ok());
  }
  // Members 8 and 9 collude: the coordinator signs both sets with their keys.
  const Hash32 digest = MemberListDigest(s.server().config(), s.server().list());
  const Survivors with{all, all}, without{all, without_victim};
  UnmaskRequest for_with, for_without;
  for (uint32_t p : {8u, 9u}) {
    for (auto [sets, request] : {std::pair{&with, &for_with}, std::pair{&without, &for_without}}) {
      request->signatures.push_back({p, s.enrolled(p).key.Sign(SurvivorsMessage(
                                            s.server().config().session, digest, *sets))});
    }
  }
  // Honest 0-4 see the victim (0) survive, honest 5-7 see it dropped.
  for (uint32_t p = 0; p < 8; ++p) {
    const Survivors& sets = p <= 4 ? with : without;
    auto c = s.client(p).OnSurvivors(sets);
    ASSERT_TRUE(c.ok()) << c.status();
    (p <= 4 ? for_with : for_without).signatures.push_back({p, c->signature});
  }
  // 5 + 2 = 7 signatures over "with" would do; 3 + 2 = 5 over "without" would not. So the
  // coordinator can learn the victim's self-mask seed (the set it survived in), and never its mask
  // key: its input stays masked by its pairwise masks with honest survivors.
  for (uint32_t p = 5; p < 8; ++p) {
    auto response = s.client(p).OnUnmask(for_without);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition) << p;
  }
  for (uint32_t p = 1; p <= 4; ++p) {
    auto response = s.client(p).OnUnmask(for_with);
    ASSERT_TRUE(response.ok()) << response.status();
    for (const RevealedShare& share : response->mask_key_shares) EXPECT_NE(share.owner, 0u);
  }
}

// 3. Threshold lie. The old members took any t in [1, members): the victim alone was told t = 1
// and one share rebuilt its secrets. Now each member checks the session against its own count of
// colluders before revealing anything, and every member signs the same settings (a victim told
// another t than its peers sees their signatures fail).
TEST(SecAggAttack, AThresholdTooSmallForTheMembersOwnCountIsRefused) {
  for (uint32_t t : {1u, 2u}) {
    ServerOptions o = Options(10, 32, 64, 8, GraphOptions{0.2, 0.1, 40, 12});
    o.config.threshold = t;  // 2 colluders assumed: t must be 3
    o.config.edge_threshold = kCompleteGraph;
    Session s(o);
    for (uint32_t i = 0; i < 10; ++i) {
      ASSERT_TRUE(
          s.server().OnAdvertise(i, s.enrolled(i).certificate, s.client(i).Advertise()).ok());
    }
    auto reveal = s.client(0).OnMemberList(*s.server().EndAdvertise());
    EXPECT_EQ(reveal.status().code(), absl::StatusCode::kFailedPrecondition) << reveal.status();
    EXPECT_NE(reveal.status().message().find("this member's policy refuses the session"),
              std::string::npos);
  }
  // The victim alone told t = 1, its peers t = 3: the settings are part of what every member
  // signs, so the victim's peers' signatures do not verify for it.
  Session s(Options(10, 32, 64, 8, GraphOptions{0.2, 0.1, 40, 12}));
  Revealed r = AdvertiseAndReveal(s, 10);
  SessionConfig lie = s.server().config();
  lie.threshold = 1;
  MemberPolicy lenient = s.project().Policy(0.0);  // even a member that assumes no colluder...
  auto victim = Client::Create(lie, 0, s.enrolled(0).id, s.enrolled(0).key, lenient);
  ASSERT_TRUE(victim.ok());
  MemberList relisted = r.list;
  relisted.members[0].keys = victim->Advertise();
  auto victim_reveal = victim->OnMemberList(relisted);
  ASSERT_TRUE(victim_reveal.ok()) << victim_reveal.status();
  SeedList seeds;
  seeds.reveals = r.reveals;
  seeds.reveals[0] = *victim_reveal;
  auto shares = victim->OnSeeds(seeds);  // ...finds that its peers were told another session
  EXPECT_EQ(shares.status().code(), absl::StatusCode::kInvalidArgument) << shares.status();
}

// 4. Graph choice. The old coordinator drew the graph: with 50 colluders in 1000 it placed 17 of
// them around the victim. Now the graph comes from every member's randomness, committed before
// any is revealed: the coordinator cannot change a reveal after seeing the others (a colluder's
// new one does not open its commitment), nor leave one out.
TEST(SecAggAttack, TheGraphCannotBeChosenByTheCoordinator) {
  Session s(Options(12, 32, 16));
  Revealed r = AdvertiseAndReveal(s, 12);
  // A colluder (member 11) redraws its randomness after seeing the honest reveals: it can sign
  // its new seed, but the seed does not open the commitment in the list every member signed.
  SeedList ground;
  ground.reveals = r.reveals;
  ground.reveals[11].seed[0] ^= 1;
  const Hash32 digest = MemberListDigest(s.server().config(), r.list);
  ground.reveals[11].signature = s.enrolled(11).key.Sign(
      RevealMessage(s.server().config().session, digest, 11, ground.reveals[11].seed));
  auto shares = s.client(0).OnSeeds(ground);
  EXPECT_EQ(shares.status().code(), absl::StatusCode::kInvalidArgument) << shares.status();
  // Nor can it leave a member's randomness out.
  SeedList fewer;
  fewer.reveals.assign(r.reveals.begin(), r.reveals.end() - 1);
  EXPECT_EQ(s.client(0).OnSeeds(fewer).status().code(), absl::StatusCode::kInvalidArgument);
  // With every reveal, every member draws the same graph: symmetric neighbourhoods.
  SeedList seeds;
  seeds.reveals = r.reveals;
  std::vector<std::vector<uint32_t>> rows;
  for (uint32_t p = 0; p < 12; ++p) {
    ASSERT_TRUE(s.client(p).OnSeeds(seeds).ok());
    rows.push_back(s.client(p).neighbours());
  }
  for (uint32_t p = 0; p < 12; ++p) {
    for (uint32_t q : rows[p]) EXPECT_TRUE(std::binary_search(rows[q].begin(), rows[q].end(), p));
  }
}

// What a coordinator can still do is abort sessions and draw again: the colluders around a member
// are then a fresh binomial draw each time. Over 300 sessions of examples/dp_distributed.yaml's
// shape (1000 members, 50 colluders), the most colluders any honest member got is far below t.
TEST(SecAggAttack, RedrawingTheGraphDoesNotConcentrateColluders) {
  GraphOptions g;
  g.corrupt_fraction = 0.05;
  g.dropout_fraction = 0.05;
  auto params = ChooseParameters(1000, 900, g);
  ASSERT_TRUE(params.ok()) << params.status();
  int most = 0;
  for (int session = 0; session < 300; ++session) {
    GraphSeed seed{};
    seed[0] = static_cast<uint8_t>(session);
    seed[1] = static_cast<uint8_t>(session >> 8);
    auto graph = RandomGraph(seed, 1000, params->edge_threshold);
    ASSERT_TRUE(graph.ok());
    for (uint32_t v = 50; v < 1000; ++v) {  // members 0-49 collude
      int colluders = 0;
      for (uint32_t u : (*graph)[v]) colluders += u < 50;
      most = std::max(most, colluders);
    }
  }
  std::printf("k %d, t %d: at most %d colluders around an honest member in 300 sessions\n",
              params->neighbours, params->threshold, most);
  EXPECT_LT(most, params->threshold);
}

}  // namespace
}  // namespace huddle::aggregation::secagg
