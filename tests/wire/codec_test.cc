// The wire codec: every message type round-trips with every field, payloads are zero-copy when they
// can be, and every field of the header and every tensor frame has a corruption test that expects a
// precise error (status code and a message naming the field and the offending value).
//
// Corrupt inputs are built the way a hostile or buggy peer would: encode a valid message, parse its
// header with the generated protobuf, change one field, serialise it again (CorruptFrames), or
// replace one tensor frame (DecodeWithFrameSize).
#include "proto/codec.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "gtest/gtest.h"
#include "huddle.pb.h"
#include "tests/wire/corrupt.h"
#include "tests/wire/wire_testing.h"

namespace huddle::wire {
namespace {

using absl::StatusCode;
using testutil::CorruptFrames;
using testutil::DecodeCorrupted;
using testutil::Describe;
using testutil::ExpectSamePayloads;
using testutil::IsError;
using testutil::Mutation;
using testutil::OwnedFrame;
using testutil::Payload;
using testutil::ZeroFrame;

constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;

class CodecTest : public ::testing::Test {
 protected:
  // `msg` encoded with tensor frame `index` replaced by `size` zero bytes.
  static StatusOr<Message> DecodeWithFrameSize(const Message& msg, size_t index, size_t size) {
    std::vector<Frame> frames = EncodeToFrames(msg);
    frames[index + 1] = ZeroFrame(size);
    return Decode(frames);
  }
  // A FitResult carrying `n` one-element tensors.
  static Message FitResultWithTensors(size_t n) {
    Message m = testutil::SampleFitResult();
    m.tensors.clear();
    for (size_t i = 0; i < n; ++i) m.tensors.push_back(Payload("t" + std::to_string(i), {1}));
    return m;
  }
};

// ---- Round trips ----

TEST_F(CodecTest, EveryMessageTypeRoundTripsWithEveryField) {
  std::set<MessageType> seen;
  for (const Message& msg : testutil::SampleMessages()) {
    SCOPED_TRACE(MessageTypeName(msg.type()));
    seen.insert(msg.type());
    StatusOr<Message> got = Decode(EncodeToFrames(msg));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->type(), msg.type());
    EXPECT_EQ(Describe(*got), Describe(msg));
    ExpectSamePayloads(got->tensors, msg.tensors);
  }
  EXPECT_EQ(seen.size(), std::variant_size_v<Body>) << "a message type has no sample";
}

TEST_F(CodecTest, IntegerFieldsRoundTripAtTheirExtremes) {
  // Integer fields accept every value at this layer; receivers check them against their state.
  constexpr uint64_t kU64 = std::numeric_limits<uint64_t>::max();
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
  constexpr uint32_t kU32 = std::numeric_limits<uint32_t>::max();
  Message fit = MakeMessage(FitInstruction{kU64, TrainConfig{kI64Min, -1, 1e300, -0.0, 5e-324},
                                           kU64, kU32, testutil::SampleNonce()},
                            kU64, "c");
  Message welcome =
      MakeMessage(Welcome{"", ModelSpec{"", kI64Min, {-1, 0, kI64Min}, -7}, kU32}, kU64);
  Message result =
      MakeMessage(FitResult{kU64, -1e308, -0.0, 0.0, kU64, testutil::SampleNonce()}, kU64);
  for (const Message& msg : {fit, welcome, result}) {
    StatusOr<Message> got = Decode(EncodeToFrames(msg));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(Describe(*got), Describe(msg));
  }
}

TEST_F(CodecTest, EveryErrorCodeRoundTrips) {
  for (int c = 0; c <= static_cast<int>(ErrorCode::kAuthRefused); ++c) {
    const Message msg = MakeError(static_cast<ErrorCode>(c), "text");
    StatusOr<Message> got = Decode(EncodeToFrames(msg));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(std::get<Error>(got->body).code, static_cast<ErrorCode>(c));
  }
}

TEST_F(CodecTest, ALongErrorTextIsCutAtACharacterSoThatItStillDecodes) {
  // 5000 two-byte characters (a trainer's traceback can be longer than the codec accepts).
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "\xc3\xa9";
  const Message msg = MakeError(ErrorCode::kInternal, text);
  StatusOr<Message> got = Decode(EncodeToFrames(msg));
  ASSERT_TRUE(got.ok()) << got.status();
  const std::string& cut = std::get<Error>(got->body).message;
  EXPECT_EQ(cut.size(), kMaxErrorTextBytes + 3);
  EXPECT_EQ(cut.substr(0, kMaxErrorTextBytes), text.substr(0, kMaxErrorTextBytes));
  EXPECT_EQ(cut.substr(kMaxErrorTextBytes), "...");
  const std::string odd = "a" + text;  // the cut would split a character: it moves back one byte
  EXPECT_EQ(std::get<Error>(MakeError(ErrorCode::kInternal, odd).body).message.size(),
            kMaxErrorTextBytes - 1 + 3);
}

TEST_F(CodecTest, AlignedPayloadsAreDecodedWithoutCopying) {
  std::vector<Frame> frames = EncodeToFrames(testutil::SampleFitResult());
  StatusOr<Message> got = Decode(frames);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < got->tensors.size(); ++i) {
    EXPECT_EQ(got->tensors[i].bytes.data(), frames[i + 1].bytes.data()) << "tensor " << i;
    EXPECT_EQ(got->tensors[i].owner, frames[i + 1].owner) << "tensor " << i;
  }
  // The message keeps the frames' bytes alive on its own.
  frames.clear();
  EXPECT_EQ(got->tensors[1].floats()[0], -2.0f);
  EXPECT_EQ(got->tensors[0].floats()[11], 11.5f);
}

TEST_F(CodecTest, MisalignedPayloadIsCopiedAndStillDecodes) {
  const Message msg = testutil::SampleFitResult();
  std::vector<Frame> frames = EncodeToFrames(msg);
  // Tensor 0's bytes one byte past an aligned address.
  auto storage = std::make_shared<std::vector<std::byte>>(frames[1].bytes.size() + 1);
  std::memcpy(storage->data() + 1, frames[1].bytes.data(), frames[1].bytes.size());
  const std::byte* misaligned = storage->data() + 1;
  ASSERT_NE(reinterpret_cast<uintptr_t>(misaligned) % alignof(float), 0u);
  frames[1] = Frame{storage, std::span<const std::byte>(misaligned, frames[1].bytes.size())};

  StatusOr<Message> got = Decode(frames);
  ASSERT_TRUE(got.ok()) << got.status();
  const TensorPayload& t = got->tensors[0];
  EXPECT_NE(t.bytes.data(), misaligned);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.bytes.data()) % alignof(float), 0u);
  frames.clear();
  storage.reset();
  ExpectSamePayloads(got->tensors, msg.tensors);
}

// ---- Frames and header ----

TEST_F(CodecTest, RejectsAnEmptyFrameList) {
  EXPECT_TRUE(IsError(Decode({}), kInvalid, "malformed message: no frames"));
}

TEST_F(CodecTest, RejectsAHeaderThatIsNotAProtobuf) {
  const std::string garbage = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff";
  EXPECT_TRUE(IsError(Decode(std::vector<Frame>{OwnedFrame(garbage)}), kInvalid,
                      "header does not parse as a protobuf Header"));
  // A valid header cut in the middle of a length-delimited field.
  std::string header = EncodeHeader(testutil::SampleJoin());
  header.resize(header.size() - 3);
  EXPECT_TRUE(IsError(Decode(std::vector<Frame>{OwnedFrame(header)}), kInvalid, "does not parse"));
}

TEST_F(CodecTest, RejectsAHeaderOverTheSizeLimit) {
  // The size check runs before parsing: the long sender is never looked at.
  const Message msg = MakeMessage(Heartbeat{}, 1, std::string(70000, 's'));
  const std::vector<Frame> frames = EncodeToFrames(msg);
  EXPECT_TRUE(
      IsError(Decode(frames), kInvalid,
              "header is " + std::to_string(frames[0].bytes.size()) + " bytes, limit 65536"));
  CodecLimits tight;
  tight.max_header_bytes = 8;
  EXPECT_TRUE(IsError(Decode(EncodeToFrames(testutil::SampleJoin()), tight), kInvalid, "limit 8"));
}

TEST_F(CodecTest, RejectsAnotherProtocolVersionNamingBoth) {
  auto bump = [](pb::Header& h) { h.set_protocol_version(kProtocolVersion + 1); };
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleJoin(), bump),
                      StatusCode::kFailedPrecondition,
                      absl::StrCat("peer speaks version ", kProtocolVersion + 1,
                                   ", this build speaks version ", kProtocolVersion)));
  auto absent = [](pb::Header& h) { h.clear_protocol_version(); };
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleJoin(), absent),
                      StatusCode::kFailedPrecondition, "peer speaks version 0"));
}

TEST_F(CodecTest, RejectsAHeaderWithoutABody) {
  EXPECT_TRUE(
      IsError(DecodeCorrupted(testutil::SampleHeartbeat(), [](pb::Header& h) { h.clear_body(); }),
              kInvalid, "header has no message body"));
}

TEST_F(CodecTest, RejectsATensorCountThatDisagreesWithTheFrames) {
  std::vector<Frame> missing = EncodeToFrames(testutil::SampleFitResult());
  missing.pop_back();
  EXPECT_TRUE(IsError(Decode(missing), kInvalid,
                      "tensor 1 ('fc0.bias') of 16 bytes needs 1 frame(s); only 0 remain"));
  std::vector<Frame> extra = EncodeToFrames(testutil::SampleFitResult());
  extra.push_back(ZeroFrame(4));
  EXPECT_TRUE(IsError(Decode(extra), kInvalid,
                      "the header's 2 tensors take 2 frames but 3 tensor frames follow"));
  std::vector<Frame> stray = EncodeToFrames(testutil::SampleHeartbeat());
  stray.push_back(ZeroFrame(4));
  EXPECT_TRUE(IsError(Decode(stray), kInvalid, "header lists no tensors but 1 tensor frames"));
}

TEST_F(CodecTest, RejectsTensorsOnMessagesThatMustNotCarryThem) {
  // (A SecAggData carries exactly its one frame: secagg_codec_test refuses a second.)
  for (Message msg : testutil::SampleMessages()) {
    if (msg.type() == MessageType::kFitInstruction || msg.type() == MessageType::kFitResult ||
        msg.type() == MessageType::kEvaluateInstruction ||
        msg.type() == MessageType::kSecAggMaskedInput || msg.type() == MessageType::kSecAggData) {
      continue;
    }
    msg.tensors.push_back(Payload("w", {2}));
    EXPECT_TRUE(IsError(Decode(EncodeToFrames(msg)), kInvalid,
                        std::string(MessageTypeName(msg.type())) + " must not carry tensors"));
  }
}

TEST_F(CodecTest, RejectsMoreTensorsThanTheLimit) {
  EXPECT_TRUE(Decode(EncodeToFrames(FitResultWithTensors(256))).ok()) << "the limit is inclusive";
  EXPECT_TRUE(IsError(Decode(EncodeToFrames(FitResultWithTensors(257))), kInvalid,
                      "header lists 257 tensors, limit 256"));
}

// ---- TensorSpec fields and tensor frames ----

TEST_F(CodecTest, RejectsAnEmptyTensorName) {
  auto unnamed = [](pb::Header& h) { h.mutable_tensors(1)->clear_name(); };
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), unnamed), kInvalid,
                      "tensor 1 has an empty name"));
}

TEST_F(CodecTest, RejectsATensorNameOverTheLimit) {
  auto name_of = [](size_t n) {
    return [n](pb::Header& h) { h.mutable_tensors(0)->set_name(std::string(n, 'w')); };
  };
  EXPECT_TRUE(DecodeCorrupted(testutil::SampleFitResult(), name_of(256)).ok());
  StatusOr<Message> got = DecodeCorrupted(testutil::SampleFitResult(), name_of(257));
  EXPECT_TRUE(IsError(got, kInvalid, "name is 257 bytes, limit 256"));
  // The error quotes at most 64 bytes of the name.
  EXPECT_TRUE(IsError(got, kInvalid, "tensor 0 ('" + std::string(64, 'w') + "') name"));
}

TEST_F(CodecTest, RejectsAnUnspecifiedOrUnknownDtype) {
  auto dtype = [](int d) {
    return [d](pb::Header& h) { h.mutable_tensors(0)->set_dtype(static_cast<pb::DType>(d)); };
  };
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), dtype(0)), kInvalid,
                      "tensor 0 ('fc0.weight') has dtype 0, expected float32 (1)"));
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), dtype(9)), kInvalid,
                      "has dtype 9, expected float32 (1)"));
}

// Sets tensor 0's shape to `shape` (byte_length untouched: the shape check comes first).
Mutation Shape(std::vector<int64_t> shape) {
  return [shape](pb::Header& h) {
    h.mutable_tensors(0)->clear_shape();
    for (int64_t d : shape) h.mutable_tensors(0)->add_shape(d);
  };
}

TEST_F(CodecTest, RejectsZeroAndNegativeDimensions) {
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), Shape({4, 0})), kInvalid,
                      "tensor 0 ('fc0.weight'): shape [4,0] has a dimension < 1"));
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), Shape({-4, 3})), kInvalid,
                      "shape [-4,3] has a dimension < 1"));
}

TEST_F(CodecTest, RejectsRankAboveEight) {
  EXPECT_TRUE(
      IsError(DecodeCorrupted(testutil::SampleFitResult(), Shape(std::vector<int64_t>(9, 1))),
              kInvalid, "tensor 0 ('fc0.weight'): rank 9 exceeds the maximum of 8"));
}

TEST_F(CodecTest, RejectsElementCountsThatOverflowOrExceedTheLimit) {
  const int64_t k2p40 = int64_t{1} << 40;
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), Shape({k2p40, k2p40})), kInvalid,
                      "shape [1099511627776,1099511627776] exceeds the limit of 268435456"));
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), Shape({int64_t{1} << 28, 2})),
                      kInvalid, "exceeds the limit of 268435456 elements"));
}

TEST_F(CodecTest, ByteLengthCannotOverflowUnderAGenerousElementLimit) {
  // With max_tensor_elements raised to "unlimited", 2^62 elements pass ValidateShape, and
  // 2^62 * sizeof(float) wraps to 0 in TensorSpec::ByteLength(): a header saying byte_length 0
  // over an empty frame would then decode as a tensor of 2^62 elements backed by no bytes.
  CodecLimits unlimited;
  unlimited.max_tensor_elements = std::numeric_limits<int64_t>::max();
  Message msg = testutil::SampleFitResult();
  msg.tensors.resize(1);
  std::vector<Frame> frames = CorruptFrames(msg, [](pb::Header& h) {
    h.mutable_tensors(0)->clear_shape();
    h.mutable_tensors(0)->add_shape(int64_t{1} << 62);
    h.mutable_tensors(0)->set_byte_length(0);
  });
  frames[1] = ZeroFrame(0);
  StatusOr<Message> got = Decode(frames, unlimited);
  EXPECT_EQ(got.status().code(), kInvalid)
      << "a tensor of 2^62 elements decoded with " << (got.ok() ? got->tensors[0].bytes.size() : 0)
      << " bytes";
}

TEST_F(CodecTest, RejectsAByteLengthThatDisagreesWithTheShape) {
  auto byte_length = [](uint64_t n) {
    return [n](pb::Header& h) { h.mutable_tensors(0)->set_byte_length(n); };
  };
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), byte_length(52)), kInvalid,
                      "tensor 0 ('fc0.weight') with shape [4,3] needs 48 bytes; header says 52"));
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), byte_length(0)), kInvalid,
                      "needs 48 bytes; header says 0"));
  // Shape and byte_length agree with each other but not with the frame.
  auto grown = [](pb::Header& h) {
    h.mutable_tensors(1)->set_shape(0, 5);
    h.mutable_tensors(1)->set_byte_length(20);
  };
  EXPECT_TRUE(
      IsError(DecodeCorrupted(testutil::SampleFitResult(), grown), kInvalid,
              "tensor 1 ('fc0.bias') with shape [5]: frame 1 of 1 has 16 bytes, expected 20"));
}

TEST_F(CodecTest, RejectsAFrameWhoseSizeDisagreesWithTheHeader) {
  EXPECT_TRUE(IsError(DecodeWithFrameSize(testutil::SampleFitResult(), 0, 52), kInvalid,
                      "frame 1 of 1 has 52 bytes, expected 48"));
  EXPECT_TRUE(
      IsError(DecodeWithFrameSize(testutil::SampleFitResult(), 1, 17), kInvalid,
              "tensor 1 ('fc0.bias') with shape [4]: frame 1 of 1 has 17 bytes, expected 16"));
}

TEST_F(CodecTest, RejectsATruncatedFrame) {
  EXPECT_TRUE(IsError(DecodeWithFrameSize(testutil::SampleFitResult(), 0, 47), kInvalid,
                      "frame 1 of 1 has 47 bytes, expected 48"));
  EXPECT_TRUE(IsError(DecodeWithFrameSize(testutil::SampleFitResult(), 1, 0), kInvalid,
                      "frame 1 of 1 has 0 bytes, expected 16"));
}

TEST_F(CodecTest, LargeTensorsTravelInChunksAndDecodeContiguously) {
  constexpr size_t kChunkFloats = kMaxChunkBytes / sizeof(float);
  Message msg = testutil::SampleFitResult();
  msg.tensors.push_back(Payload("big", {static_cast<int64_t>(2 * kChunkFloats + 3)}, 0.25f));
  msg.tensors.push_back(Payload("exact", {2, static_cast<int64_t>(kChunkFloats)}, -1.5f));
  std::vector<Frame> frames = EncodeToFrames(msg);
  ASSERT_EQ(frames.size(), 1u + 2 + 3 + 2);  // header, 2 small, 3 chunks, 2 chunks
  EXPECT_EQ(frames[3].bytes.size(), kMaxChunkBytes);
  EXPECT_EQ(frames[5].bytes.size(), 12u);
  StatusOr<Message> got = Decode(frames);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Describe(*got), Describe(msg));
  ExpectSamePayloads(got->tensors, msg.tensors);
  // A chunk of the wrong size, a missing last chunk, and one too many are all refused.
  std::vector<Frame> short_chunk = frames;
  short_chunk[4].bytes = short_chunk[4].bytes.first(kMaxChunkBytes - 4);
  EXPECT_TRUE(IsError(
      Decode(short_chunk), kInvalid,
      absl::StrCat("tensor 2 ('big') with shape [", 2 * kChunkFloats + 3, "]: frame 2 of 3 has ",
                   kMaxChunkBytes - 4, " bytes, expected ", kMaxChunkBytes)));
  std::vector<Frame> missing = frames;
  missing.pop_back();
  EXPECT_TRUE(IsError(Decode(missing), kInvalid, "needs 2 frame(s); only 1 remain"));
  std::vector<Frame> extra = frames;
  extra.push_back(ZeroFrame(4));
  EXPECT_TRUE(IsError(Decode(extra), kInvalid, "take 7 frames but 8 tensor frames follow"));
}

TEST_F(CodecTest, RejectsMoreFramesThanTheLimit) {
  std::vector<Frame> frames = EncodeToFrames(testutil::SampleHeartbeat());
  CodecLimits limits;
  limits.max_frames = 3;
  for (int i = 0; i < 3; ++i) frames.push_back(ZeroFrame(4));
  EXPECT_TRUE(IsError(Decode(frames, limits), kInvalid, "4 frames, limit 3"));
}

// ---- Body fields ----

TEST_F(CodecTest, RejectsNonFiniteTrainingSettings) {
  using Setter = void (pb::TrainConfig::*)(double);
  const std::pair<const char*, Setter> fields[] = {
      {"learning_rate", &pb::TrainConfig::set_learning_rate},
      {"momentum", &pb::TrainConfig::set_momentum},
      {"weight_decay", &pb::TrainConfig::set_weight_decay},
  };
  for (const auto& [name, set] : fields) {
    for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
      auto corrupt = [&, set = set](pb::Header& h) {
        (h.mutable_fit_instruction()->mutable_train()->*set)(bad);
      };
      EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitInstruction(), corrupt), kInvalid,
                          std::string("fit_instruction.train.") + name + " is not finite"))
          << name << " = " << bad;
    }
  }
}

TEST_F(CodecTest, RejectsBadPrivacyAndDpSgdSettings) {
  const std::pair<const char*, Mutation> cases[] = {
      {"fit_instruction.privacy.mode 7 is unknown",
       [](pb::Header& h) {
         h.mutable_fit_instruction()->mutable_privacy()->set_mode(
             static_cast<pb::UpdatePrivacy::Mode>(7));
       }},
      {"fit_instruction.privacy.clip_norm",
       [](pb::Header& h) { h.mutable_fit_instruction()->mutable_privacy()->set_clip_norm(-1); }},
      {"fit_instruction.privacy.clip_norm",
       [](pb::Header& h) {
         h.mutable_fit_instruction()->mutable_privacy()->set_clip_norm(std::nan(""));
       }},
      {"fit_instruction.privacy.noise_multiplier",
       [](pb::Header& h) {
         h.mutable_fit_instruction()->mutable_privacy()->set_noise_multiplier(0);
       }},
      {"fit_instruction.train.dp_sgd",
       [](pb::Header& h) {
         h.mutable_fit_instruction()->mutable_train()->mutable_dp_sgd()->set_clip_norm(HUGE_VAL);
       }},
      {"fit_instruction.train.dp_sgd",
       [](pb::Header& h) {
         h.mutable_fit_instruction()->mutable_train()->mutable_dp_sgd()->set_expected_batch_size(0);
       }},
      {"fit_instruction.train.dp_sgd",
       [](pb::Header& h) {
         h.mutable_fit_instruction()->mutable_train()->mutable_dp_sgd()->set_delta(1.5);
       }},
  };
  for (const auto& [what, corrupt] : cases) {
    EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitInstruction(), corrupt), kInvalid, what))
        << what;
  }
}

TEST_F(CodecTest, RejectsNonFiniteTrainingMetrics) {
  using Setter = void (pb::FitResult::*)(double);
  const std::pair<const char*, Setter> fields[] = {
      {"train_loss", &pb::FitResult::set_train_loss},
      {"train_accuracy", &pb::FitResult::set_train_accuracy},
      {"train_seconds", &pb::FitResult::set_train_seconds},
  };
  for (const auto& [name, set] : fields) {
    for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
      auto corrupt = [&, set = set](pb::Header& h) { (h.mutable_fit_result()->*set)(bad); };
      EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleFitResult(), corrupt), kInvalid,
                          std::string("fit_result.") + name + " is not finite"))
          << name << " = " << bad;
    }
  }
}

TEST_F(CodecTest, RejectsANonceOfTheWrongLength) {
  for (size_t n : {size_t{0}, size_t{15}, size_t{17}, size_t{4096}}) {
    const std::string nonce(n, 'n');
    EXPECT_TRUE(IsError(
        DecodeCorrupted(testutil::SampleFitInstruction(),
                        [&](pb::Header& h) { h.mutable_fit_instruction()->set_nonce(nonce); }),
        kInvalid, absl::StrCat("fit_instruction.nonce is ", n, " bytes, expected 16")));
    EXPECT_TRUE(IsError(
        DecodeCorrupted(testutil::SampleUploadRequest(),
                        [&](pb::Header& h) { h.mutable_upload_request()->set_nonce(nonce); }),
        kInvalid, absl::StrCat("upload_request.nonce is ", n, " bytes, expected 16")));
    EXPECT_TRUE(
        IsError(DecodeCorrupted(testutil::SampleFitResult(),
                                [&](pb::Header& h) { h.mutable_fit_result()->set_nonce(nonce); }),
                kInvalid, absl::StrCat("fit_result.nonce is ", n, " bytes, expected 16")));
  }
}

TEST_F(CodecTest, RejectsAnErrorCodeOutsideTheEnum) {
  auto code = [](int c) {
    return [c](pb::Header& h) { h.mutable_error()->set_code(static_cast<pb::Error::Code>(c)); };
  };
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleError(), code(9)), kInvalid,
                      "error.code 9 is unknown"));
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleError(), code(-1)), kInvalid,
                      "error.code -1 is unknown"));
}

TEST_F(CodecTest, RejectsAWelcomeWithTooManyHiddenLayers) {
  auto layers = [](int n) {
    return [n](pb::Header& h) {
      h.mutable_welcome()->mutable_model()->clear_hidden();
      for (int i = 0; i < n; ++i) h.mutable_welcome()->mutable_model()->add_hidden(8);
    };
  };
  EXPECT_TRUE(DecodeCorrupted(testutil::SampleWelcome(), layers(64)).ok());
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleWelcome(), layers(65)), kInvalid,
                      "welcome.model.hidden has more than 64 layers"));
}

// One length-limited string field: where it lives and how to set it.
struct StringField {
  const char* name;  // as the error names it
  size_t limit;
  Message sample;
  std::function<void(pb::Header&, const std::string&)> set;
};

TEST_F(CodecTest, RejectsEveryStringOverItsLimitNamingTheField) {
  const StringField fields[] = {
      {"sender", 256, testutil::SampleHeartbeat(),
       [](pb::Header& h, const std::string& s) { h.set_sender(s); }},
      {"join.client_id", 256, testutil::SampleJoin(),
       [](pb::Header& h, const std::string& s) { h.mutable_join()->set_client_id(s); }},
      {"join.agent_version", 256, testutil::SampleJoin(),
       [](pb::Header& h, const std::string& s) { h.mutable_join()->set_agent_version(s); }},
      {"join.job", 256, testutil::SampleJoin(),
       [](pb::Header& h, const std::string& s) { h.mutable_join()->set_job(s); }},
      {"join.datasets", 256, testutil::SampleJoin(),
       [](pb::Header& h, const std::string& s) { h.mutable_join()->set_datasets(1, s); }},
      {"job_offer.job", 256, testutil::SampleJobOffer(),
       [](pb::Header& h, const std::string& s) { h.mutable_job_offer()->set_job(s); }},
      {"job_offer.data", 256, testutil::SampleJobOffer(),
       [](pb::Header& h, const std::string& s) { h.mutable_job_offer()->set_data(s); }},
      {"welcome.job_name", 256, testutil::SampleWelcome(),
       [](pb::Header& h, const std::string& s) { h.mutable_welcome()->set_job_name(s); }},
      {"welcome.model.kind", 256, testutil::SampleWelcome(),
       [](pb::Header& h, const std::string& s) {
         h.mutable_welcome()->mutable_model()->set_kind(s);
       }},
      {"error.message", 4096, testutil::SampleError(),
       [](pb::Header& h, const std::string& s) { h.mutable_error()->set_message(s); }},
      {"shutdown.reason", 4096, testutil::SampleShutdown(),
       [](pb::Header& h, const std::string& s) { h.mutable_shutdown()->set_reason(s); }},
  };
  for (const StringField& f : fields) {
    SCOPED_TRACE(f.name);
    const std::string at_limit(f.limit, 'x'), over(f.limit + 1, 'x');
    EXPECT_TRUE(DecodeCorrupted(f.sample, [&](pb::Header& h) { f.set(h, at_limit); }).ok());
    EXPECT_TRUE(IsError(DecodeCorrupted(f.sample, [&](pb::Header& h) { f.set(h, over); }), kInvalid,
                        std::string(f.name) + " is " + std::to_string(f.limit + 1) +
                            " bytes, limit " + std::to_string(f.limit)));
  }
}

TEST_F(CodecTest, RejectsAJoinListingTooManyDataSets) {
  auto names = [](size_t n) {
    return [n](pb::Header& h) {
      h.mutable_join()->clear_datasets();
      for (size_t i = 0; i < n; ++i) h.mutable_join()->add_datasets("d" + std::to_string(i));
    };
  };
  EXPECT_TRUE(DecodeCorrupted(testutil::SampleJoin(), names(kMaxDatasetNames)).ok());
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleJoin(), names(kMaxDatasetNames + 1)),
                      kInvalid, "join.datasets has 65 names, limit 64"));
}

}  // namespace
}  // namespace huddle::wire
