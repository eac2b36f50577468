// What the fuzz targets share: the byte format of a fuzz input (a multipart message) and the round
// every fuzzed FitResult is checked against.
//
// Input format: a sequence of frames, each
//     [u32 little-endian word][bytes]
// where the word's low 31 bits are the frame's length and bit 31 (kMisalignedBit) asks for the
// frame's bytes to start at an odd address, as ZeroMQ may deliver them (the codec must then copy a
// tensor frame). A length larger than what remains takes the rest; 1 to 3 trailing bytes that
// cannot hold a word are ignored, as are frames beyond kMaxFrames. The empty input is zero frames.
//
// The round (FuzzRound): an MLP 6-5-3 (fc0.weight [5,6], fc0.bias [5], fc1.weight [3,5],
// fc1.bias [3]), round kRound, model version kModelVersion, nonce FuzzNonce(), weights up to
// kMaxWeight, values up to kMaxAbsValue. make_seed_corpus writes FitResults that match it.
//
// Thread-safety: ParseFrames and AppendFrame are stateless; TheFuzzRound() is built once, then
// read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "aggregation/streaming_aggregator.h"
#include "common/tensor.h"
#include "coordinator/update_check.h"
#include "proto/codec.h"

namespace huddle::fuzz {

inline constexpr uint32_t kMisalignedBit = uint32_t{1} << 31;

// Tensor bytes per frame in fuzz inputs: far below the protocol's 256 KiB, so that small inputs
// reach multi-chunk tensors and their reassembly (fc0.weight of the round: 120 bytes, 4 frames).
inline constexpr size_t kChunkBytes = 32;
inline wire::CodecLimits FuzzLimits() {
  wire::CodecLimits limits;
  limits.chunk_bytes = kChunkBytes;
  return limits;
}
inline constexpr size_t kMaxFrames = 300;

// Splits `data` into frames as described above. Each frame's bytes live in their own heap block of
// exactly that size (plus the one leading byte of a misaligned frame), so that AddressSanitizer
// sees any read past a frame.
std::vector<wire::Frame> ParseFrames(std::span<const uint8_t> data);

// Appends one frame in the input format to *out.
void AppendFrame(std::span<const std::byte> bytes, bool misaligned, std::string* out);

// The whole message `frames` in the input format; frame i is misaligned if misaligned_mask bit i
// is set.
std::string SerializeFrames(std::span<const wire::Frame> frames, uint64_t misaligned_mask = 0);

inline constexpr uint64_t kRound = 7;
inline constexpr uint64_t kModelVersion = 3;
inline constexpr int64_t kMaxWeight = int64_t{1} << 24;  // AggregatorOptions' default
inline constexpr double kMaxAbsValue = 1024.0;           // AggregatorOptions' default

// The 16 bytes (wire::kNonceBytes) the round's FitInstruction carried.
const std::string& FuzzNonce();

struct FuzzRound {
  ModelLayout layout;
  coordinator::UpdateExpectation expect;  // points into layout
  aggregation::AggregatorOptions options;
};
const FuzzRound& TheFuzzRound();

}  // namespace huddle::fuzz
