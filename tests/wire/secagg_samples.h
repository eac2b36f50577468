// Secure aggregation's stage messages (aggregation/secagg/protocol.h) as the wire tests use them:
// one sample of each of the twelve types with every field set and every list non-trivial, and
// Reencode, which decodes a stage's bytes with the Decode<T> of that stage and encodes the result
// again (the encoding is canonical: what decodes re-encodes to the same bytes).
//
// The samples are deterministic (recognisable byte patterns); the member list's certificates are
// real Ed25519 signatures by a fixed project key, as a coordinator would relay them. A
// RevealedShare's point is not on the wire (the receiver sets it), so the samples leave it 0.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "aggregation/secagg/protocol.h"
#include "aggregation/secagg/wire.h"
#include "common/member_certificate.h"
#include "common/signing.h"
#include "common/status.h"

namespace huddle::wire::testutil {

namespace secagg = aggregation::secagg;

// N bytes first, first + 1, ... (mod 256).
template <size_t N>
std::array<uint8_t, N> PatternBytes(uint8_t first) {
  std::array<uint8_t, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = static_cast<uint8_t>(first + i);
  return out;
}

// The privacy owner's project key that certifies the sample members.
inline const SigningKey& SampleProjectKey() {
  static const SigningKey key = SigningKey::FromSeed(PatternBytes<32>(0x70));
  return key;
}

inline secagg::Advertisement SampleAdvertisement(uint8_t salt = 0) {
  return {PatternBytes<32>(static_cast<uint8_t>(0x10 + salt)),
          PatternBytes<32>(static_cast<uint8_t>(0x30 + salt)),
          PatternBytes<32>(static_cast<uint8_t>(0x50 + salt))};
}

// Member `cohort_index` of the sample cohort, certified by SampleProjectKey() until `not_after`.
inline secagg::ListedMember SampleListedMember(uint32_t cohort_index, std::string id,
                                               uint64_t not_after) {
  MemberCertificate c;
  c.id = std::move(id);
  c.transport_key = PatternBytes<32>(static_cast<uint8_t>(0xe0 + cohort_index));
  c.signing_key =
      SigningKey::FromSeed(PatternBytes<32>(static_cast<uint8_t>(cohort_index))).public_key();
  c.not_after = not_after;
  const auto salt = static_cast<uint8_t>(cohort_index);
  return {cohort_index, Certify(std::move(c), SampleProjectKey()), SampleAdvertisement(salt)};
}

// Three members of a cohort of ten: ids of three lengths (the list's encoding is 747 bytes, an
// odd length), one certificate without expiry.
inline secagg::MemberList SampleMemberList() {
  return {{SampleListedMember(2, "client-2", 1893456000), SampleListedMember(5, "edge.node_05", 0),
           SampleListedMember(7, "c-7", 0xffffffffffffffffull)}};
}

inline secagg::Reveal SampleReveal(uint8_t salt = 0) {
  return {PatternBytes<32>(static_cast<uint8_t>(0x90 + salt)),
          PatternBytes<64>(static_cast<uint8_t>(0xa0 + salt))};
}
inline secagg::SeedList SampleSeedList() {
  return {{SampleReveal(0), SampleReveal(1), SampleReveal(2)}};
}

// A record as sealed for `peer`: a 120-byte ciphertext (two shares plus the seal's overhead).
inline secagg::ShareRecord SampleShareRecord(uint32_t peer) {
  secagg::ShareRecord r;
  r.peer = peer;
  r.ciphertext.resize(120);
  for (size_t i = 0; i < r.ciphertext.size(); ++i) {
    r.ciphertext[i] = static_cast<uint8_t>(peer * 31 + i);
  }
  r.self_mask_hash = PatternBytes<32>(static_cast<uint8_t>(0x01 + peer));
  r.mask_key_hash = PatternBytes<32>(static_cast<uint8_t>(0x21 + peer));
  r.self_mask_commitment = PatternBytes<32>(0x41);
  r.signature = PatternBytes<64>(static_cast<uint8_t>(0x61 + peer));
  return r;
}
inline secagg::ShareKeys SampleShareKeys() {
  return {PatternBytes<32>(0x41), {SampleShareRecord(0), SampleShareRecord(2)}};
}
inline secagg::ShareList SampleShareList() {
  return {{SampleShareRecord(0), SampleShareRecord(2), SampleShareRecord(6)}};
}

// Every complaint reason once.
inline secagg::Verdict SampleVerdict() {
  using secagg::Complaint;
  return {{{0, Complaint::kMissing},
           {2, Complaint::kBadSignature},
           {5, Complaint::kUnreadable},
           {6, Complaint::kWrongShare}}};
}

inline secagg::MaskRequest SampleMaskRequest() { return {{0, 1, 2, 4, 6}}; }
inline secagg::Survivors SampleSurvivors() { return {{0, 1, 2, 4, 6}, {0, 2, 6}}; }
inline secagg::Consistency SampleConsistency() { return {PatternBytes<64>(0xc0)}; }
inline secagg::UnmaskRequest SampleUnmaskRequest() {
  return {{{0, PatternBytes<64>(0xd0)}, {2, PatternBytes<64>(0xd2)}, {6, PatternBytes<64>(0xd6)}}};
}
// Limbs at both ends of the field (0 and p - 1).
inline secagg::UnmaskResponse SampleUnmaskResponse() {
  constexpr uint64_t kTop = secagg::kFieldPrime - 1;
  secagg::UnmaskResponse r;
  r.self_mask_shares = {{0, secagg::Share{0, {1, 2, 3, 4, kTop}}},
                        {2, secagg::Share{0, {kTop, 0, 0x123456789abcdefull, 7, 8}}}};
  r.mask_key_shares = {{4, secagg::Share{0, {0, 0, 0, 0, 0}}}};
  return r;
}

// The sample of message type T.
template <class T>
T SampleOf();
template <>
inline secagg::Advertisement SampleOf<secagg::Advertisement>() {
  return SampleAdvertisement();
}
template <>
inline secagg::MemberList SampleOf<secagg::MemberList>() {
  return SampleMemberList();
}
template <>
inline secagg::Reveal SampleOf<secagg::Reveal>() {
  return SampleReveal();
}
template <>
inline secagg::SeedList SampleOf<secagg::SeedList>() {
  return SampleSeedList();
}
template <>
inline secagg::ShareKeys SampleOf<secagg::ShareKeys>() {
  return SampleShareKeys();
}
template <>
inline secagg::ShareList SampleOf<secagg::ShareList>() {
  return SampleShareList();
}
template <>
inline secagg::Verdict SampleOf<secagg::Verdict>() {
  return SampleVerdict();
}
template <>
inline secagg::MaskRequest SampleOf<secagg::MaskRequest>() {
  return SampleMaskRequest();
}
template <>
inline secagg::Survivors SampleOf<secagg::Survivors>() {
  return SampleSurvivors();
}
template <>
inline secagg::Consistency SampleOf<secagg::Consistency>() {
  return SampleConsistency();
}
template <>
inline secagg::UnmaskRequest SampleOf<secagg::UnmaskRequest>() {
  return SampleUnmaskRequest();
}
template <>
inline secagg::UnmaskResponse SampleOf<secagg::UnmaskResponse>() {
  return SampleUnmaskResponse();
}

template <class T>
StatusOr<std::string> DecodeAndEncode(std::span<const std::byte> bytes) {
  HUDDLE_ASSIGN_OR_RETURN(T m, secagg::Decode<T>(bytes));
  return secagg::Encode(m);
}

// `bytes` decoded as `stage`'s message and encoded again; the decoder's error otherwise.
// InvalidArgument for a stage outside 1-12.
inline StatusOr<std::string> Reencode(uint32_t stage, std::span<const std::byte> bytes) {
  using secagg::Stage;
  switch (static_cast<Stage>(stage)) {
    case Stage::kAdvertise:
      return DecodeAndEncode<secagg::Advertisement>(bytes);
    case Stage::kMemberList:
      return DecodeAndEncode<secagg::MemberList>(bytes);
    case Stage::kReveal:
      return DecodeAndEncode<secagg::Reveal>(bytes);
    case Stage::kSeeds:
      return DecodeAndEncode<secagg::SeedList>(bytes);
    case Stage::kShares:
      return DecodeAndEncode<secagg::ShareKeys>(bytes);
    case Stage::kShareList:
      return DecodeAndEncode<secagg::ShareList>(bytes);
    case Stage::kVerdict:
      return DecodeAndEncode<secagg::Verdict>(bytes);
    case Stage::kMask:
      return DecodeAndEncode<secagg::MaskRequest>(bytes);
    case Stage::kSurvivors:
      return DecodeAndEncode<secagg::Survivors>(bytes);
    case Stage::kConsistency:
      return DecodeAndEncode<secagg::Consistency>(bytes);
    case Stage::kUnmask:
      return DecodeAndEncode<secagg::UnmaskRequest>(bytes);
    case Stage::kUnmaskResponse:
      return DecodeAndEncode<secagg::UnmaskResponse>(bytes);
  }
  return absl::InvalidArgumentError(absl::StrCat("no secure-aggregation stage ", stage));
}

inline std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s));
}

}  // namespace huddle::wire::testutil
