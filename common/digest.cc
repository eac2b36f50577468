#include "common/digest.h"

#include <sodium.h>

#include <bit>
#include <cstring>

#include "common/secure_random.h"

namespace huddle {
namespace {

static_assert(sizeof(crypto_generichash_state) <= 384, "Digest::state_ is too small");

crypto_generichash_state* State(unsigned char* raw) {
  return reinterpret_cast<crypto_generichash_state*>(raw);
}

}  // namespace

Digest::Digest() {
  EnsureSodium();
  crypto_generichash_init(State(state_), nullptr, 0, crypto_generichash_BYTES);
}

Digest& Digest::Add(std::span<const std::byte> bytes) {
  crypto_generichash_update(State(state_), reinterpret_cast<const unsigned char*>(bytes.data()),
                            bytes.size());
  return *this;
}

Digest& Digest::Add(uint64_t value) {
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(value >> (8 * i));
  crypto_generichash_update(State(state_), le, sizeof le);
  return *this;
}

Digest& Digest::Add(double value) { return Add(std::bit_cast<uint64_t>(value)); }

Digest& Digest::Add(std::string_view text) {
  Add(static_cast<uint64_t>(text.size()));
  return Add(std::as_bytes(std::span(text.data(), text.size())));
}

std::string Digest::Hex() {
  unsigned char out[crypto_generichash_BYTES];
  crypto_generichash_final(State(state_), out, sizeof out);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * sizeof out);
  for (unsigned char b : out) {
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 15]);
  }
  return hex;
}

}  // namespace huddle
