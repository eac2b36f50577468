// The noise stream: counter-based standard normals (and uniform rounding bits) that every backend
// computes bit for bit alike. Element j of a stream is a pure function of (key, j), so a GPU
// thread can compute any element without a shared generator state, and the CPU reference
// (kernels/noise_cpu.cc) and the CUDA kernels (kernels/cuda/noise.cu, kernels/update_math.h)
// produce the same bits for the same key and index.
//
// Keys and privacy. The key is a 256-bit ChaCha20 key. ChaCha20 is a cryptographic stream cipher
// (the same cipher as privacy/noise.h's NoiseSource): without the key its keystream cannot be told
// from uniform random bits, so a key drawn from the OS CSPRNG makes the noise unpredictable to
// anyone else. NoiseKeyFromSeed() derives a key from a 64-bit seed for tests and reproducible
// experiments; such noise is NOT private (anyone who knows the seed can subtract it).
//
// What this is not. The normals are IEEE doubles computed by Box-Muller to ~1e-15 relative
// accuracy, from a 53-bit (tail: 106-bit) uniform: a continuous Gaussian, discretised, and
// truncated at |z| = sqrt(212 ln 2) ~ 12.12, beyond which the Gaussian's mass is ~1e-33. It is
// NOT the exact discrete Gaussian of privacy/noise.h, whose integer sampler is immune to the
// floating-point leaks of Mironov (2012); this stream serves the GPU paths that add float noise.
//
// Streams (the ChaCha20 nonce names the stream, the block counter indexes it):
//   kGaussianStream: block b gives the normals 6b .. 6b+5 (StandardNormalBlock);
//   kRoundingStream: block b gives the 32-bit words 16b .. 16b+15 (RoundingBitsAt), the uniform
//                    bits of stochastic rounding (kernels/update.h).
// Distinct nonces under one key give independent keystreams, so the two streams are independent.
//
// Layout of a Gaussian block. The 16 keystream words w[0..15] make three Box-Muller pairs;
// pair p = 0, 1, 2 reads w[5p .. 5p+4]:
//   k   = (w[5p+1] << 32 | w[5p]) >> 11                  53 uniform bits;
//   u   = k * 2^-53 if k != 0, else ((ext >> 11) + 1) * 2^-106 with ext = w[5p+4] << 32 | w[5p+3]
//         (u in [2^-106, 1): the words w[5p+3], w[5p+4] refine only the rare cell k = 0);
//   t   = (w[5p+2] + 0.5) * 2^-32                        in (0, 1), exactly;
//   r   = sqrt(-2 ln u);   z[2p] = r cos(2 pi t),   z[2p+1] = r sin(2 pi t).
// Word 15 is unused.
//
// Determinism. ChaCha20 is integer arithmetic. Every floating-point step below is one correctly
// rounded IEEE double operation from kernels/hd.h (never contracted into a fused multiply-add),
// in a fixed order, and ln, sin and cos are computed here from those operations rather than taken
// from a math library (which differ between glibc and CUDA's libdevice). Integer-to-double
// conversions are exact (at most 53 significant bits). No intermediate value is subnormal, so
// flush-to-zero modes change nothing; the host must only keep the default round-to-nearest mode.
// Hence host and device produce identical bits. Host code that includes this header must be
// compiled with -ffp-contract=off, as huddle_kernels is (see kernels/hd.h): on targets with FMA
// (aarch64, x86-64 built for FMA) the compiler would otherwise fuse hd::Mul into hd::Add.
//
// Cost: one ChaCha20 block (20 rounds) plus three logs and three sine-cosine pairs per 6 normals.
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

inline constexpr uint64_t kGaussianStream = 0;  // ChaCha20 nonce of the Gaussian stream
inline constexpr uint64_t kRoundingStream = 1;  // nonce of the stochastic-rounding stream
inline constexpr int kNormalsPerBlock = 6;      // normals per ChaCha20 block

// One 64-byte ChaCha20 block as 16 little-endian words: D. J. Bernstein's original variant,
// 20 rounds, with the 64-bit block counter in state words 12-13 and the 64-bit nonce in words
// 14-15 (low word first). Equal to bytes [64 * counter, 64 * counter + 64) of libsodium's
// crypto_stream_chacha20(key, nonce) keystream, where the 8 nonce bytes are `nonce` little-endian.
HUDDLE_HD inline void ChaCha20Block(const NoiseKey& key, uint64_t nonce, uint64_t counter,
                                    uint32_t out[16]);

// Normals 6 * block .. 6 * block + 5 of the key's Gaussian stream, from
// ChaCha20Block(key, kGaussianStream, block) by the layout above.
HUDDLE_HD inline void StandardNormalBlock(const NoiseKey& key, uint64_t block, double out[6]);

// The index-th standard normal of the key's Gaussian stream:
// StandardNormalBlock(key, index / 6)[index % 6], computing only the Box-Muller pair it needs.
HUDDLE_HD inline double StandardNormalAt(const NoiseKey& key, uint64_t index);

// The index-th 32-bit word of the key's rounding stream: word index % 16 of
// ChaCha20Block(key, kRoundingStream, index / 16).
HUDDLE_HD inline uint32_t RoundingBitsAt(const NoiseKey& key, uint64_t index);

// A reproducible key from a 64-bit seed (splitmix64 expanded into the eight words), for tests and
// reproducible mode. NOT PRIVATE: the key space is only 2^64 and the seed is usually known.
// Different seeds give different keys (the first splitmix64 output is a bijection of the seed).
HUDDLE_HD inline NoiseKey NoiseKeyFromSeed(uint64_t seed);

// The element formula of AddGaussianNoise (kernels/noise.h), shared by its CPU and CUDA versions:
// float((double(value) + stddev * normal) / divisor), each step one IEEE operation; with
// stddev == 0 only the division happens (so -0.0 and NaN payloads pass through unchanged).
// The one environment dependence: a host thread that flushes subnormals (FlushDenormalsScope)
// turns a subnormal float value or result into zero, where the device keeps it.
HUDDLE_HD inline float AddNoiseAndDivide(float value, double stddev, double normal, double divisor);

// The building blocks, exposed for tests. Accuracy, measured over 10^7 inputs: Log within 1 ulp
// of glibc's log, SinCos2Pi within 2 ulp of a correctly rounded reference (the tests assert 4).
// What matters more is that they are exactly reproducible.
namespace noise_detail {

// ln(u) for u in (0, 1] (also correct for any positive finite u): fdlibm's scheme with a Taylor
// series. u = 2^e * m with m in [sqrt(1/2), sqrt(2)) by exact exponent extraction; with
// f = m - 1 and s = f / (2 + f), ln m = 2 atanh(s) = f - (f^2/2 - s (f^2/2 + R)), where
// R = 2s^2/3 + 2s^4/5 + ... + 2s^20/21 (|s| <= 0.1716, truncation below 2^-59 relative); then
// ln u = e ln2_hi + (ln m + e ln2_lo), e * ln2_hi exact.
HUDDLE_HD inline double Log(double u);

// sin(2 pi t) and cos(2 pi t) for t in [0, 1]. y = 8t (exact) splits the circle into octants
// whose boundaries are exact, so the reduction adds no error even near the zeros of sin and cos;
// within a quadrant the angle pi/4 * a, a in [0, 2), is reflected to pi/4 * r, r in [0, 1], where
// Taylor polynomials (degree 17 for sin, 18 for cos) are accurate to below 2^-60.
HUDDLE_HD inline void SinCos2Pi(double t, double* sin_out, double* cos_out);

// The Box-Muller pair p (0, 1 or 2) of a Gaussian block's words: z[2p], z[2p+1] of the layout.
HUDDLE_HD inline void BoxMullerPair(const uint32_t words[16], int p, double* z0, double* z1);

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

HUDDLE_HD inline double Log(double u) {
  constexpr double kLn2Hi = 0x1.62e42feep-1;              // ln 2's leading 32 bits
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;        // ln 2 - kLn2Hi
  constexpr uint64_t kSqrt2Bits = 0x3ff6a09e667f3bcdull;  // sqrt(2) rounded
  constexpr uint64_t kMantissa = (uint64_t{1} << 52) - 1;
  int e = 0;
  if (u < 0x1p-1022) {  // subnormal: scale into the normal range (exact)
    u = hd::Mul(u, 0x1p54);
    e = -54;
  }
  const uint64_t bits = hd::DoubleBits(u);
  e += static_cast<int>(bits >> 52) - 1023;
  uint64_t m_bits = (bits & kMantissa) | (uint64_t{1023} << 52);  // m in [1, 2)
  if (m_bits >= kSqrt2Bits) {
    // Halve m into [sqrt(1/2), 1).
    m_bits = (bits & kMantissa) | (uint64_t{1022} << 52);
    ++e;
  }
  const double f = hd::Sub(hd::BitsToDouble(m_bits), 1.0);  // exact (Sterbenz)
  const double hfsq = hd::Mul(0.5, hd::Mul(f, f));
  const double s = hd::Div(f, hd::Add(2.0, f));
  const double z = hd::Mul(s, s);
  // R = z (2/3 + z (2/5 + ... + z 2/21)), the coefficients 2/(2k+1) rounded to double.
  double r = 0x1.8618618618618p-4;                   // 2/21
  r = hd::Add(0x1.af286bca1af28p-4, hd::Mul(z, r));  // 2/19
  r = hd::Add(0x1.e1e1e1e1e1e1ep-4, hd::Mul(z, r));  // 2/17
  r = hd::Add(0x1.1111111111111p-3, hd::Mul(z, r));  // 2/15
  r = hd::Add(0x1.3b13b13b13b14p-3, hd::Mul(z, r));  // 2/13
  r = hd::Add(0x1.745d1745d1746p-3, hd::Mul(z, r));  // 2/11
  r = hd::Add(0x1.c71c71c71c71cp-3, hd::Mul(z, r));  // 2/9
  r = hd::Add(0x1.2492492492492p-2, hd::Mul(z, r));  // 2/7
  r = hd::Add(0x1.999999999999ap-2, hd::Mul(z, r));  // 2/5
  r = hd::Add(0x1.5555555555555p-1, hd::Mul(z, r));  // 2/3
  r = hd::Mul(z, r);
  const double dk = static_cast<double>(e);
  // dk * ln2_hi - ((hfsq - (s (hfsq + R) + dk * ln2_lo)) - f)
  const double tail = hd::Add(hd::Mul(s, hd::Add(hfsq, r)), hd::Mul(dk, kLn2Lo));
  return hd::Sub(hd::Mul(dk, kLn2Hi), hd::Sub(hd::Sub(hfsq, tail), f));
}

// sin and cos of x in [0, pi/4], x * x = z.
HUDDLE_HD inline double SinPoly(double x, double z) {
  // sin x = x + x z (-1/3! + z (1/5! - ... + z 1/17!))
  double p = 0x1.952c77030ad4ap-49;                    // 1/17!
  p = hd::Add(-0x1.ae7f3e733b81fp-41, hd::Mul(z, p));  // -1/15!
  p = hd::Add(0x1.6124613a86d09p-33, hd::Mul(z, p));   // 1/13!
  p = hd::Add(-0x1.ae64567f544e4p-26, hd::Mul(z, p));  // -1/11!
  p = hd::Add(0x1.71de3a556c734p-19, hd::Mul(z, p));   // 1/9!
  p = hd::Add(-0x1.a01a01a01a01ap-13, hd::Mul(z, p));  // -1/7!
  p = hd::Add(0x1.1111111111111p-7, hd::Mul(z, p));    // 1/5!
  p = hd::Add(-0x1.5555555555555p-3, hd::Mul(z, p));   // -1/3!
  return hd::Add(x, hd::Mul(hd::Mul(x, z), p));
}

HUDDLE_HD inline double CosPoly(double z) {
  // cos x = (1 - z/2) + z^2 (1/4! - z (1/6! - ... + z 1/18!)); 1 - z/2 is rounded once and its
  // rounding error ((1 - w) - z/2, exact) added back with the small terms, as in fdlibm.
  double q = -0x1.6827863b97d97p-53;                   // -1/18!
  q = hd::Add(0x1.ae7f3e733b81fp-45, hd::Mul(z, q));   // 1/16!
  q = hd::Add(-0x1.93974a8c07c9dp-37, hd::Mul(z, q));  // -1/14!
  q = hd::Add(0x1.1eed8eff8d898p-29, hd::Mul(z, q));   // 1/12!
  q = hd::Add(-0x1.27e4fb7789f5cp-22, hd::Mul(z, q));  // -1/10!
  q = hd::Add(0x1.a01a01a01a01ap-16, hd::Mul(z, q));   // 1/8!
  q = hd::Add(-0x1.6c16c16c16c17p-10, hd::Mul(z, q));  // -1/6!
  q = hd::Add(0x1.5555555555555p-5, hd::Mul(z, q));    // 1/4!
  const double hz = hd::Mul(0.5, z);
  const double w = hd::Sub(1.0, hz);
  const double w_error = hd::Sub(hd::Sub(1.0, w), hz);
  return hd::Add(w, hd::Add(w_error, hd::Mul(hd::Mul(z, z), q)));
}

HUDDLE_HD inline void SinCos2Pi(double t, double* sin_out, double* cos_out) {
  constexpr double kPiOver4 = 0x1.921fb54442d18p-1;
  const double y = hd::Mul(t, 8.0);  // 2 pi t = pi/4 * y, y in [0, 8], exact
  const int quadrant = static_cast<int>(y) >> 1;
  // The angle within the quadrant is pi/4 * a, a in [0, 2); both subtractions are exact
  // (Sterbenz), so the reduced argument r is exact and only pi/4 * r rounds.
  const double a = hd::Sub(y, static_cast<double>(2 * quadrant));
  const bool reflect = a > 1.0;  // sin(pi/4 a) = cos(pi/4 (2 - a)) and vice versa
  const double r = reflect ? hd::Sub(2.0, a) : a;
  const double x = hd::Mul(r, kPiOver4);  // in [0, pi/4]
  const double z = hd::Mul(x, x);
  const double sin_x = SinPoly(x, z);
  const double cos_x = CosPoly(z);
  const double s = reflect ? cos_x : sin_x;  // sin and cos of the angle within the quadrant
  const double c = reflect ? sin_x : cos_x;
  switch (quadrant & 3) {  // rotate by quadrant * pi/2 (quadrant 4 is t == 1, the full turn)
    case 0:
      *sin_out = s;
      *cos_out = c;
      break;
    case 1:
      *sin_out = c;
      *cos_out = -s;
      break;
    case 2:
      *sin_out = -s;
      *cos_out = -c;
      break;
    default:
      *sin_out = -c;
      *cos_out = s;
      break;
  }
}

HUDDLE_HD inline void BoxMullerPair(const uint32_t words[16], int p, double* z0, double* z1) {
  const uint32_t* w = words + 5 * p;
  const uint64_t k = ((static_cast<uint64_t>(w[1]) << 32) | w[0]) >> 11;
  double u;  // uniform in [2^-106, 1); every conversion below is exact (< 2^53)
  if (k != 0) {
    u = hd::Mul(static_cast<double>(k), 0x1p-53);
  } else {  // the cell (0, 2^-53], refined by 53 more bits: radii beyond 8.57
    const uint64_t ext = (static_cast<uint64_t>(w[4]) << 32) | w[3];
    u = hd::Mul(static_cast<double>((ext >> 11) + 1), 0x1p-106);
  }
  const double t = hd::Mul(hd::Add(static_cast<double>(w[2]), 0.5), 0x1p-32);
  const double radius = hd::Sqrt(hd::Mul(-2.0, Log(u)));
  double sin_t;
  double cos_t;
  SinCos2Pi(t, &sin_t, &cos_t);
  *z0 = hd::Mul(radius, cos_t);
  *z1 = hd::Mul(radius, sin_t);
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

HUDDLE_HD inline void StandardNormalBlock(const NoiseKey& key, uint64_t block, double out[6]) {
  uint32_t words[16];
  ChaCha20Block(key, kGaussianStream, block, words);
  for (int p = 0; p < 3; ++p) noise_detail::BoxMullerPair(words, p, &out[2 * p], &out[2 * p + 1]);
}

HUDDLE_HD inline double StandardNormalAt(const NoiseKey& key, uint64_t index) {
  uint32_t words[16];
  ChaCha20Block(key, kGaussianStream, index / kNormalsPerBlock, words);
  const int j = static_cast<int>(index % kNormalsPerBlock);
  double z0;
  double z1;
  noise_detail::BoxMullerPair(words, j / 2, &z0, &z1);
  return j % 2 == 0 ? z0 : z1;
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

HUDDLE_HD inline float AddNoiseAndDivide(float value, double stddev, double normal,
                                         double divisor) {
  const double x = static_cast<double>(value);
  const double noised = stddev > 0 ? hd::Add(x, hd::Mul(stddev, normal)) : x;
  return static_cast<float>(hd::Div(noised, divisor));
}

}  // namespace huddle::kernels
