// Secure aggregation's messages on the wire (docs/protocol.md). Every stage but the masked input
// travels as a wire::SecAggData (its stage and, from a member, the FitInstruction's nonce) carrying
// one uint8 frame named "secagg": the stage's message in the binary encoding below. The lists grow
// with the session (a member list is ~250 bytes a member), so they travel as a frame, not inside
// the 64 KiB protobuf header; the coordinator encodes a list once and shares the bytes with every
// member.
//
// Encoding: little-endian fixed-width integers, fixed-size byte arrays, and counts before lists,
// each count bounded (members <= kMaxMembers, records <= kMaxNeighbours, ids 1-128 valid client-id
// characters, ciphertexts <= 256 bytes). Decode refuses a truncated message, a count past its bound
// or trailing bytes with InvalidArgument naming the field; it never trusts a length it has not
// checked against what remains. The session's settings (what the FitInstruction says) map onto
// wire::SecureAggregation.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "aggregation/secagg/protocol.h"
#include "proto/messages.h"

namespace huddle::aggregation::secagg {

enum class Stage : uint32_t {
  kAdvertise = 1,        // member -> coordinator: Advertisement
  kMemberList = 2,       // coordinator -> member: MemberList
  kReveal = 3,           // member -> coordinator: Reveal
  kSeeds = 4,            // coordinator -> member: SeedList
  kShares = 5,           // member -> coordinator: ShareKeys
  kShareList = 6,        // coordinator -> member: ShareList
  kVerdict = 7,          // member -> coordinator: Verdict
  kMask = 8,             // coordinator -> member: MaskRequest
  kSurvivors = 9,        // coordinator -> member: Survivors
  kConsistency = 10,     // member -> coordinator: Consistency
  kUnmask = 11,          // coordinator -> member: UnmaskRequest
  kUnmaskResponse = 12,  // member -> coordinator: UnmaskResponse
};
const char* StageName(Stage stage);
// Whether `stage` is a message a member sends (else the coordinator does); false for an unknown
// one.
bool FromMember(uint32_t stage);
bool IsStage(uint32_t stage);

// The name of the frame that carries a stage's bytes.
inline constexpr const char* kPayloadName = "secagg";

// Each message's bytes.
std::string Encode(const Advertisement& m);
std::string Encode(const MemberList& m);
std::string Encode(const Reveal& m);
std::string Encode(const SeedList& m);
std::string Encode(const ShareKeys& m);
std::string Encode(const ShareList& m);
std::string Encode(const Verdict& m);
std::string Encode(const MaskRequest& m);
std::string Encode(const Survivors& m);
std::string Encode(const Consistency& m);
std::string Encode(const UnmaskRequest& m);
std::string Encode(const UnmaskResponse& m);

// The message of type T in `bytes` (T one of the above).
template <class T>
StatusOr<T> Decode(std::span<const std::byte> bytes);

// The stage every message type travels as.
template <class T>
Stage StageOf();

// A wire message of `round` carrying `m` (a coordinator's: no nonce; a member's: its nonce).
template <class T>
wire::Message ToMessage(const T& m, uint64_t round, const std::string& sender,
                        const std::string& nonce = "") {
  return ToMessage(StageOf<T>(), std::make_shared<const std::string>(Encode(m)), round, sender,
                   nonce);
}
// The same with bytes already encoded (shared: the coordinator sends one list to every member).
wire::Message ToMessage(Stage stage, std::shared_ptr<const std::string> bytes, uint64_t round,
                        const std::string& sender, const std::string& nonce = "");
// A SecAggData message's bytes. InvalidArgument for another message, or one whose single payload
// is not the uint8 frame "secagg".
StatusOr<std::span<const std::byte>> PayloadOf(const wire::Message& msg);

// The session as a member sees it, from its FitInstruction; InvalidArgument for a session id of
// the wrong size.
StatusOr<SessionConfig> SessionFromWire(const wire::SecureAggregation& a);
// What the coordinator tells the member at cohort index `index`.
wire::SecureAggregation SessionToWire(const SessionConfig& config, uint32_t index);

}  // namespace huddle::aggregation::secagg
