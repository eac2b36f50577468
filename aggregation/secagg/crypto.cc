#include "aggregation/secagg/crypto.h"

#include <openssl/evp.h>
#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "common/secure_random.h"

namespace huddle::aggregation::secagg {

namespace {

static_assert(crypto_box_PUBLICKEYBYTES == 32 && crypto_box_SECRETKEYBYTES == 32);
static_assert(crypto_scalarmult_BYTES == 32 && crypto_scalarmult_SCALARBYTES == 32);
static_assert(crypto_aead_xchacha20poly1305_ietf_KEYBYTES == kSecretBytes);
static_assert(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES +
                  crypto_aead_xchacha20poly1305_ietf_ABYTES ==
              kSealOverhead);

// Hashes a length-prefixed field, so that no two different field sequences hash the same bytes.
void HashField(crypto_generichash_state* state, const uint8_t* data, size_t size) {
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t{size} >> (8 * i));
  crypto_generichash_update(state, length, sizeof length);
  crypto_generichash_update(state, data, size);
}

}  // namespace

KeyPair KeyPair::Generate() {
  EnsureSodium();
  KeyPair pair;
  crypto_box_keypair(pair.public_.data(), pair.secret_.data());
  return pair;
}

StatusOr<KeyPair> KeyPair::FromSecret(const Secret& secret) {
  EnsureSodium();
  KeyPair pair;
  pair.secret_ = secret;
  if (crypto_scalarmult_base(pair.public_.data(), pair.secret_.data()) != 0) {
    return absl::InvalidArgumentError("the secret key gives no valid X25519 public key");
  }
  return pair;
}

KeyPair::~KeyPair() { sodium_memzero(secret_.data(), secret_.size()); }

bool IsSmallOrder(const PublicKey& key) {
  // X25519 clamps every scalar to a multiple of 8, the curve's cofactor: a point of order 1, 2, 4
  // or 8 times any clamped scalar is the identity, which crypto_scalarmult refuses (-1). The
  // scalar is fixed and public: only the all-zero result matters.
  static const KeyPair probe = KeyPair::Generate();
  uint8_t point[crypto_scalarmult_BYTES];
  const bool small = crypto_scalarmult(point, probe.secret_key().data(), key.data()) != 0;
  sodium_memzero(point, sizeof point);
  return small;
}

StatusOr<Secret> AgreeKey(const KeyPair& mine, const PublicKey& theirs, std::string_view purpose,
                          std::span<const uint8_t> context) {
  EnsureSodium();
  uint8_t point[crypto_scalarmult_BYTES];
  if (crypto_scalarmult(point, mine.secret_key().data(), theirs.data()) != 0) {
    sodium_memzero(point, sizeof point);
    return absl::InvalidArgumentError(
        "key agreement refused: the peer's public key is a small-order point");
  }
  const PublicKey& a = std::min(mine.public_key(), theirs);
  const PublicKey& b = std::max(mine.public_key(), theirs);
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, kSecretBytes);
  HashField(&state, reinterpret_cast<const uint8_t*>(purpose.data()), purpose.size());
  HashField(&state, context.data(), context.size());
  HashField(&state, point, sizeof point);
  HashField(&state, a.data(), a.size());
  HashField(&state, b.data(), b.size());
  Secret key{};
  crypto_generichash_final(&state, key.data(), key.size());
  sodium_memzero(point, sizeof point);
  sodium_memzero(&state, sizeof state);
  return key;
}

std::vector<uint8_t> Seal(const Secret& key, std::span<const uint8_t> plaintext,
                          std::span<const uint8_t> ad) {
  EnsureSodium();
  std::vector<uint8_t> out(kSealOverhead + plaintext.size());
  uint8_t* nonce = out.data();
  randombytes_buf(nonce, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
  unsigned long long written = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(
      out.data() + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES, &written, plaintext.data(),
      plaintext.size(), ad.data(), ad.size(), nullptr, nonce, key.data());
  return out;
}

StatusOr<std::vector<uint8_t>> Open(const Secret& key, std::span<const uint8_t> sealed,
                                    std::span<const uint8_t> ad) {
  EnsureSodium();
  if (sealed.size() < kSealOverhead) {
    return absl::DataLossError(absl::StrCat("a sealed message of ", sealed.size(),
                                            " bytes is shorter than its nonce and tag"));
  }
  std::vector<uint8_t> out(sealed.size() - kSealOverhead);
  unsigned long long written = 0;
  const uint8_t* nonce = sealed.data();
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(
          out.data(), &written, nullptr,
          sealed.data() + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
          sealed.size() - crypto_aead_xchacha20poly1305_ietf_NPUBBYTES, ad.data(), ad.size(), nonce,
          key.data()) != 0) {
    return absl::DataLossError(
        "a sealed message failed authentication (forged, corrupted, or for another key, session "
        "or party)");
  }
  return out;
}

Status AddMask(const Secret& seed, int bits, int sign, std::span<uint64_t> acc) {
  if (bits != 32 && bits != 64) {
    return absl::InvalidArgumentError(absl::StrCat("mask words of ", bits, " bits: 32 or 64"));
  }
  if (sign != 1 && sign != -1) {
    return absl::InvalidArgumentError(absl::StrCat("mask sign ", sign, ": +1 or -1"));
  }
  const size_t word_bytes = static_cast<size_t>(bits) / 8;
  if (acc.size() > (uint64_t{1} << 40) / word_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a mask of ", acc.size(), " words exceeds the mask stream"));
  }
  // AES-256 in counter mode from a zero counter block, keyed with the whole seed: the keystream is
  // the encryption of zeros. A seed keys one stream only (each is a fresh pairwise or self-mask
  // key of one session), so a fixed counter start is safe.
  std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)> ctx(EVP_CIPHER_CTX_new(),
                                                                      EVP_CIPHER_CTX_free);
  static constexpr uint8_t kCounter[16] = {};
  if (!ctx ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_ctr(), nullptr, seed.data(), kCounter) != 1) {
    return absl::InternalError("the mask stream (AES-256-CTR) could not be set up");
  }
  constexpr size_t kChunkBytes = 16384;  // a multiple of both word sizes
  alignas(8) static thread_local uint8_t zeros[kChunkBytes] = {};
  alignas(8) uint8_t stream[kChunkBytes];
  for (size_t done = 0; done < acc.size();) {
    const size_t words = std::min(acc.size() - done, kChunkBytes / word_bytes);
    const int bytes = static_cast<int>(words * word_bytes);
    int written = 0;
    if (EVP_EncryptUpdate(ctx.get(), stream, &written, zeros, bytes) != 1 || written != bytes) {
      sodium_memzero(stream, sizeof stream);
      return absl::InternalError("the mask stream (AES-256-CTR) failed");
    }
    uint64_t* out = acc.data() + done;
    if (bits == 32) {
      for (size_t i = 0; i < words; ++i) {
        uint32_t w;
        std::memcpy(&w, stream + 4 * i, 4);  // little-endian hosts only (x86-64, aarch64)
        out[i] = sign > 0 ? out[i] + w : out[i] - w;
      }
    } else {
      for (size_t i = 0; i < words; ++i) {
        uint64_t w;
        std::memcpy(&w, stream + 8 * i, 8);
        out[i] = sign > 0 ? out[i] + w : out[i] - w;
      }
    }
    done += words;
  }
  sodium_memzero(stream, sizeof stream);
  return absl::OkStatus();
}

std::array<uint8_t, 32> Hash(std::span<const uint8_t> data) {
  EnsureSodium();
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), data.data(), data.size(), nullptr, 0);
  return out;
}

}  // namespace huddle::aggregation::secagg
