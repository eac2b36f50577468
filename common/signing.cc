#include "common/signing.h"

#include <sodium.h>

#include "common/secure_random.h"

namespace huddle {

static_assert(crypto_sign_PUBLICKEYBYTES == 32 && crypto_sign_SEEDBYTES == 32);
static_assert(crypto_sign_SECRETKEYBYTES == 64 && crypto_sign_BYTES == 64);

SigningKey SigningKey::Generate() {
  EnsureSodium();
  SigningSeed seed;
  randombytes_buf(seed.data(), seed.size());
  SigningKey key = FromSeed(seed);
  sodium_memzero(seed.data(), seed.size());
  return key;
}

SigningKey SigningKey::FromSeed(const SigningSeed& seed) {
  EnsureSodium();
  SigningKey key;
  key.seed_ = seed;
  crypto_sign_seed_keypair(key.public_.data(), key.secret_.data(), key.seed_.data());
  return key;
}

SigningKey::~SigningKey() {
  sodium_memzero(seed_.data(), seed_.size());
  sodium_memzero(secret_.data(), secret_.size());
}

Signature SigningKey::Sign(std::span<const uint8_t> message) const {
  Signature signature{};
  crypto_sign_detached(signature.data(), nullptr, message.data(), message.size(), secret_.data());
  return signature;
}

bool VerifySignature(const SigningPublicKey& key, std::span<const uint8_t> message,
                     const Signature& signature) {
  EnsureSodium();
  return crypto_sign_verify_detached(signature.data(), message.data(), message.size(),
                                     key.data()) == 0;
}

std::string SigningFingerprint(const SigningPublicKey& key) {
  EnsureSodium();
  uint8_t digest[32];
  crypto_generichash(digest, sizeof digest, key.data(), key.size(), nullptr, 0);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "ed25519:";
  for (int i = 0; i < 8; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

}  // namespace huddle
