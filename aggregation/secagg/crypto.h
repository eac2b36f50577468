// The cryptography of secure aggregation (aggregation/secagg/), from libsodium only:
//
//   KeyPair        an X25519 key pair from the OS CSPRNG; the secret is wiped when it dies
//   AgreeKey       a 32-byte key that two key pairs derive alike: BLAKE2b-256 of a purpose label,
//                  the session's context bytes, the X25519 shared point and both public keys in
//                  a canonical order (never the raw point, as libsodium advises); an all-zero
//                  point (a small-order public key) is refused
//   Seal / Open    XChaCha20-Poly1305 (IETF) with a random 24-byte nonce prepended; the associated
//                  data binds a ciphertext to what it is for (session, sender, receiver), so a
//                  share cannot be replayed into another round or to another client
//   AddMask        the mask stream: AES-256 in counter mode (OpenSSL's, AES-NI where the CPU has
//                  it: 5.6 GB/s a core here against ChaCha20's 1.7, and a member expands one
//                  stream per neighbour) keyed with the full 32-byte seed, its keystream read as
//                  little-endian words of the aggregation's width (32 or 64 bits) and added to or
//                  subtracted from an accumulator modulo 2^64 (the caller reduces mod 2^bits, which
//                  2^64 is a multiple of)
//
// Thread-safety: pure functions; a KeyPair is a plain value (not shared mutably).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "aggregation/secagg/shamir.h"
#include "common/status.h"

namespace huddle::aggregation::secagg {

using PublicKey = std::array<uint8_t, 32>;

class KeyPair {
 public:
  // A fresh pair from the OS CSPRNG.
  static KeyPair Generate();
  // The pair of a secret key (e.g. one reconstructed from shares): its public key recomputed.
  // InvalidArgument if the secret gives no valid public key.
  static StatusOr<KeyPair> FromSecret(const Secret& secret);

  KeyPair(const KeyPair&) = default;
  KeyPair& operator=(const KeyPair&) = default;
  ~KeyPair();  // wipes the secret

  const PublicKey& public_key() const { return public_; }
  const Secret& secret_key() const { return secret_; }

 private:
  KeyPair() = default;
  PublicKey public_{};
  Secret secret_{};
};

// Whether `key` is a point of small order (every key agreement with it gives the all-zero point):
// such keys are refused where they arrive.
bool IsSmallOrder(const PublicKey& key);

// The key that `mine` and the holder of `theirs` both derive for `purpose` in `context`.
// InvalidArgument when `theirs` is a small-order point (the shared point is all zeros).
StatusOr<Secret> AgreeKey(const KeyPair& mine, const PublicKey& theirs, std::string_view purpose,
                          std::span<const uint8_t> context);

// nonce || ciphertext || tag of `plaintext` under `key`, bound to `ad`.
std::vector<uint8_t> Seal(const Secret& key, std::span<const uint8_t> plaintext,
                          std::span<const uint8_t> ad);
// The plaintext, or DataLoss when `sealed` is not a ciphertext of this key and `ad` (forged,
// corrupted, truncated, or meant for another session, sender or receiver).
StatusOr<std::vector<uint8_t>> Open(const Secret& key, std::span<const uint8_t> sealed,
                                    std::span<const uint8_t> ad);
inline constexpr size_t kSealOverhead = 24 + 16;  // nonce + Poly1305 tag

// acc[i] += sign * w_i (mod 2^64) for i < acc.size(), where w_i is the i-th little-endian word of
// `bits` bits (32 or 64) of AES-256-CTR's keystream under `seed` (counter from 0); sign is +1 or
// -1. The words are the same for every caller with the same seed: the mask the clients add is the
// one the coordinator removes. InvalidArgument for another width or sign.
Status AddMask(const Secret& seed, int bits, int sign, std::span<uint64_t> acc);

// BLAKE2b-256 of `data` (commitments to secrets).
std::array<uint8_t, 32> Hash(std::span<const uint8_t> data);

}  // namespace huddle::aggregation::secagg
