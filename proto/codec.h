// The wire codec: Message <-> [protobuf Header][raw tensor frame]...
//
// Encode side: EncodeHeader() serialises the header (including one TensorSpec per payload); the
// transport then sends each payload's bytes without copying them, as ChunkCount() frames of at most
// kMaxChunkBytes each (all full but the last). Small frames keep every buffer ZeroMQ and CurveZMQ
// allocate per frame small and reusable (measured: CurveZMQ ingest of 40 MB updates 2-3x faster
// than one 40 MB frame), and bound the largest frame a peer can send (ZMQ_MAXMSGSIZE).
// Decode side: Decode() validates everything structural before anything else sees the message:
// frame count, header size and parse, protocol version, that exactly one body is set, that tensors
// appear only on messages that carry them, every TensorSpec (name, dtype, rank and dimensions,
// element count, byte length equal to the sizes of its frames) and string lengths. A tensor sent
// in one frame is decoded without copying; a chunked one is copied once into contiguous memory.
// Values (finite, norm) and round semantics are checked by the receiver against its own state.
//
// Thread-safety: stateless functions.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "proto/messages.h"

namespace huddle::wire {

// One received frame: bytes kept alive by owner (e.g. the zmq::message_t).
struct Frame {
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;
};

// Tensor bytes per wire frame, at most.
inline constexpr size_t kMaxChunkBytes = size_t{256} << 10;

// Frames a tensor of `bytes` bytes occupies on the wire (at least 1).
inline size_t ChunkCount(size_t bytes, size_t chunk_bytes = kMaxChunkBytes) {
  return bytes == 0 ? 1 : (bytes + chunk_bytes - 1) / chunk_bytes;
}
// The frames of one tensor payload, in order: views into `bytes`.
std::vector<std::span<const std::byte>> Chunks(std::span<const std::byte> bytes,
                                               size_t chunk_bytes = kMaxChunkBytes);

struct CodecLimits {
  size_t max_header_bytes = 64 * 1024;
  size_t max_tensors = 256;
  size_t max_frames = 16385;  // header + tensor frames: 4 GiB of payload
  // Tensor bytes per frame: the protocol's kMaxChunkBytes. Only tests and the fuzzer (which must
  // reach multi-chunk tensors with small inputs) use another value (a positive multiple of 4).
  size_t chunk_bytes = kMaxChunkBytes;
  int64_t max_tensor_elements = int64_t{1} << 28;  // 1 GiB of float32
  size_t max_string_bytes = 256;                   // names, ids, sender
  size_t max_text_bytes = 4096;                    // error and shutdown texts
};

std::string EncodeHeader(const Message& msg);

// Errors: FailedPrecondition for a protocol version mismatch (the text names both versions);
// InvalidArgument for anything malformed, naming the field and the offending value.
StatusOr<Message> Decode(std::span<const Frame> frames, const CodecLimits& limits = {});

// Encodes `msg` into owned frames (header + copies of the payloads). For tests and the fuzzer;
// the ZeroMQ transport sends payloads zero-copy instead.
std::vector<Frame> EncodeToFrames(const Message& msg, size_t chunk_bytes = kMaxChunkBytes);

}  // namespace huddle::wire
