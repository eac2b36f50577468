// The building blocks of secure aggregation: the prime field and Shamir sharing, the libsodium
// wrappers (key agreement, sealing, the mask stream), and SecAgg+'s graph and its parameters.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "aggregation/secagg/crypto.h"
#include "aggregation/secagg/graph.h"
#include "aggregation/secagg/protocol.h"
#include "aggregation/secagg/shamir.h"

namespace huddle::aggregation::secagg {
namespace {

Secret RandomSecret(std::mt19937_64& rng) {
  Secret s;
  for (uint8_t& b : s) b = static_cast<uint8_t>(rng());
  return s;
}

std::vector<uint64_t> Points(std::initializer_list<uint64_t> xs) { return xs; }

TEST(Field, ArithmeticMatchesWideIntegers) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t a = rng() % kFieldPrime, b = rng() % kFieldPrime;
    const unsigned __int128 p = kFieldPrime;
    EXPECT_EQ(FieldMul(a, b), static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) % p));
    EXPECT_EQ(FieldAdd(a, b), (a + b) % kFieldPrime);
    EXPECT_EQ(FieldSub(a, b), (a + kFieldPrime - b) % kFieldPrime);
    if (a != 0) {
      EXPECT_EQ(FieldMul(a, FieldInverse(a)), 1u);
    }
  }
  EXPECT_EQ(FieldMul(kFieldPrime - 1, kFieldPrime - 1), 1u);  // (-1)^2
  EXPECT_EQ(FieldInverse(0), 0u);
}

TEST(Shamir, AnyThresholdSubsetRebuildsTheSecret) {
  std::mt19937_64 rng(1);
  for (int t : {1, 2, 3, 7}) {
    const Secret secret = RandomSecret(rng);
    std::vector<uint64_t> xs(10);
    std::iota(xs.begin(), xs.end(), 1);
    auto shares = Split(secret, t, xs);
    ASSERT_TRUE(shares.ok()) << shares.status();
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<Share> subset = *shares;
      std::shuffle(subset.begin(), subset.end(), rng);
      subset.resize(static_cast<size_t>(t) + trial % 3);
      auto back = Combine(subset, t);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, secret) << "t " << t;
    }
  }
}

TEST(Shamir, TooFewSharesAreRefused) {
  std::mt19937_64 rng(2);
  auto shares = Split(RandomSecret(rng), 3, Points({1, 2, 3, 4}));
  ASSERT_TRUE(shares.ok());
  EXPECT_EQ(Combine(std::span(*shares).first(2), 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Shamir, FewerThanThresholdSharesLeaveTheSecretOpen) {
  // t = 2: one share (1, y) is consistent with every secret s', through the line
  // f(x) = s' + x (y - s'). Completing it at x = 2 rebuilds whichever secret one likes.
  std::mt19937_64 rng(3);
  auto shares = Split(RandomSecret(rng), 2, Points({1, 2}));
  ASSERT_TRUE(shares.ok());
  for (int trial = 0; trial < 5; ++trial) {
    const Secret wanted = RandomSecret(rng);
    auto limbs_of = Split(wanted, 1, Points({1}));  // t = 1: the share's values are the limbs
    ASSERT_TRUE(limbs_of.ok());
    Share at2;
    at2.x = 2;
    for (size_t l = 0; l < kSecretLimbs; ++l) {
      const uint64_t s0 = (*limbs_of)[0].y[l];
      const uint64_t slope = FieldSub((*shares)[0].y[l], s0);
      at2.y[l] = FieldAdd(s0, FieldMul(2, slope));
    }
    std::vector<Share> pair = {(*shares)[0], at2};
    auto back = Combine(pair, 2);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, wanted);
  }
}

TEST(Shamir, AnInconsistentShareIsFound) {
  std::mt19937_64 rng(4);
  const Secret secret = RandomSecret(rng);
  auto shares = Split(secret, 3, Points({1, 2, 3, 4, 5}));
  ASSERT_TRUE(shares.ok());
  std::vector<Share> bad = *shares;
  bad[4].y[2] = FieldAdd(bad[4].y[2], 1);
  auto back = Combine(bad, 3);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss) << back.status();
  EXPECT_NE(back.status().message().find("point 5"), std::string::npos) << back.status();
  // Exactly t shares cannot show a bad one, but a limb out of its byte range still does.
  std::vector<Share> three(bad.begin() + 2, bad.end());
  auto wrong = Combine(three, 3);
  EXPECT_TRUE(!wrong.ok() || *wrong != secret);
}

TEST(Shamir, BadArgumentsAreRefused) {
  std::mt19937_64 rng(5);
  const Secret s = RandomSecret(rng);
  EXPECT_FALSE(Split(s, 0, Points({1, 2})).ok());
  EXPECT_FALSE(Split(s, 3, Points({1, 2})).ok());
  EXPECT_FALSE(Split(s, 2, Points({1, 1})).ok());
  EXPECT_FALSE(Split(s, 2, Points({0, 1})).ok());
  EXPECT_FALSE(Split(s, 2, Points({1, kFieldPrime})).ok());
  auto shares = Split(s, 2, Points({1, 2}));
  ASSERT_TRUE(shares.ok());
  std::vector<Share> out_of_field = *shares;
  out_of_field[0].y[0] = kFieldPrime;
  EXPECT_EQ(Combine(out_of_field, 2).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<Share> repeated = {(*shares)[0], (*shares)[0]};
  EXPECT_EQ(Combine(repeated, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Crypto, BothSidesAgreeOnTheKeyAndContextSeparatesIt) {
  const KeyPair a = KeyPair::Generate(), b = KeyPair::Generate();
  const std::vector<uint8_t> ctx1 = {1, 2, 3}, ctx2 = {1, 2, 4};
  auto ab = AgreeKey(a, b.public_key(), "purpose", ctx1);
  auto ba = AgreeKey(b, a.public_key(), "purpose", ctx1);
  ASSERT_TRUE(ab.ok() && ba.ok());
  EXPECT_EQ(*ab, *ba);
  EXPECT_NE(*ab, *AgreeKey(a, b.public_key(), "purpose", ctx2));
  EXPECT_NE(*ab, *AgreeKey(a, b.public_key(), "other", ctx1));
  const KeyPair c = KeyPair::Generate();
  EXPECT_NE(*ab, *AgreeKey(a, c.public_key(), "purpose", ctx1));
  auto again = KeyPair::FromSecret(a.secret_key());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->public_key(), a.public_key());
}

TEST(Crypto, SmallOrderKeysAreRefused) {
  PublicKey zero{};
  PublicKey one{};
  one[0] = 1;
  EXPECT_TRUE(IsSmallOrder(zero));
  EXPECT_TRUE(IsSmallOrder(one));
  EXPECT_FALSE(IsSmallOrder(KeyPair::Generate().public_key()));
  const KeyPair a = KeyPair::Generate();
  EXPECT_EQ(AgreeKey(a, zero, "p", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// The signature cache answers as verification does, and stays within two generations however many
// signatures pass through it (a long-running client's would otherwise grow every round).
TEST(SignatureCacheTest, AnswersAsVerificationAndStaysBounded) {
  SignatureCache cache(4);
  const SigningKey key = SigningKey::Generate();
  std::vector<std::vector<uint8_t>> messages;
  std::vector<Signature> signatures;
  for (uint8_t i = 0; i < 10; ++i) {
    messages.push_back({i, 1, 2});
    signatures.push_back(key.Sign(messages.back()));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    EXPECT_TRUE(cache.Verify(key.public_key(), messages[i], signatures[i]));
    EXPECT_LE(cache.size(), 8u);
  }
  // The first ones were dropped with their generation: verified again, still true.
  EXPECT_TRUE(cache.Verify(key.public_key(), messages[0], signatures[0]));
  // A signature over another message is false, cached or not.
  EXPECT_FALSE(cache.Verify(key.public_key(), messages[1], signatures[2]));
  EXPECT_FALSE(cache.Verify(SigningKey::Generate().public_key(), messages[9], signatures[9]));
  EXPECT_LE(cache.size(), 8u);
}

TEST(Crypto, SealedBytesOpenOnlyWithTheirKeyAndBinding) {
  std::mt19937_64 rng(6);
  const Secret key = RandomSecret(rng), other = RandomSecret(rng);
  const std::vector<uint8_t> msg = {9, 8, 7, 6, 5}, ad = {1}, ad2 = {2};
  std::vector<uint8_t> sealed = Seal(key, msg, ad);
  EXPECT_EQ(sealed.size(), msg.size() + kSealOverhead);
  auto opened = Open(key, sealed, ad);
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(*opened, msg);
  EXPECT_EQ(Open(other, sealed, ad).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Open(key, sealed, ad2).status().code(), absl::StatusCode::kDataLoss);
  std::vector<uint8_t> tampered = sealed;
  tampered[30] ^= 1;
  EXPECT_EQ(Open(key, tampered, ad).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Open(key, std::span(sealed).first(10), ad).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_NE(Seal(key, msg, ad), sealed);  // a fresh nonce each time
}

// The mask stream is AES-256-CTR from a zero counter: block i is AES_seed(i as a 128-bit big-endian
// counter), computed here block by block with the bare cipher (ECB), not the CTR mode under test.
TEST(Crypto, MaskStreamIsAes256CounterModeAndCancels) {
  std::mt19937_64 rng(8);
  const Secret seed = RandomSecret(rng);
  // 5000 words crosses the 16 KiB chunk boundary at 64 bits (2048 words per chunk).
  std::vector<uint64_t> acc(5000, 0);
  ASSERT_TRUE(AddMask(seed, 64, 1, acc).ok());
  std::vector<uint8_t> stream(acc.size() * 8, 0);
  EVP_CIPHER_CTX* ecb = EVP_CIPHER_CTX_new();
  ASSERT_EQ(EVP_EncryptInit_ex(ecb, EVP_aes_256_ecb(), nullptr, seed.data(), nullptr), 1);
  EVP_CIPHER_CTX_set_padding(ecb, 0);
  for (size_t block = 0; block * 16 < stream.size(); ++block) {
    uint8_t counter[16] = {};
    for (int b = 0; b < 8; ++b) counter[15 - b] = static_cast<uint8_t>(block >> (8 * b));
    int written = 0;
    ASSERT_EQ(EVP_EncryptUpdate(ecb, stream.data() + 16 * block, &written, counter, 16), 1);
  }
  EVP_CIPHER_CTX_free(ecb);
  for (size_t i = 0; i < acc.size(); ++i) {
    uint64_t w = 0;
    std::memcpy(&w, stream.data() + 8 * i, 8);
    ASSERT_EQ(acc[i], w) << i;
  }
  std::vector<uint64_t> acc32(9000, 0);  // 36,000 bytes of the 40,000 above
  ASSERT_TRUE(AddMask(seed, 32, 1, acc32).ok());
  for (size_t i = 0; i < acc32.size(); ++i) {
    uint32_t w = 0;
    std::memcpy(&w, stream.data() + 4 * i, 4);
    ASSERT_EQ(acc32[i], w) << i;
  }
  ASSERT_TRUE(AddMask(seed, 64, -1, acc).ok());
  EXPECT_TRUE(std::all_of(acc.begin(), acc.end(), [](uint64_t v) { return v == 0; }));
  EXPECT_FALSE(AddMask(seed, 16, 1, acc).ok());
  EXPECT_FALSE(AddMask(seed, 32, 2, acc).ok());
}

TEST(Graph, ParametersMeetTheirBoundsAndGrowLikeLogN) {
  GraphOptions o;  // 10% corrupt, 10% dropouts, 2^-40 and 2^-20
  int previous = 0;
  for (int64_t n : {100, 1000, 10000}) {
    const int64_t c = Colluders(o.corrupt_fraction, n);
    const int64_t m = n * 8 / 10;
    auto p = ChooseParameters(n, m, o);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_GE(PrivacyBits(n, p->edge_threshold, p->threshold, c), 42);
    EXPECT_GE(ReliabilityBits(n, p->edge_threshold, p->threshold, o.dropout_fraction), 20);
    // A smaller t would fail privacy.
    EXPECT_LT(PrivacyBits(n, p->edge_threshold, p->threshold - 1, c), 42);
    auto shares = HonestShares(n, p->edge_threshold, p->threshold, c, m, 40);
    ASSERT_TRUE(shares.ok()) << shares.status();
    EXPECT_GE(*shares, (m - c) * 97 / 100);  // dropping honest members splits off only a few
    EXPECT_GE(p->neighbours, previous);
    previous = p->neighbours;
    std::printf("n %lld (m %lld): k %d, t %d, honest shares %lld\n", static_cast<long long>(n),
                static_cast<long long>(m), p->neighbours, p->threshold,
                static_cast<long long>(*shares));
  }
  // From 1000 to 10000 members (10x), the degree grows by far less than 2x.
  auto k3 = ChooseParameters(1000, 800, o), k4 = ChooseParameters(10000, 8000, o);
  EXPECT_LT(k4->neighbours, 2 * k3->neighbours);
  // Too many dropouts for any graph to be reliable: the complete graph, privacy still met, and
  // the reliability it achieves said.
  GraphOptions hard;
  hard.corrupt_fraction = 0.45;
  hard.dropout_fraction = 0.6;
  auto best = ChooseParameters(50, 48, hard);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->neighbours, 49);
  EXPECT_EQ(best->edge_threshold, kCompleteGraph);
  EXPECT_EQ(best->threshold, 23);  // 22 colluders: 23 shares are beyond them
  EXPECT_LT(best->reliability_bits, 20);
  EXPECT_FALSE(ChooseParameters(1, 1, o).ok());
  GraphOptions bad = o;
  bad.corrupt_fraction = 0.5;
  EXPECT_FALSE(ChooseParameters(100, 80, bad).ok());
  EXPECT_FALSE(ChooseParameters(100, 101, o).ok());
}

// How far an active coordinator can split the honest survivors by choosing who counts as dropped.
TEST(Graph, TheIsolationBoundGrowsWithTheDropsItMayChoose) {
  // The complete graph: the honest survivors are one part whatever is dropped.
  auto complete = IsolationBound(100, kCompleteGraph, 11, 10, 60, 40);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_EQ(complete->cut, 0);
  EXPECT_TRUE(std::isinf(complete->failure_bits));
  EXPECT_EQ(*HonestShares(100, kCompleteGraph, 11, 10, 60, 40), 50);
  // examples/dp_distributed.yaml's session: 1000 members, 50 colluders, 900 survivors.
  const uint64_t p = EdgeThreshold(1000, 46);
  int64_t t = 1;
  while (PrivacyBits(1000, p, static_cast<int>(t), 50) < 41) ++t;
  auto few_drops = IsolationBound(1000, p, static_cast<int>(t), 50, 900, 40);
  ASSERT_TRUE(few_drops.ok()) << few_drops.status();
  EXPECT_GE(few_drops->failure_bits, 40);
  EXPECT_GE(few_drops->cut, 1);  // a member's neighbours can all be dropped: it is cut off
  EXPECT_LE(few_drops->cut, 12);
  // More drops allowed, more can be cut off.
  auto many_drops = IsolationBound(1000, p, static_cast<int>(t), 50, 600, 40);
  ASSERT_TRUE(many_drops.ok());
  EXPECT_GT(many_drops->cut, few_drops->cut);
  // Too sparse a graph for its threshold: refused, with the numbers.
  auto sparse = HonestShares(1000, EdgeThreshold(1000, 6), 3, 50, 900, 40);
  EXPECT_EQ(sparse.status().code(), absl::StatusCode::kFailedPrecondition) << sparse.status();
  // Or too few survivors for the colluders and the cut.
  EXPECT_EQ(HonestShares(100, kCompleteGraph, 11, 10, 10, 40).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ConsistencyQuorum(1000, 50), 526);
  EXPECT_EQ(ConsistencyQuorum(10, 2), 7);
}

TEST(Graph, TheSeedDecidesTheGraphAndEachMemberCanComputeItsOwnRow) {
  GraphSeed seed{};
  seed[0] = 1;
  const uint64_t p = EdgeThreshold(301, 20);
  auto g = RandomGraph(seed, 301, p);
  ASSERT_TRUE(g.ok()) << g.status();
  double degrees = 0;
  for (uint32_t i = 0; i < g->size(); ++i) {
    degrees += static_cast<double>((*g)[i].size());
    for (uint32_t j : (*g)[i]) {
      EXPECT_NE(i, j);
      EXPECT_TRUE(std::binary_search((*g)[j].begin(), (*g)[j].end(), i)) << i << "-" << j;
    }
    EXPECT_TRUE(std::is_sorted((*g)[i].begin(), (*g)[i].end()));
    auto row = Neighbours(seed, 301, p, i);
    ASSERT_TRUE(row.ok());
    EXPECT_EQ(*row, (*g)[i]) << i;
  }
  EXPECT_NEAR(degrees / 301, 20.0, 1.5);      // mean degree ~ k (sd of the mean ~0.26)
  EXPECT_EQ(*RandomGraph(seed, 301, p), *g);  // the same seed, the same graph
  seed[31] = 7;
  EXPECT_NE(*RandomGraph(seed, 301, p), *g);
  auto complete = RandomGraph(seed, 5, kCompleteGraph);
  ASSERT_TRUE(complete.ok());
  for (const auto& n : *complete) EXPECT_EQ(n.size(), 4u);
  std::vector<uint32_t> all(301);
  std::iota(all.begin(), all.end(), 0u);
  EXPECT_TRUE(Connected(*g, all));
  EXPECT_FALSE(Connected(*g, {}));
  uint32_t far = 1;
  while (std::binary_search((*g)[0].begin(), (*g)[0].end(), far)) ++far;
  EXPECT_FALSE(Connected(*g, {0, far}));
  EXPECT_TRUE(Connected(*g, {0, (*g)[0][0]}));
  EXPECT_FALSE(RandomGraph(seed, 1, p).ok());
  EXPECT_FALSE(Neighbours(seed, 10, p, 10).ok());
}

}  // namespace
}  // namespace huddle::aggregation::secagg
