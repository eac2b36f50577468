#include "transport/internal/through_codec.h"

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "proto/codec.h"

namespace huddle::transport::internal {

StatusOr<wire::Message> ThroughCodec(const wire::Message& m, size_t* wire_bytes) {
  std::vector<wire::Frame> frames;
  auto header = std::make_shared<std::string>(wire::EncodeHeader(m));
  frames.push_back({header, std::as_bytes(std::span<const char>(*header))});
  *wire_bytes = header->size();
  for (const wire::TensorPayload& t : m.tensors) {
    // In chunks, as on the wire: a tensor above wire::kMaxChunkBytes in one frame is malformed.
    for (std::span<const std::byte> chunk : wire::Chunks(t.bytes))
      frames.push_back({t.owner, chunk});
    *wire_bytes += t.bytes.size();
  }
  return wire::Decode(frames);
}

}  // namespace huddle::transport::internal
