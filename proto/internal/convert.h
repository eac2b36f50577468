// The wire messages (messages.h) to and from their protobuf header (huddle.proto), for the codec
// (codec.cc) alone: the generated protobuf code stays inside proto/. Every field a peer sent is
// checked on the way in (sizes, nonces, finite numbers, limits), InvalidArgument "malformed
// message: ..." naming it.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"
#include "huddle.pb.h"
#include "proto/codec.h"
#include "proto/messages.h"

namespace huddle::wire::internal {

// InvalidArgument "malformed message: <what>".
Status Malformed(absl::string_view what);
// Malformed when `s` is longer than `max` bytes, naming `field`.
Status CheckString(const std::string& s, size_t max, absl::string_view field);

pb::DType DTypeToProto(DType d);
DType DTypeFromProto(pb::DType d);

// The message body into the header's oneof.
void BodyToProto(const Body& body, pb::Header* h);
// The header's oneof as a checked body.
StatusOr<Body> BodyFromProto(const pb::Header& h, const CodecLimits& limits);

}  // namespace huddle::wire::internal
