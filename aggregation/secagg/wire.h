// Secure aggregation's messages between the protocol's types (protocol.h) and the wire's
// (proto/messages.h), for the coordinator and the client agent alike. The codec has already
// checked sizes (key lengths, counts, share limbs); what the protocol checks (indices, membership,
// authenticity) stays with the protocol.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "aggregation/secagg/protocol.h"
#include "proto/messages.h"

namespace huddle::aggregation::secagg {

static_assert(kMaxNeighbours == static_cast<int>(wire::kMaxSecAggNeighbours));
static_assert(kSecretLimbs == wire::kSecAggShareLimbs);

// The session as a member sees it, from its FitInstruction; InvalidArgument for a session id of
// the wrong size.
StatusOr<SessionConfig> SessionFromWire(const wire::SecureAggregation& a);
// What the coordinator tells member `index` (the quantization fields are the caller's).
wire::SecureAggregation SessionToWire(const SessionConfig& config, uint32_t index);

wire::SecAggAdvertise ToWire(const AdvertiseKeys& keys, const std::string& nonce);
AdvertiseKeys FromWire(const wire::SecAggAdvertise& m);
wire::SecAggKeyList ToWire(const KeyList& list);
KeyList FromWire(const wire::SecAggKeyList& m);
wire::SecAggShares ToWire(const ShareKeys& shares, const std::string& nonce);
ShareKeys FromWire(const wire::SecAggShares& m);
wire::SecAggShareList ToWire(const ShareList& list);
ShareList FromWire(const wire::SecAggShareList& m);
wire::SecAggUnmask ToWire(const UnmaskRequest& request);
UnmaskRequest FromWire(const wire::SecAggUnmask& m);
wire::SecAggUnmaskResponse ToWire(const UnmaskResponse& response, const std::string& nonce);
UnmaskResponse FromWire(const wire::SecAggUnmaskResponse& m, uint32_t sender);

}  // namespace huddle::aggregation::secagg
