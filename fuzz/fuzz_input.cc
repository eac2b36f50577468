#include "fuzz/fuzz_input.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "models/model.h"

namespace huddle::fuzz {
namespace {

wire::Frame CopyFrame(std::span<const uint8_t> bytes, bool misaligned) {
  // operator new[] returns 16-byte aligned blocks: offset 1 is odd, offset 0 is aligned.
  const size_t offset = misaligned ? 1 : 0;
  std::shared_ptr<std::byte[]> block(new std::byte[offset + bytes.size()]);
  if (!bytes.empty()) std::memcpy(block.get() + offset, bytes.data(), bytes.size());
  const std::span<const std::byte> view(block.get() + offset, bytes.size());
  return wire::Frame{std::move(block), view};
}

FuzzRound MakeFuzzRound() {
  FuzzRound r;
  r.layout = models::Layout(models::MlpSpec{6, {5}, 3});
  r.expect.round = kRound;
  r.expect.model_version = kModelVersion;
  r.expect.nonce = FuzzNonce();
  r.expect.max_weight = kMaxWeight;
  r.options.max_weight = kMaxWeight;
  r.options.max_abs_value = kMaxAbsValue;
  return r;
}

}  // namespace

std::vector<wire::Frame> ParseFrames(std::span<const uint8_t> data) {
  std::vector<wire::Frame> frames;
  size_t pos = 0;
  while (data.size() - pos >= 4 && frames.size() < kMaxFrames) {
    const uint32_t word =
        static_cast<uint32_t>(data[pos]) | static_cast<uint32_t>(data[pos + 1]) << 8 |
        static_cast<uint32_t>(data[pos + 2]) << 16 | static_cast<uint32_t>(data[pos + 3]) << 24;
    pos += 4;
    const size_t length = std::min<size_t>(word & ~kMisalignedBit, data.size() - pos);
    frames.push_back(CopyFrame(data.subspan(pos, length), (word & kMisalignedBit) != 0));
    pos += length;
  }
  return frames;
}

void AppendFrame(std::span<const std::byte> bytes, bool misaligned, std::string* out) {
  const uint32_t word = static_cast<uint32_t>(bytes.size()) | (misaligned ? kMisalignedBit : 0);
  for (int shift = 0; shift < 32; shift += 8) out->push_back(static_cast<char>(word >> shift));
  out->append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::string SerializeFrames(std::span<const wire::Frame> frames, uint64_t misaligned_mask) {
  std::string out;
  for (size_t i = 0; i < frames.size(); ++i) {
    AppendFrame(frames[i].bytes, i < 64 && (misaligned_mask >> i & 1) != 0, &out);
  }
  return out;
}

const std::string& FuzzNonce() {
  static const std::string nonce("huddle-fuzz\x00\x01\x7f\x80\xff", wire::kNonceBytes);
  return nonce;
}

const FuzzRound& TheFuzzRound() {
  // Built in place (never copied): expect.layout points at its own layout.
  static const FuzzRound* const round = [] {
    auto* r = new FuzzRound(MakeFuzzRound());
    r->expect.layout = &r->layout;
    return r;
  }();
  return *round;
}

}  // namespace huddle::fuzz
