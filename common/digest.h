// BLAKE2b-256 digests (libsodium) of byte sequences, for identities of released values and
// integrity checks; not for secrets (no key).
//
// Thread-safety: a Digest is a value used by one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace huddle {

class Digest {
 public:
  Digest();
  Digest& Add(std::span<const std::byte> bytes);
  Digest& Add(std::string_view text);  // length-prefixed, so "ab","c" != "a","bc"
  Digest& Add(uint64_t value);         // little-endian
  Digest& Add(double value);           // its bits
  // The 32-byte digest as 64 lowercase hex characters. Ends the digest: call once.
  std::string Hex();

 private:
  alignas(64) unsigned char state_[384];  // crypto_generichash_state (checked in digest.cc)
};

}  // namespace huddle
