// Member certificates: a project key's signed statement that an enrolled client is who it says.
//
// Secure aggregation must hold against a coordinator that cheats (docs/security.md), so a member
// cannot take the coordinator's word for who its peers are. The project key (`huddle keygen
// project`) is held by the privacy owner, not by the coordinator; it certifies each enrolled
// client (`huddle certify`): its id, its transport key (CurveZMQ, what the coordinator admits) and
// its signing key (Ed25519, what it signs its secure-aggregation messages with), optionally until a
// date. Clients pin the project's public key and accept a peer only with a valid certificate, so
// the coordinator can neither invent members nor substitute keys.
//
// The signed bytes are "huddle-member-certificate-v1", then each field length-prefixed or fixed
// size (CertificateMessage), so that no two certificates sign the same bytes.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/signing.h"
#include "common/status.h"

namespace huddle {

using TransportPublicKey = std::array<uint8_t, 32>;

struct MemberCertificate {
  std::string id;                      // the client id (1-128 of [A-Za-z0-9._-])
  TransportPublicKey transport_key{};  // CurveZMQ public key
  SigningPublicKey signing_key{};      // Ed25519 public key
  uint64_t not_after = 0;              // Unix seconds after which it is void; 0: no expiry
  Signature signature{};               // the project key's, over CertificateMessage
  bool operator==(const MemberCertificate&) const = default;
};

// The bytes the project key signs.
std::vector<uint8_t> CertificateMessage(const MemberCertificate& certificate);

// `certificate` with its signature by `project`.
MemberCertificate Certify(MemberCertificate certificate, const SigningKey& project);

// OK when `project` signed `certificate` and it has not expired at `now_unix`. PermissionDenied
// naming the client and why otherwise (wrong project, altered field, expired).
Status VerifyCertificate(const MemberCertificate& certificate, const SigningPublicKey& project,
                         uint64_t now_unix);

}  // namespace huddle
