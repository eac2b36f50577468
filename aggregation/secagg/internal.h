// Helpers shared by secure aggregation's member (member.cc) and server (server.cc); not part of
// the module's contract (protocol.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "aggregation/secagg/protocol.h"

namespace huddle::aggregation::secagg::internal {

inline constexpr std::string_view kShareKeyPurpose = "huddle-secagg-v2-share-key";
inline constexpr std::string_view kMaskPurpose = "huddle-secagg-v2-pairwise-mask";
// A sealed pair of shares: the self-mask share's limbs, then the mask key share's, u64 LE each.
inline constexpr size_t kSharePlaintextBytes = 2 * kSecretLimbs * 8;
inline constexpr size_t kSealedShareBytes = kSealOverhead + kSharePlaintextBytes;

std::vector<uint8_t> EncodeShares(const Share& self_mask, const Share& mask_key);
// InvalidArgument for a wrong size or a value outside the field.
StatusOr<std::pair<Share, Share>> DecodeShares(std::span<const uint8_t> bytes, uint64_t x);

// The context every key agreement of a session is bound to: its id and its member list.
std::vector<uint8_t> AgreementContext(const SessionId& session, const Hash32& list_digest);

// +1 when the lower index adds the pairwise mask, -1 for the higher.
inline int MaskSign(uint32_t self, uint32_t peer) { return self < peer ? 1 : -1; }
inline uint64_t ModulusMask(int bits) {
  return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
}
inline bool Contains(const std::vector<uint32_t>& sorted, uint32_t v) {
  return std::binary_search(sorted.begin(), sorted.end(), v);
}
// Sorted, no repeats, every entry below n.
bool SortedSetBelow(const std::vector<uint32_t>& v, uint64_t n);

// The session's settings in range (both sides check them).
Status CheckConfig(const SessionConfig& c);

}  // namespace huddle::aggregation::secagg::internal
