// The rounding stream (kernels/noise_stream.h): ChaCha20 against libsodium and a published
// vector, seeded keys, and the stream layout. (CPU-GPU bit parity is tested with the CUDA
// backend, through the update pipeline.)
#include "kernels/noise_stream.h"

#include <gtest/gtest.h>
#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "common/secure_random.h"

namespace huddle::kernels {
namespace {

using Block = std::array<uint32_t, 16>;

Block OurBlock(const NoiseKey& key, uint64_t nonce, uint64_t counter) {
  Block out;
  ChaCha20Block(key, nonce, counter, out.data());
  return out;
}

// Blocks counter, counter + 1, ... of libsodium's crypto_stream_chacha20(key, nonce), in one call
// (so libsodium's own counter carries across the 32-bit boundary).
std::vector<Block> SodiumBlocks(const NoiseKey& key, uint64_t nonce, uint64_t counter, int count) {
  EnsureSodium();
  unsigned char key_bytes[crypto_stream_chacha20_KEYBYTES];
  unsigned char nonce_bytes[crypto_stream_chacha20_NONCEBYTES];
  for (int i = 0; i < 32; ++i) {
    key_bytes[i] = static_cast<unsigned char>(key.words[i / 4] >> (8 * (i % 4)));
  }
  for (int i = 0; i < 8; ++i) nonce_bytes[i] = static_cast<unsigned char>(nonce >> (8 * i));
  std::vector<unsigned char> zeros(64 * static_cast<size_t>(count), 0);
  std::vector<unsigned char> stream(zeros.size());
  crypto_stream_chacha20_xor_ic(stream.data(), zeros.data(), zeros.size(), nonce_bytes, counter,
                                key_bytes);
  std::vector<Block> blocks(static_cast<size_t>(count));
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (int w = 0; w < 16; ++w) {
      const unsigned char* p = &stream[64 * b + 4 * static_cast<size_t>(w)];
      blocks[b][w] =
          uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
    }
  }
  return blocks;
}

// ---- ChaCha20 ----

TEST(ChaCha20BlockTest, MatchesLibsodiumAcrossKeysNoncesAndCounters) {
  NoiseKey all_ones;
  for (uint32_t& w : all_ones.words) w = 0xffffffffu;
  const NoiseKey keys[] = {NoiseKey{}, NoiseKeyFromSeed(1), NoiseKeyFromSeed(0xdeadbeef), all_ones};
  const uint64_t nonces[] = {0, 1, (uint64_t{1} << 63) + 5};
  const uint64_t counters[] = {0, 1, 0xffffffffull, 0x100000000ull, 0xfffffffffffffffeull};
  for (const NoiseKey& key : keys) {
    for (uint64_t nonce : nonces) {
      for (uint64_t counter : counters) {
        // Two blocks per call: from 2^32 - 1 this crosses into the counter's high word.
        const std::vector<Block> expected = SodiumBlocks(key, nonce, counter, 2);
        EXPECT_EQ(OurBlock(key, nonce, counter), expected[0])
            << "nonce " << nonce << " counter " << counter;
        EXPECT_EQ(OurBlock(key, nonce, counter + 1), expected[1])
            << "nonce " << nonce << " counter " << counter + 1;
      }
    }
  }
}

TEST(ChaCha20BlockTest, ZeroKeyKnownAnswer) {
  // Keystream of ChaCha20 with the all-zero key and nonce (draft-agl-tls-chacha20poly1305 test
  // vector 1; its second block is RFC 8439 A.1 test vector 2, where the two variants agree).
  const unsigned char expected[128] = {
      0x76, 0xb8, 0xe0, 0xad, 0xa0, 0xf1, 0x3d, 0x90, 0x40, 0x5d, 0x6a, 0xe5, 0x53, 0x86, 0xbd,
      0x28, 0xbd, 0xd2, 0x19, 0xb8, 0xa0, 0x8d, 0xed, 0x1a, 0xa8, 0x36, 0xef, 0xcc, 0x8b, 0x77,
      0x0d, 0xc7, 0xda, 0x41, 0x59, 0x7c, 0x51, 0x57, 0x48, 0x8d, 0x77, 0x24, 0xe0, 0x3f, 0xb8,
      0xd8, 0x4a, 0x37, 0x6a, 0x43, 0xb8, 0xf4, 0x15, 0x18, 0xa1, 0x1c, 0xc3, 0x87, 0xb6, 0x69,
      0xb2, 0xee, 0x65, 0x86, 0x9f, 0x07, 0xe7, 0xbe, 0x55, 0x51, 0x38, 0x7a, 0x98, 0xba, 0x97,
      0x7c, 0x73, 0x2d, 0x08, 0x0d, 0xcb, 0x0f, 0x29, 0xa0, 0x48, 0xe3, 0x65, 0x69, 0x12, 0xc6,
      0x53, 0x3e, 0x32, 0xee, 0x7a, 0xed, 0x29, 0xb7, 0x21, 0x76, 0x9c, 0xe6, 0x4e, 0x43, 0xd5,
      0x71, 0x33, 0xb0, 0x74, 0xd8, 0x39, 0xd5, 0x31, 0xed, 0x1f, 0x28, 0x51, 0x0a, 0xfb, 0x45,
      0xac, 0xe1, 0x0a, 0x1f, 0x4b, 0x79, 0x4d, 0x6f};
  for (uint64_t counter = 0; counter < 2; ++counter) {
    const Block words = OurBlock(NoiseKey{}, 0, counter);
    for (int i = 0; i < 64; ++i) {
      EXPECT_EQ(static_cast<unsigned char>(words[i / 4] >> (8 * (i % 4))),
                expected[64 * counter + static_cast<uint64_t>(i)])
          << "block " << counter << " byte " << i;
    }
  }
}

TEST(NoiseKeyFromSeedTest, DeterministicAndDistinct) {
  const NoiseKey a = NoiseKeyFromSeed(7);
  const NoiseKey b = NoiseKeyFromSeed(7);
  EXPECT_EQ(0, std::memcmp(a.words, b.words, sizeof(a.words)));
  std::set<std::array<uint32_t, 8>> keys;
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    const NoiseKey key = NoiseKeyFromSeed(seed);
    std::array<uint32_t, 8> words;
    std::copy(std::begin(key.words), std::end(key.words), words.begin());
    keys.insert(words);
  }
  EXPECT_EQ(keys.size(), 1000u);
  EXPECT_EQ(keys.count(std::array<uint32_t, 8>{}), 0u);  // seed 0 does not give the zero key
}

// ---- The rounding stream ----

TEST(StreamsTest, RoundingBitsAreTheRoundingNonceKeystream) {
  const NoiseKey key = NoiseKeyFromSeed(6);
  for (uint64_t base : {uint64_t{0}, uint64_t{1} << 40, ~uint64_t{0} - 31}) {
    for (uint64_t i = base; i < base + 32; ++i) {
      EXPECT_EQ(RoundingBitsAt(key, i), OurBlock(key, kRoundingStream, i / 16)[i % 16]) << i;
    }
  }
}

}  // namespace
}  // namespace huddle::kernels
