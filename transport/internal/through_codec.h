// The in-process transports' wire (inproc_transport.h, sim_transport.h); not part of the public
// API: no other module includes this header.
#pragma once

#include <cstddef>

#include "common/status.h"
#include "proto/messages.h"

namespace huddle::transport::internal {

// Passes a message through the wire codec as the ZeroMQ transport would (the header is encoded
// and decoded; payload frames are shared, not copied, and cut in wire::kMaxChunkBytes chunks as
// on the wire), so simulated peers meet exactly the same validation as real ones. Returns the
// decoded message and sets *wire_bytes to its size on the wire (header plus payloads).
StatusOr<wire::Message> ThroughCodec(const wire::Message& m, size_t* wire_bytes);

}  // namespace huddle::transport::internal
