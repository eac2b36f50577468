// SecAgg+ end to end in one process: a Server and n Clients exchanging the protocol's messages,
// members dropping at every stage, hostile messages, and what the coordinator's view looks like.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "aggregation/secagg/protocol.h"

namespace huddle::aggregation::secagg {
namespace {

// Members that leave before each stage (they send nothing from then on).
struct Drops {
  std::set<uint32_t> advertise, share, mask, unmask;
};

std::set<uint32_t> RandomSubset(uint32_t n, double fraction, std::mt19937_64& rng) {
  std::set<uint32_t> out;
  std::bernoulli_distribution drop(fraction);
  for (uint32_t i = 0; i < n; ++i) {
    if (drop(rng)) out.insert(i);
  }
  return out;
}

// A round's session: the server, its clients and their inputs.
class Session {
 public:
  // Inputs: random words, or every word `constant` when it is set.
  explicit Session(const ServerOptions& options, uint64_t input_seed = 1,
                   std::optional<uint64_t> constant = std::nullopt) {
    auto server = Server::Create(options);
    EXPECT_TRUE(server.ok()) << server.status();
    server_.emplace(*std::move(server));
    std::mt19937_64 rng(input_seed);
    const uint64_t mask = options.bits == 64 ? ~uint64_t{0} : (uint64_t{1} << options.bits) - 1;
    for (uint32_t i = 0; i < options.members; ++i) {
      auto c = Client::Create(server_->config(), i);
      EXPECT_TRUE(c.ok()) << c.status();
      clients_.push_back(*std::move(c));
      std::vector<uint64_t> x(options.length);
      for (uint64_t& w : x) w = constant ? *constant : rng() & mask;
      inputs_.push_back(std::move(x));
    }
  }

  Server& server() { return *server_; }
  Client& client(uint32_t i) { return clients_[i]; }
  const std::vector<uint64_t>& input(uint32_t i) const { return inputs_[i]; }

  // Runs every stage; the server's result (or the error of the stage that refused).
  StatusOr<std::vector<uint64_t>> Run(const Drops& drops) {
    for (uint32_t i = 0; i < clients_.size(); ++i) {
      if (drops.advertise.count(i) == 0) {
        HUDDLE_RETURN_IF_ERROR(server_->OnAdvertise(i, clients_[i].Advertise()));
      }
    }
    HUDDLE_ASSIGN_OR_RETURN(auto key_lists, server_->EndAdvertise());
    for (auto& [i, list] : key_lists) {
      if (drops.share.count(i) != 0) continue;
      HUDDLE_ASSIGN_OR_RETURN(ShareKeys shares, clients_[i].SealShares(list));
      HUDDLE_RETURN_IF_ERROR(server_->OnShareKeys(i, shares));
    }
    HUDDLE_ASSIGN_OR_RETURN(auto share_lists, server_->EndShareKeys());
    for (auto& [i, list] : share_lists) {
      if (drops.mask.count(i) != 0) continue;
      HUDDLE_ASSIGN_OR_RETURN(std::vector<uint64_t> y, clients_[i].MaskInput(list, inputs_[i]));
      masked_.emplace(i, y);
      HUDDLE_RETURN_IF_ERROR(server_->OnMaskedInput(i, std::span<const uint64_t>(y)));
    }
    HUDDLE_ASSIGN_OR_RETURN(auto requests, server_->EndMaskedInput());
    for (auto& [i, request] : requests) {
      if (drops.unmask.count(i) != 0) continue;
      HUDDLE_ASSIGN_OR_RETURN(UnmaskResponse r, clients_[i].Unmask(request));
      HUDDLE_RETURN_IF_ERROR(server_->OnUnmask(i, r));
    }
    return server_->Finish();
  }

  // The plain sum of the survivors' inputs, mod 2^bits.
  std::vector<uint64_t> PlainSum() const {
    const int bits = server_->config().bits;
    const uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    std::vector<uint64_t> sum(server_->config().length, 0);
    for (uint32_t i : server_->survivors()) {
      for (size_t w = 0; w < sum.size(); ++w) sum[w] += inputs_[i][w];
    }
    for (uint64_t& w : sum) w &= mask;
    return sum;
  }

  const std::map<uint32_t, std::vector<uint64_t>>& masked() const { return masked_; }

 private:
  std::optional<Server> server_;
  std::vector<Client> clients_;
  std::vector<std::vector<uint64_t>> inputs_;
  std::map<uint32_t, std::vector<uint64_t>> masked_;
};

ServerOptions Options(uint32_t n, int bits, uint64_t length) {
  ServerOptions o;
  o.members = n;
  o.bits = bits;
  o.length = length;
  return o;
}

TEST(SecAgg, WithoutDropoutsTheSumIsExact) {
  for (int bits : {32, 64}) {
    Session s(Options(20, bits, 1000));
    auto sum = s.Run({});
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(s.server().survivors().size(), 20u);
    EXPECT_EQ(*sum, s.PlainSum()) << bits << " bits";
  }
}

// 100 members, 10% and 30% of those left dropping before every stage: the unmasked sum is
// exactly the survivors' plain sum. The graph is chosen for the round's total dropout.
TEST(SecAgg, DropoutsAtEveryStageLeaveTheSurvivorsSumExact) {
  for (double fraction : {0.1, 0.3}) {
    std::mt19937_64 rng(fraction == 0.1 ? 11 : 12);
    ServerOptions o = Options(100, 32, 5000);
    o.graph.dropout_fraction = 1 - std::pow(1 - fraction, 4);
    o.graph.corrupt_fraction = 0.05;
    o.graph.reliability_bits = 10;
    Session s(o);
    Drops d;
    d.advertise = RandomSubset(100, fraction, rng);
    d.share = RandomSubset(100, fraction, rng);
    d.mask = RandomSubset(100, fraction, rng);
    d.unmask = RandomSubset(100, fraction, rng);
    auto sum = s.Run(d);
    ASSERT_TRUE(sum.ok()) << sum.status() << " (k " << s.server().parameters().neighbours << ", t "
                          << s.server().parameters().threshold << ")";
    EXPECT_EQ(*sum, s.PlainSum());
    // Members dropped at each stage: the sets shrink as they should.
    EXPECT_LT(s.server().survivors().size(), s.server().shared().size());
    EXPECT_LT(s.server().responders().size(), s.server().survivors().size());
    std::printf("dropping %.0f%% per stage: k %d, t %d; U1 %zu, U2 %zu, U3 %zu, U4 %zu\n",
                100 * fraction, s.server().parameters().neighbours,
                s.server().parameters().threshold, s.server().advertised().size(),
                s.server().shared().size(), s.server().survivors().size(),
                s.server().responders().size());
  }
}

TEST(SecAgg, TooFewSharesRefuseTheRoundAndRevealNothing) {
  ServerOptions o = Options(30, 32, 100);
  o.parameters = GraphParameters{29, 20};  // complete graph, 20 shares per secret
  Session s(o);
  Drops d;
  for (uint32_t i = 0; i < 12; ++i) d.unmask.insert(i);  // 18 answer: < 20
  auto sum = s.Run(d);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  EXPECT_NE(sum.status().message().find("fewer than the threshold"), std::string::npos);
}

TEST(SecAgg, BelowTheMinimumSurvivorsNothingIsUnmasked) {
  ServerOptions o = Options(30, 32, 100);
  o.parameters = GraphParameters{29, 5};
  o.min_survivors = 25;
  Session s(o);
  Drops d;
  for (uint32_t i = 0; i < 6; ++i) d.mask.insert(i);  // 24 masked inputs
  auto sum = s.Run(d);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  EXPECT_NE(sum.status().message().find("minimum is 25"), std::string::npos) << sum.status();
  // A member told of too few survivors reveals nothing either.
  UnmaskRequest few;
  few.total = 24;
  for (uint32_t i = 6; i < 30; ++i) few.survivors.push_back(i);
  auto r = s.client(7).Unmask(few);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
}

TEST(SecAgg, AMaskedInputLooksUniform) {
  // The coordinator's view of a member's masked input when every input word is the same (0, then
  // a constant): the 32-bit words' top bytes are uniform. Chi-square over 256 bins of 2^16 words:
  // 255 degrees of freedom, so the statistic is 255 +- 23; above 400 has p < 1e-10.
  for (uint64_t constant : {uint64_t{0}, uint64_t{123456789}}) {
    ServerOptions o = Options(10, 32, 1 << 16);
    o.parameters = GraphParameters{4, 2};
    Session s(o, 1, constant);
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

TEST(SecAgg, SharesAreBoundToTheirSessionAndPeers) {
  ServerOptions o = Options(5, 32, 10);
  o.parameters = GraphParameters{4, 2};
  Session a(o), b(o);
  for (Session* s : {&a, &b}) {
    for (uint32_t i = 0; i < 5; ++i)
      ASSERT_TRUE(s->server().OnAdvertise(i, s->client(i).Advertise()).ok());
  }
  auto la = a.server().EndAdvertise();
  auto lb = b.server().EndAdvertise();
  ASSERT_TRUE(la.ok() && lb.ok());
  for (Session* s : {&a, &b}) {
    auto& lists = s == &a ? *la : *lb;
    for (auto& [i, list] : lists) {
      auto sk = s->client(i).SealShares(list);
      ASSERT_TRUE(sk.ok());
      ASSERT_TRUE(s->server().OnShareKeys(i, *sk).ok());
    }
  }
  auto sa = a.server().EndShareKeys();
  auto sb = b.server().EndShareKeys();
  ASSERT_TRUE(sa.ok() && sb.ok());
  // Member 0 of session b receives member 1's ciphertext from session a: refused.
  ShareList replay = (*sb)[0];
  for (SealedShare& s : replay.shares) {
    if (s.peer == 1) {
      for (const SealedShare& from_a : (*sa)[0].shares) {
        if (from_a.peer == 1) s.ciphertext = from_a.ciphertext;
      }
    }
  }
  auto y = b.client(0).MaskInput(replay, b.input(0));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kDataLoss) << y.status();
  // Relabelled: member 2's ciphertext presented as member 1's.
  ShareList relabel = (*sb)[0];
  for (SealedShare& s : relabel.shares) {
    if (s.peer == 2) s.peer = 1;
  }
  relabel.shares.erase(relabel.shares.begin());
  auto y2 = b.client(0).MaskInput(relabel, b.input(0));
  EXPECT_FALSE(y2.ok());
  // A share from a member that is not a neighbour.
  ShareList stranger = (*sb)[0];
  stranger.shares[0].peer = 0;
  EXPECT_EQ(b.client(0).MaskInput(stranger, b.input(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SecAgg, HostileMessagesAreRefusedAndChangeNothing) {
  ServerOptions o = Options(6, 32, 8);
  o.parameters = GraphParameters{5, 3};
  Session s(o);
  Server& server = s.server();
  PublicKey zero{};
  EXPECT_EQ(server.OnAdvertise(0, {zero, zero}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server.OnAdvertise(6, s.client(0).Advertise()).code(),
            absl::StatusCode::kInvalidArgument);
  for (uint32_t i = 0; i < 6; ++i) ASSERT_TRUE(server.OnAdvertise(i, s.client(i).Advertise()).ok());
  EXPECT_EQ(server.OnAdvertise(1, s.client(1).Advertise()).code(),
            absl::StatusCode::kInvalidArgument);  // twice
  auto lists = server.EndAdvertise();
  ASSERT_TRUE(lists.ok());
  std::map<uint32_t, ShareKeys> sealed;
  for (auto& [i, list] : *lists) sealed[i] = *s.client(i).SealShares(list);
  ShareKeys short_one = sealed[0];
  short_one.shares.pop_back();
  EXPECT_EQ(server.OnShareKeys(0, short_one).code(), absl::StatusCode::kInvalidArgument);
  ShareKeys self_addressed = sealed[0];
  self_addressed.shares[0].peer = 0;
  EXPECT_EQ(server.OnShareKeys(0, self_addressed).code(), absl::StatusCode::kInvalidArgument);
  ShareKeys truncated = sealed[0];
  truncated.shares[0].ciphertext.resize(10);
  EXPECT_EQ(server.OnShareKeys(0, truncated).code(), absl::StatusCode::kInvalidArgument);
  for (auto& [i, sk] : sealed) ASSERT_TRUE(server.OnShareKeys(i, sk).ok()) << i;
  auto share_lists = server.EndShareKeys();
  ASSERT_TRUE(share_lists.ok());
  std::map<uint32_t, std::vector<uint64_t>> y;
  for (auto& [i, list] : *share_lists) y[i] = *s.client(i).MaskInput(list, s.input(i));
  // Wrong length, and a word out of range after valid ones: refused, the sum untouched.
  std::vector<uint64_t> longer = y[0];
  longer.push_back(1);
  EXPECT_EQ(server.OnMaskedInput(0, std::span<const uint64_t>(longer)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint64_t> wide = y[0];
  wide[5] = uint64_t{1} << 40;
  EXPECT_EQ(server.OnMaskedInput(0, std::span<const uint64_t>(wide)).code(),
            absl::StatusCode::kInvalidArgument);
  for (auto& [i, words] : y)
    ASSERT_TRUE(server.OnMaskedInput(i, std::span<const uint64_t>(words)).ok());
  EXPECT_EQ(server.OnMaskedInput(0, std::span<const uint64_t>(y[0])).code(),
            absl::StatusCode::kInvalidArgument);  // twice
  auto requests = server.EndMaskedInput();
  ASSERT_TRUE(requests.ok());
  std::map<uint32_t, UnmaskResponse> responses;
  for (auto& [i, request] : *requests) responses[i] = *s.client(i).Unmask(request);
  // A key share of a survivor (it would unmask that survivor's pairwise masks): refused.
  UnmaskResponse greedy = responses[0];
  greedy.mask_key_shares.push_back(greedy.self_mask_shares[0]);
  EXPECT_EQ(server.OnUnmask(0, greedy).code(), absl::StatusCode::kInvalidArgument);
  // A corrupted share: found when the secret is rebuilt (more than t shares here).
  UnmaskResponse corrupt = responses[1];
  corrupt.self_mask_shares[0].share.y[0] = FieldAdd(corrupt.self_mask_shares[0].share.y[0], 1);
  ASSERT_TRUE(server.OnUnmask(1, corrupt).ok());
  for (auto& [i, r] : responses) {
    if (i != 1) {
      ASSERT_TRUE(server.OnUnmask(i, r).ok()) << i;
    }
  }
  auto sum = server.Finish();
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kDataLoss) << sum.status();
}

TEST(SecAgg, AnHonestRoundAfterHostileNoiseIsStillExact) {
  // The refused messages above leave no trace: the same kinds of refusal, then an honest round.
  ServerOptions o = Options(8, 64, 64);
  o.parameters = GraphParameters{4, 2};
  Session s(o);
  std::vector<uint64_t> junk(64, 7);
  EXPECT_FALSE(s.server().OnMaskedInput(0, std::span<const uint64_t>(junk)).ok());  // too early
  auto sum = s.Run({});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, s.PlainSum());
}

}  // namespace
}  // namespace huddle::aggregation::secagg
