// Corruption tests' helpers: frames built by hand (owned copies of given bytes), and a message
// encoded, its protobuf header edited, and decoded again.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "huddle.pb.h"
#include "proto/codec.h"

namespace huddle::wire::testutil {

// A frame that owns a copy of `bytes` (heap storage: 4-byte aligned).
inline Frame OwnedFrame(std::span<const std::byte> bytes) {
  auto data = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
  return Frame{data, std::span<const std::byte>(*data)};
}
// A frame that owns `bytes` (moved in, not copied).
inline Frame OwnedFrame(std::string bytes) {
  auto data = std::make_shared<std::string>(std::move(bytes));
  return Frame{data, std::as_bytes(std::span<const char>(*data))};
}
// A frame of `size` zero bytes.
inline Frame ZeroFrame(size_t size) { return OwnedFrame(std::vector<std::byte>(size)); }

// An edit to a parsed header.
using Mutation = std::function<void(pb::Header&)>;

// `msg` encoded with its header edited by `mutate`; the tensor frames are unchanged.
inline std::vector<Frame> CorruptFrames(const Message& msg, const Mutation& mutate) {
  std::vector<Frame> frames = EncodeToFrames(msg);
  pb::Header h;
  EXPECT_TRUE(h.ParseFromArray(frames[0].bytes.data(), static_cast<int>(frames[0].bytes.size())));
  mutate(h);
  frames[0] = OwnedFrame(h.SerializeAsString());
  return frames;
}

// The same, decoded.
inline StatusOr<Message> DecodeCorrupted(const Message& msg, const Mutation& mutate) {
  return Decode(CorruptFrames(msg, mutate));
}

}  // namespace huddle::wire::testutil
