// The building blocks of secure aggregation: the prime field and Shamir sharing, the libsodium
// wrappers (key agreement, sealing, the mask stream), and SecAgg+'s graph and its parameters.
#include <gtest/gtest.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "aggregation/secagg/crypto.h"
#include "aggregation/secagg/graph.h"
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

TEST(Crypto, MaskStreamIsChaCha20AndCancels) {
  std::mt19937_64 rng(8);
  const Secret seed = RandomSecret(rng);
  // 5000 words crosses the 16 KiB chunk boundary at 64 bits (2048 words per chunk).
  std::vector<uint64_t> acc(5000, 0);
  ASSERT_TRUE(AddMask(seed, 64, 1, acc).ok());
  std::vector<uint8_t> stream(acc.size() * 8, 0);
  const uint8_t nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {};
  crypto_stream_chacha20_ietf(stream.data(), stream.size(), nonce, seed.data());
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
  for (int64_t n : {100, 1000, 10000, 100000}) {
    auto p = ChooseParameters(n, o);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_GE(PrivacyBits(n, p->neighbours, p->threshold, o.corrupt_fraction), 40);
    EXPECT_GE(ReliabilityBits(n, p->neighbours, p->threshold, o.dropout_fraction), 20);
    EXPECT_LE(p->threshold, p->neighbours);
    // A smaller t would fail privacy.
    EXPECT_LT(PrivacyBits(n, p->neighbours, p->threshold - 1, o.corrupt_fraction), 40);
    EXPECT_GE(p->neighbours, previous);
    previous = p->neighbours;
    std::printf("n %lld: k %d, t %d\n", static_cast<long long>(n), p->neighbours, p->threshold);
  }
  // From 1000 to 100000 clients (100x), the degree grows by far less than 2x.
  auto k3 = ChooseParameters(1000, o), k5 = ChooseParameters(100000, o);
  EXPECT_LT(k5->neighbours, 2 * k3->neighbours);
  // Too many dropouts for any graph to be reliable: the complete graph, privacy still met, and
  // the reliability it achieves said.
  GraphOptions hard;
  hard.corrupt_fraction = 0.45;
  hard.dropout_fraction = 0.6;
  auto best = ChooseParameters(50, hard);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->neighbours, 49);
  EXPECT_EQ(best->threshold, 23);  // 22 colluders: 23 shares are beyond them
  EXPECT_GE(best->privacy_bits, 40);
  EXPECT_LT(best->reliability_bits, 20);
  EXPECT_FALSE(ChooseParameters(1, o).ok());
  GraphOptions bad = o;
  bad.corrupt_fraction = 0.5;
  EXPECT_FALSE(ChooseParameters(100, bad).ok());
}

TEST(Graph, RandomGraphIsRegularSymmetricAndRandom) {
  auto g = RandomGraph(101, 10);
  ASSERT_TRUE(g.ok());
  for (uint32_t i = 0; i < g->size(); ++i) {
    ASSERT_EQ((*g)[i].size(), 10u) << i;
    for (uint32_t j : (*g)[i]) {
      EXPECT_NE(i, j);
      EXPECT_TRUE(std::binary_search((*g)[j].begin(), (*g)[j].end(), i)) << i << "-" << j;
    }
  }
  auto g2 = RandomGraph(101, 10);
  EXPECT_NE(*g, *g2);  // a fresh random order each time (equal with negligible probability)
  auto complete = RandomGraph(5, 9);
  ASSERT_TRUE(complete.ok());
  for (const auto& n : *complete) EXPECT_EQ(n.size(), 4u);
  std::vector<uint32_t> all(101);
  std::iota(all.begin(), all.end(), 0u);
  EXPECT_TRUE(Connected(*g, all));
  EXPECT_FALSE(Connected(*g, {}));
  // Two members that are not neighbours are not connected on their own.
  uint32_t far = 0;
  while (std::binary_search((*g)[0].begin(), (*g)[0].end(), far) || far == 0) ++far;
  EXPECT_FALSE(Connected(*g, {0, far}));
  EXPECT_TRUE(Connected(*g, {0, (*g)[0][0]}));
}

}  // namespace
}  // namespace huddle::aggregation::secagg
