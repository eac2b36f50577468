// Seeded random inputs to the codec. Decode must never crash, must fail only with InvalidArgument
// ("malformed message: ...") or FailedPrecondition (version mismatch), and whatever it accepts must
// be self-consistent and survive a re-encode unchanged; a secure-aggregation stage's bytes must
// decode canonically or be refused. The structured loop also checks Decode's verdict on tensor
// specs against an independent oracle of the rules in proto/codec.h.
#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "huddle.pb.h"
#include "proto/codec.h"
#include "tests/wire/corrupt.h"
#include "tests/wire/wire_testing.h"

namespace huddle::wire {
namespace {

using testutil::Describe;
using testutil::ExpectSamePayloads;
using testutil::OwnedFrame;

constexpr uint64_t kSeed = 20240601;
constexpr int kIterations = 2000;

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// A secure-aggregation stage's bytes either decode (aggregation/secagg/wire.h) to a message that
// re-encodes to exactly those bytes (the encoding is canonical), or are refused with
// InvalidArgument "malformed secure-aggregation ...".
::testing::AssertionResult CanonicalOrRefused(uint32_t stage, std::span<const std::byte> bytes) {
  // An exactly-sized copy, so that a sanitizer sees any read past the end.
  const std::vector<std::byte> copy(bytes.begin(), bytes.end());
  StatusOr<std::string> again = testutil::Reencode(stage, copy);
  if (!again.ok()) {
    if (again.status().code() == absl::StatusCode::kInvalidArgument &&
        absl::StartsWith(again.status().message(), "malformed secure-aggregation ")) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "stage " << stage << ": unexpected error " << again.status();
  }
  if (!std::equal(copy.begin(), copy.end(), testutil::AsBytes(*again).begin(),
                  testutil::AsBytes(*again).end())) {
    return ::testing::AssertionFailure()
           << "stage " << stage << ": " << copy.size() << " bytes decode but re-encode to "
           << again->size() << " other bytes";
  }
  return ::testing::AssertionSuccess();
}

// OK with the invariants every decoded message holds, or one of the two documented errors.
::testing::AssertionResult WellFormedOutcome(const StatusOr<Message>& got,
                                             std::span<const Frame> frames) {
  if (!got.ok()) {
    const std::string text(got.status().message());
    const bool malformed = got.status().code() == absl::StatusCode::kInvalidArgument &&
                           text.rfind("malformed message: ", 0) == 0;
    const bool version = got.status().code() == absl::StatusCode::kFailedPrecondition &&
                         text.rfind("protocol version mismatch", 0) == 0;
    if (malformed || version) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "unexpected error " << got.status();
  }
  const Message& m = *got;
  if (m.protocol_version != kProtocolVersion || m.tensors.size() + 1 != frames.size()) {
    return ::testing::AssertionFailure()
           << "accepted " << Describe(m) << " from " << frames.size() << " frames";
  }
  if (!m.tensors.empty() && m.type() != MessageType::kFitInstruction &&
      m.type() != MessageType::kFitResult && m.type() != MessageType::kEvaluateInstruction &&
      m.type() != MessageType::kSecAggMaskedInput && m.type() != MessageType::kSecAggData) {
    return ::testing::AssertionFailure() << "accepted tensors on " << Describe(m);
  }
  if (m.type() == MessageType::kSecAggData) {
    const SecAggData& d = std::get<SecAggData>(m.body);
    if (d.stage < 1 || d.stage > 12 || (!d.nonce.empty() && d.nonce.size() != kNonceBytes) ||
        m.tensors.size() != 1 || m.tensors[0].spec.name != "secagg" ||
        m.tensors[0].spec.dtype != DType::kUint8 || m.tensors[0].spec.shape.size() != 1) {
      return ::testing::AssertionFailure()
             << "accepted a bad secure-aggregation message " << Describe(m);
    }
    ::testing::AssertionResult payload = CanonicalOrRefused(d.stage, m.tensors[0].bytes);
    if (!payload) return payload;
  }
  for (const TensorPayload& t : m.tensors) {
    const bool ok = !t.spec.name.empty() && t.spec.name.size() <= 256 &&
                    ValidateShape(t.spec.shape, int64_t{1} << 28, "t").ok() &&
                    static_cast<int64_t>(t.bytes.size()) == t.spec.ByteLength() &&
                    reinterpret_cast<uintptr_t>(t.bytes.data()) % alignof(float) == 0;
    if (!ok) return ::testing::AssertionFailure() << "accepted a bad tensor in " << Describe(m);
  }
  StatusOr<Message> again = Decode(EncodeToFrames(m));
  if (!again.ok() || Describe(*again) != Describe(m)) {
    return ::testing::AssertionFailure()
           << "re-encoding " << Describe(m) << " gave "
           << (again.ok() ? Describe(*again) : again.status().ToString());
  }
  return ::testing::AssertionSuccess();
}

class CodecFuzzTest : public ::testing::Test {
 protected:
  // Invalid UTF-8 in string fields makes protobuf log every rejected parse.
  google::protobuf::LogSilencer silence_protobuf_;
  std::mt19937_64 rng_{kSeed};

  size_t Below(size_t n) { return static_cast<size_t>(rng_() % n); }
};

TEST_F(CodecFuzzTest, RandomFramesNeverCrash) {
  int accepted = 0;
  for (int i = 0; i < kIterations; ++i) {
    std::vector<Frame> frames;
    const size_t count = Below(5);
    for (size_t f = 0; f < count; ++f) {
      std::string bytes = RandomBytes(rng_, Below(128));
      // Half the headers start with protocol_version = 1, and half of those with a Heartbeat
      // body too, so that parsing gets further.
      if (f == 0 && i % 2 == 0) bytes = std::string("\x08\x01", 2) + bytes;
      if (f == 0 && i % 4 == 0) bytes = std::string("\x82\x01\x00", 3) + bytes;
      frames.push_back(OwnedFrame(std::move(bytes)));
    }
    StatusOr<Message> got = Decode(frames);
    accepted += got.ok();
    ASSERT_TRUE(WellFormedOutcome(got, frames)) << "input " << i;
  }
  RecordProperty("accepted", accepted);
}

TEST_F(CodecFuzzTest, MutatedValidEncodingsNeverCrash) {
  const std::vector<Message> samples = testutil::SampleMessages();
  int accepted = 0, rejected = 0;
  for (int i = 0; i < kIterations; ++i) {
    std::vector<Frame> frames = EncodeToFrames(samples[i % samples.size()]);
    std::string header(reinterpret_cast<const char*>(frames[0].bytes.data()),
                       frames[0].bytes.size());
    switch (Below(7)) {
      case 0:  // flip one to four bits
        for (size_t k = Below(4) + 1; k > 0; --k) header[Below(header.size())] ^= 1 << Below(8);
        break;
      case 1:  // overwrite a byte
        header[Below(header.size())] = static_cast<char>(rng_());
        break;
      case 2:  // truncate
        header.resize(Below(header.size()));
        break;
      case 3:  // insert random bytes
        header.insert(Below(header.size() + 1), RandomBytes(rng_, Below(8) + 1));
        break;
      case 4:  // append a random field (known or unknown number, any wire type)
        header += RandomBytes(rng_, Below(12) + 1);
        break;
      case 5:  // resize, drop or duplicate a tensor frame
        if (frames.size() > 1) {
          const size_t f = 1 + Below(frames.size() - 1);
          const size_t what = Below(3);
          if (what == 0) {
            const size_t size = frames[f].bytes.size() + Below(9) - Below(9);
            frames[f] = OwnedFrame(std::string(std::min<size_t>(size, 1 << 16), '\0'));
          } else if (what == 1) {
            frames.erase(frames.begin() + static_cast<long>(f));
          } else {
            frames.push_back(frames[f]);
          }
        } else {
          frames.push_back(OwnedFrame(RandomBytes(rng_, Below(16))));
        }
        break;
      case 6:  // a misaligned tensor frame with random payload bytes
        if (frames.size() > 1) {
          const size_t f = 1 + Below(frames.size() - 1);
          std::string bytes = " " + RandomBytes(rng_, frames[f].bytes.size());
          auto data = std::make_shared<std::string>(std::move(bytes));
          frames[f] = Frame{data, std::as_bytes(std::span<const char>(*data)).subspan(1)};
        }
        break;
    }
    frames[0] = OwnedFrame(std::move(header));
    StatusOr<Message> got = Decode(frames);
    (got.ok() ? accepted : rejected)++;
    ASSERT_TRUE(WellFormedOutcome(got, frames)) << "mutation " << i;
  }
  // Both verdicts must be common, or the loop is not exploring anything.
  EXPECT_GT(accepted, kIterations / 10);
  EXPECT_GT(rejected, kIterations / 10);
}

// Random tensor specs on a valid FitResult, judged by an oracle written from the rules in codec.h.
TEST_F(CodecFuzzTest, RandomTensorSpecsAreJudgedLikeTheOracle) {
  constexpr int64_t kDims[] = {
      -1, 0, 1, 2, 3, 7, 1 << 14, 1 << 20, int64_t{1} << 31, int64_t{1} << 40};
  const Message base = MakeMessage(FitResult{1, 0.5, 0.5, 1.0, 1, testutil::SampleNonce()}, 1, "c");
  int accepted = 0, rejected = 0;
  for (int i = 0; i < kIterations; ++i) {
    pb::Header h;
    ASSERT_TRUE(h.ParseFromString(EncodeHeader(base)));
    std::vector<Frame> frames(1);
    bool valid = true;
    const size_t count = Below(4);
    for (size_t t = 0; t < count; ++t) {
      pb::TensorSpec* s = h.add_tensors();
      const size_t name_kind = Below(8);
      s->set_name(name_kind == 0 ? "" : name_kind == 1 ? std::string(257, 'n') : "t");
      valid &= name_kind > 1;
      const int dtype = Below(6) == 0 ? static_cast<int>(Below(3)) : 1;
      s->set_dtype(static_cast<pb::DType>(dtype));
      valid &= dtype == 1;
      // Mostly small valid dimensions, sometimes anything from kDims.
      const size_t rank = Below(10) == 0 ? Below(11) : Below(4);
      valid &= rank <= 8;
      int64_t elements = 1;
      bool too_big = false;
      for (size_t r = 0; r < rank; ++r) {
        const int64_t d = Below(8) == 0 ? kDims[Below(std::size(kDims))] : 1 + Below(5);
        s->add_shape(d);
        valid &= d >= 1;
        if (d >= 1 && !too_big) {
          too_big = elements > (int64_t{1} << 28) / d;
          if (!too_big) elements *= d;
        }
      }
      valid &= !too_big;
      const uint64_t needed = too_big ? 8 : static_cast<uint64_t>(elements) * 4;
      const uint64_t byte_length = Below(8) == 0 ? needed + 4 * Below(3) - 4 * Below(2) : needed;
      s->set_byte_length(byte_length);
      const uint64_t frame_size = Below(8) == 0 ? byte_length + Below(3) - Below(2) : byte_length;
      valid &= byte_length == needed && frame_size == needed;
      // One frame per tensor: valid only while the tensor fits in one chunk.
      frames.push_back(
          OwnedFrame(std::string(std::min<uint64_t>(frame_size, kMaxChunkBytes), 'x')));
      valid &= frame_size <= kMaxChunkBytes;
    }
    frames[0] = OwnedFrame(h.SerializeAsString());
    StatusOr<Message> got = Decode(frames);
    ASSERT_TRUE(WellFormedOutcome(got, frames)) << "spec set " << i;
    ASSERT_EQ(got.ok(), valid) << "spec set " << i << ": " << h.ShortDebugString() << " -> "
                               << (got.ok() ? "accepted" : got.status().ToString());
    (got.ok() ? accepted : rejected)++;
  }
  EXPECT_GT(accepted, kIterations / 10);
  EXPECT_GT(rejected, kIterations / 10);
}

// Secure aggregation's stage bytes (aggregation/secagg/wire.h), mutated from each stage's sample:
// every outcome is a refusal naming the message, or a message that re-encodes to the same bytes.
TEST_F(CodecFuzzTest, MutatedSecAggPayloadsDecodeCanonicallyOrNotAtAll) {
  const std::vector<Message> samples = testutil::SampleSecAggStages();
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 4 * kIterations; ++i) {
    const Message& sample = samples[i % samples.size()];
    const uint32_t stage = std::get<SecAggData>(sample.body).stage;
    const std::span<const std::byte> original = sample.tensors[0].bytes;
    std::string bytes(reinterpret_cast<const char*>(original.data()), original.size());
    const size_t mutation = Below(6);
    switch (mutation) {
      case 0:  // flip one to four bits
        for (size_t k = Below(4) + 1; k > 0; --k) bytes[Below(bytes.size())] ^= 1 << Below(8);
        break;
      case 1:  // overwrite a 4-byte word (a count, an index, a reason) with a small or huge value
        if (bytes.size() >= 4) {
          const size_t at = Below(bytes.size() - 3);
          const uint32_t v = Below(2) == 0 ? static_cast<uint32_t>(Below(8))
                                           : static_cast<uint32_t>(rng_() >> Below(32));
          for (int b = 0; b < 4; ++b) bytes[at + b] = static_cast<char>(v >> (8 * b));
        }
        break;
      case 2:  // truncate
        bytes.resize(Below(bytes.size()));
        break;
      case 3:  // insert random bytes
        bytes.insert(Below(bytes.size() + 1), RandomBytes(rng_, Below(8) + 1));
        break;
      case 4:  // append random bytes
        bytes += RandomBytes(rng_, Below(4) + 1);
        break;
      case 5:  // unchanged: must be accepted
        break;
    }
    ASSERT_TRUE(CanonicalOrRefused(stage, testutil::AsBytes(bytes))) << "mutation " << i;
    const bool ok = testutil::Reencode(stage, testutil::AsBytes(bytes)).ok();
    if (mutation == 5) {
      ASSERT_TRUE(ok) << "the sample of stage " << stage << " is refused";
    }
    (ok ? accepted : rejected)++;
  }
  EXPECT_GT(accepted, kIterations / 10);
  EXPECT_GT(rejected, kIterations / 10);
}

}  // namespace
}  // namespace huddle::wire
