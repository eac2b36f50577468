// The transcript of secure aggregation (protocol.h): what each hash and signature covers, for the
// member and the coordinator alike; and the helpers both sides share (internal.h).
#include "aggregation/secagg/protocol.h"

#include <sodium.h>

#include <bit>
#include <cstring>

#include "aggregation/secagg/internal.h"
#include "common/secure_random.h"

namespace huddle::aggregation::secagg {

namespace {

// BLAKE2b-256 over a domain label and fields, each fixed-size or length-prefixed, so that no two
// different field sequences hash the same bytes.
class Hasher {
 public:
  explicit Hasher(std::string_view domain) {
    EnsureSodium();
    crypto_generichash_init(&state_, nullptr, 0, 32);
    Bytes(std::span(reinterpret_cast<const uint8_t*>(domain.data()), domain.size()));
  }
  Hasher& Bytes(std::span<const uint8_t> b) {
    U64(b.size());
    crypto_generichash_update(&state_, b.data(), b.size());
    return *this;
  }
  Hasher& U64(uint64_t v) {
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(v >> (8 * i));
    crypto_generichash_update(&state_, le, sizeof le);
    return *this;
  }
  Hasher& Share(const secagg::Share& s) {
    U64(s.x);
    for (uint64_t y : s.y) U64(y);
    return *this;
  }
  Hasher& Set(const std::vector<uint32_t>& members) {
    U64(members.size());
    for (uint32_t m : members) U64(m);
    return *this;
  }
  Hash32 Final() {
    Hash32 out{};
    crypto_generichash_final(&state_, out.data(), out.size());
    return out;
  }

 private:
  crypto_generichash_state state_;
};

// A message to sign: a domain label, then fixed-size fields (so plain concatenation is
// unambiguous).
class Message {
 public:
  explicit Message(std::string_view domain) {
    bytes_.assign(domain.begin(), domain.end());
    bytes_.push_back(0);
  }
  Message& Bytes(std::span<const uint8_t> b) {
    bytes_.insert(bytes_.end(), b.begin(), b.end());
    return *this;
  }
  Message& U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  std::vector<uint8_t> Take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace

const char* ComplaintName(Complaint c) {
  switch (c) {
    case Complaint::kMissing:
      return "missing";
    case Complaint::kBadSignature:
      return "bad_signature";
    case Complaint::kUnreadable:
      return "unreadable";
    case Complaint::kWrongShare:
      return "wrong_share";
  }
  return "unknown";
}

Hash32 SeedCommitment(const SessionId& session, const std::array<uint8_t, 32>& seed) {
  return Hasher("huddle-secagg-v2/seed-commitment").Bytes(session).Bytes(seed).Final();
}

Hash32 MemberListDigest(const SessionConfig& c, const MemberList& list) {
  Hasher h("huddle-secagg-v2/member-list");
  h.Bytes(c.session)
      .U64(c.members)
      .U64(c.threshold)
      .U64(c.edge_threshold)
      .U64(c.min_survivors)
      .U64(static_cast<uint64_t>(c.bits))
      .U64(c.length)
      .U64(static_cast<uint64_t>(static_cast<int64_t>(c.scale_exponent)))
      .U64(c.noise_variance)
      .U64(c.weight_cap)
      .U64(std::bit_cast<uint64_t>(c.clip_norm));
  h.U64(list.members.size());
  for (const ListedMember& m : list.members) {
    const MemberCertificate& cert = m.certificate;
    h.U64(m.cohort_index)
        .Bytes(std::span(reinterpret_cast<const uint8_t*>(cert.id.data()), cert.id.size()))
        .Bytes(cert.transport_key)
        .Bytes(cert.signing_key)
        .U64(cert.not_after)
        .Bytes(cert.signature)
        .Bytes(m.keys.cipher_key)
        .Bytes(m.keys.mask_key)
        .Bytes(m.keys.seed_commitment);
  }
  return h.Final();
}

std::vector<uint8_t> RevealMessage(const SessionId& session, const Hash32& list_digest,
                                   uint32_t index, const std::array<uint8_t, 32>& seed) {
  return Message("huddle-secagg-v2/reveal")
      .Bytes(session)
      .Bytes(list_digest)
      .U32(index)
      .Bytes(seed)
      .Take();
}

GraphSeed JointSeed(const SessionId& session, const Hash32& list_digest, const SeedList& seeds) {
  Hasher h("huddle-secagg-v2/graph-seed");
  h.Bytes(session).Bytes(list_digest).U64(seeds.reveals.size());
  for (const Reveal& r : seeds.reveals) h.Bytes(r.seed);
  return h.Final();
}

Hash32 ShareHash(const SessionId& session, bool self_mask, uint32_t from, uint32_t to,
                 const Share& share) {
  return Hasher(self_mask ? "huddle-secagg-v2/self-mask-share" : "huddle-secagg-v2/mask-key-share")
      .Bytes(session)
      .U64(from)
      .U64(to)
      .Share(share)
      .Final();
}

std::vector<uint8_t> ShareMessage(const SessionId& session, const Hash32& list_digest,
                                  uint32_t from, uint32_t to, const ShareRecord& record) {
  const Hash32 sealed = Hash(record.ciphertext);
  return Message("huddle-secagg-v2/share")
      .Bytes(session)
      .Bytes(list_digest)
      .U32(from)
      .U32(to)
      .Bytes(sealed)
      .Bytes(record.self_mask_hash)
      .Bytes(record.mask_key_hash)
      .Bytes(record.self_mask_commitment)
      .Take();
}

std::vector<uint8_t> SurvivorsMessage(const SessionId& session, const Hash32& list_digest,
                                      const Survivors& sets) {
  const Hash32 shared = Hasher("huddle-secagg-v2/shared").Set(sets.shared).Final();
  const Hash32 survivors = Hasher("huddle-secagg-v2/survivors").Set(sets.survivors).Final();
  return Message("huddle-secagg-v2/consistency")
      .Bytes(session)
      .Bytes(list_digest)
      .Bytes(shared)
      .Bytes(survivors)
      .Take();
}

std::vector<uint8_t> ShareAssociatedData(const SessionId& session, uint32_t from, uint32_t to) {
  return Message(internal::kShareKeyPurpose).Bytes(session).U32(from).U32(to).Take();
}

bool SignatureCache::Verify(const SigningPublicKey& key, std::span<const uint8_t> message,
                            const Signature& signature) {
  const Hash32 id =
      Hasher("huddle-secagg-v2/verified").Bytes(key).Bytes(message).Bytes(signature).Final();
  {
    absl::MutexLock lock(&mu_);
    if (newer_.count(id) != 0 || older_.count(id) != 0) return true;
  }
  if (!VerifySignature(key, message, signature)) return false;
  absl::MutexLock lock(&mu_);
  if (newer_.size() >= generation_) {
    older_ = std::move(newer_);
    newer_ = {};
  }
  newer_.insert(id);
  return true;
}

size_t SignatureCache::size() const {
  absl::MutexLock lock(&mu_);
  return newer_.size() + older_.size();
}

namespace internal {

std::vector<uint8_t> EncodeShares(const Share& self_mask, const Share& mask_key) {
  std::vector<uint8_t> out;
  out.reserve(kSharePlaintextBytes);
  for (const Share* s : {&self_mask, &mask_key}) {
    for (uint64_t y : s->y) {
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(y >> (8 * i)));
    }
  }
  return out;
}

StatusOr<std::pair<Share, Share>> DecodeShares(std::span<const uint8_t> bytes, uint64_t x) {
  if (bytes.size() != kSharePlaintextBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a sealed share pair holds ", bytes.size(),
                                                   " bytes, not ", kSharePlaintextBytes));
  }
  std::pair<Share, Share> out;
  out.first.x = out.second.x = x;
  size_t at = 0;
  for (Share* s : {&out.first, &out.second}) {
    for (uint64_t& y : s->y) {
      y = 0;
      for (int i = 0; i < 8; ++i) y |= uint64_t{bytes[at++]} << (8 * i);
      if (y >= kFieldPrime) return absl::InvalidArgumentError("a share value is outside the field");
    }
  }
  return out;
}

std::vector<uint8_t> AgreementContext(const SessionId& session, const Hash32& list_digest) {
  std::vector<uint8_t> out(session.begin(), session.end());
  out.insert(out.end(), list_digest.begin(), list_digest.end());
  return out;
}

bool SortedSetBelow(const std::vector<uint32_t>& v, uint64_t n) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] >= n || (i > 0 && v[i] <= v[i - 1])) return false;
  }
  return true;
}

Status CheckConfig(const SessionConfig& c) {
  if (c.bits != 32 && c.bits != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation over ", c.bits, " bits: 32 or 64"));
  }
  if (c.members < 2 || c.members > kMaxMembers) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation of ", c.members, " members: 2 to ", kMaxMembers));
  }
  if (c.threshold < 1 || c.threshold >= c.members) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation threshold ", c.threshold,
                                                   " for ", c.members, ": in [1, members)"));
  }
  if (c.edge_threshold < 1 || c.edge_threshold > kCompleteGraph) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation edge threshold ", c.edge_threshold, ": in [1, 2^32]"));
  }
  if (c.min_survivors < 1 || c.min_survivors > c.members) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_survivors ", c.min_survivors, ": in [1, ", c.members, "]"));
  }
  if (c.length < 1 || c.length > (uint64_t{1} << 36)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation of ", c.length, " words: 1 to 2^36"));
  }
  return absl::OkStatus();
}

}  // namespace internal

}  // namespace huddle::aggregation::secagg
