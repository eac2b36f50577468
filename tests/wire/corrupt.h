// Corruption tests' helper: a message encoded, its protobuf header edited, and decoded again.
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

// `msg` encoded with its header edited by `mutate`; the tensor frames are unchanged.
inline std::vector<Frame> CorruptFrames(const Message& msg,
                                        const std::function<void(pb::Header&)>& mutate) {
  std::vector<Frame> frames = EncodeToFrames(msg);
  pb::Header h;
  EXPECT_TRUE(h.ParseFromArray(frames[0].bytes.data(), static_cast<int>(frames[0].bytes.size())));
  mutate(h);
  auto header = std::make_shared<std::string>(h.SerializeAsString());
  frames[0] = Frame{header, std::as_bytes(std::span<const char>(*header))};
  return frames;
}

// The same, decoded.
inline StatusOr<Message> DecodeCorrupted(const Message& msg,
                                         const std::function<void(pb::Header&)>& mutate) {
  return Decode(CorruptFrames(msg, mutate));
}

}  // namespace huddle::wire::testutil
