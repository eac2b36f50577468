// The rounding stream: counter-based uniform random bits that every backend computes bit for bit
// alike, for the unbiased stochastic rounding of the update pipeline (kernels/update.h). Word j of
// a stream is a pure function of (key, j), so a GPU thread can compute any word without a shared
// generator state, and the CPU reference (kernels/update_cpu.cc) and the CUDA kernel
// (kernels/cuda/update.cu) produce the same bits for the same key and index.
//
// Keys. The key is a 256-bit ChaCha20 key. ChaCha20 is a cryptographic stream cipher (the same
// cipher as privacy/noise.h's NoiseSource): without the key its keystream cannot be told from
// uniform random bits. NoiseKeyFromSeed() derives a key from a 64-bit seed for tests and
// reproducible experiments (predictable to anyone who knows the seed).
//
// No Gaussian noise comes from here: every noise that protects privacy is the exact discrete
// Gaussian of privacy/noise.h, drawn on the host (DP-SGD adds it as integers on the device,
// kernels/grid_sum.h). The stream's ChaCha20 nonce is kRoundingStream (1); nonce 0 was the
// Box-Muller Gaussian stream that DP-SGD once used on GPUs, and is unused.
//
// Determinism: ChaCha20 is integer arithmetic only.
//
// Thread-safety: every function is pure.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace huddle::kernels {

// A 256-bit ChaCha20 key, as eight little-endian 32-bit words: words[i] holds key bytes
// 4i .. 4i+3, the first byte in the lowest bits (the byte order of libsodium's key argument).
struct NoiseKey {
  uint32_t words[8] = {};
};

inline constexpr uint64_t kRoundingStream = 1;  // ChaCha20 nonce of the stochastic-rounding stream

// One 64-byte ChaCha20 block as 16 little-endian words: D. J. Bernstein's original variant,
// 20 rounds, with the 64-bit block counter in state words 12-13 and the 64-bit nonce in words
// 14-15 (low word first). Equal to bytes [64 * counter, 64 * counter + 64) of libsodium's
// crypto_stream_chacha20(key, nonce) keystream, where the 8 nonce bytes are `nonce` little-endian.
HUDDLE_HD inline void ChaCha20Block(const NoiseKey& key, uint64_t nonce, uint64_t counter,
                                    uint32_t out[16]);

// The index-th 32-bit word of the key's rounding stream: word index % 16 of
// ChaCha20Block(key, kRoundingStream, index / 16).
HUDDLE_HD inline uint32_t RoundingBitsAt(const NoiseKey& key, uint64_t index);

// A reproducible key from a 64-bit seed (splitmix64 expanded into the eight words), for tests and
// reproducible mode. NOT PRIVATE: the key space is only 2^64 and the seed is usually known.
// Different seeds give different keys (the first splitmix64 output is a bijection of the seed).
HUDDLE_HD inline NoiseKey NoiseKeyFromSeed(uint64_t seed);

namespace noise_detail {

HUDDLE_HD inline uint32_t RotateLeft(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

HUDDLE_HD inline void QuarterRound(uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
  a += b;
  d = RotateLeft(d ^ a, 16);
  c += d;
  b = RotateLeft(b ^ c, 12);
  a += b;
  d = RotateLeft(d ^ a, 8);
  c += d;
  b = RotateLeft(b ^ c, 7);
}

HUDDLE_HD inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace noise_detail

HUDDLE_HD inline void ChaCha20Block(const NoiseKey& key, uint64_t nonce, uint64_t counter,
                                    uint32_t out[16]) {
  // "expand 32-byte k", the key, the block counter and the nonce (low words first).
  uint32_t state[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u};
  for (int i = 0; i < 8; ++i) state[4 + i] = key.words[i];
  state[12] = static_cast<uint32_t>(counter);
  state[13] = static_cast<uint32_t>(counter >> 32);
  state[14] = static_cast<uint32_t>(nonce);
  state[15] = static_cast<uint32_t>(nonce >> 32);
  uint32_t x[16];
  for (int i = 0; i < 16; ++i) x[i] = state[i];
  for (int round = 0; round < 20; round += 2) {
    noise_detail::QuarterRound(x[0], x[4], x[8], x[12]);  // columns
    noise_detail::QuarterRound(x[1], x[5], x[9], x[13]);
    noise_detail::QuarterRound(x[2], x[6], x[10], x[14]);
    noise_detail::QuarterRound(x[3], x[7], x[11], x[15]);
    noise_detail::QuarterRound(x[0], x[5], x[10], x[15]);  // diagonals
    noise_detail::QuarterRound(x[1], x[6], x[11], x[12]);
    noise_detail::QuarterRound(x[2], x[7], x[8], x[13]);
    noise_detail::QuarterRound(x[3], x[4], x[9], x[14]);
  }
  for (int i = 0; i < 16; ++i) out[i] = x[i] + state[i];
}

HUDDLE_HD inline uint32_t RoundingBitsAt(const NoiseKey& key, uint64_t index) {
  uint32_t words[16];
  ChaCha20Block(key, kRoundingStream, index / 16, words);
  return words[index % 16];
}

HUDDLE_HD inline NoiseKey NoiseKeyFromSeed(uint64_t seed) {
  NoiseKey key;
  uint64_t state = seed;
  for (int i = 0; i < 4; ++i) {
    const uint64_t v = noise_detail::SplitMix64(state);
    key.words[2 * i] = static_cast<uint32_t>(v);
    key.words[2 * i + 1] = static_cast<uint32_t>(v >> 32);
  }
  return key;
}

}  // namespace huddle::kernels
