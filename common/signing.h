// Ed25519 signatures (libsodium's crypto_sign, RFC 8032): the long-term identities that secure
// aggregation's members sign their messages with, and the project key that certifies them
// (common/member_certificate.h).
//
// A SigningKey holds the 32-byte seed the key pair is derived from (what key files store) and
// wipes its secret when it dies. Verify accepts only canonical signatures of the exact message
// (libsodium rejects a non-canonical S and small-order public keys).
//
// Thread-safety: a SigningKey is a plain value (signing does not change it); Verify is a pure
// function.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"

namespace huddle {

using SigningPublicKey = std::array<uint8_t, 32>;
using SigningSeed = std::array<uint8_t, 32>;
using Signature = std::array<uint8_t, 64>;

class SigningKey {
 public:
  // A fresh key from the OS CSPRNG.
  static SigningKey Generate();
  // The key of `seed` (e.g. read from a key file): the same seed, the same key.
  static SigningKey FromSeed(const SigningSeed& seed);

  SigningKey(const SigningKey&) = default;
  SigningKey& operator=(const SigningKey&) = default;
  ~SigningKey();

  const SigningPublicKey& public_key() const { return public_; }
  const SigningSeed& seed() const { return seed_; }
  Signature Sign(std::span<const uint8_t> message) const;

 private:
  SigningKey() = default;
  SigningSeed seed_{};
  std::array<uint8_t, 64> secret_{};  // libsodium's: seed || public key
  SigningPublicKey public_{};
};

// Whether `signature` is `key`'s over exactly `message`.
bool VerifySignature(const SigningPublicKey& key, std::span<const uint8_t> message,
                     const Signature& signature);

// "ed25519:" + the first 16 hex digits of BLAKE2b-256(key): a short, stable name for logs.
std::string SigningFingerprint(const SigningPublicKey& key);

}  // namespace huddle
