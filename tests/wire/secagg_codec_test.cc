// Secure aggregation's wire fields in the header (proto/huddle.proto, version 5): the session in a
// FitInstruction, the masked input's words, and SecAggData (a stage, a nonce and exactly one uint8
// frame named "secagg"). Each round-trips, and each field has a corruption test that expects a
// precise "malformed message" error naming it. What the frame's bytes hold (aggregation/secagg/
// wire.h) is secagg_payload_test's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "aggregation/secagg/wire.h"
#include "gtest/gtest.h"
#include "huddle.pb.h"
#include "proto/codec.h"
#include "tests/wire/corrupt.h"
#include "tests/wire/wire_testing.h"

namespace huddle::wire {
namespace {

using testutil::DecodeCorrupted;
using testutil::Describe;
using testutil::ExpectSamePayloads;
using testutil::IsError;
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
using testutil::Mutation;

// Refused as malformed (InvalidArgument "malformed message: ..."), naming `needle`.
::testing::AssertionResult Malformed(const StatusOr<Message>& got, const std::string& needle) {
  ::testing::AssertionResult named = IsError(got, kInvalid, needle);
  if (!named) return named;
  if (!absl::StartsWith(got.status().message(), "malformed message: ")) {
    return ::testing::AssertionFailure() << "not a malformed-message error: " << got.status();
  }
  return ::testing::AssertionSuccess();
}

// The member list's SecAggData (747 bytes: an odd length).
Message MemberListData() { return testutil::SampleSecAggData(testutil::SampleMemberList()); }
// A member's advertisement (96 bytes, with a nonce).
Message AdvertiseData() { return testutil::SampleSecAggData(testutil::SampleAdvertisement()); }

// ---- SecAggData ----

TEST(SecAggCodecTest, EveryStageRoundTripsWithItsPayload) {
  const std::vector<Message> stages = testutil::SampleSecAggStages();
  ASSERT_EQ(stages.size(), 12u);
  for (size_t i = 0; i < stages.size(); ++i) {
    const Message& msg = stages[i];
    const SecAggData& data = std::get<SecAggData>(msg.body);
    SCOPED_TRACE(Describe(msg));
    EXPECT_EQ(data.stage, i + 1);
    EXPECT_EQ(data.nonce.empty(), !aggregation::secagg::FromMember(data.stage));
    StatusOr<Message> got = Decode(EncodeToFrames(msg));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(std::get<SecAggData>(got->body), data);
    EXPECT_EQ(Describe(*got), Describe(msg));
    ASSERT_EQ(got->tensors.size(), 1u);
    EXPECT_EQ(
        got->tensors[0].spec,
        (TensorSpec{"secagg", DType::kUint8, {static_cast<int64_t>(msg.tensors[0].bytes.size())}}));
    ExpectSamePayloads(got->tensors, msg.tensors);
    StatusOr<std::span<const std::byte>> payload = aggregation::secagg::PayloadOf(*got);
    ASSERT_TRUE(payload.ok()) << payload.status();
    StatusOr<std::string> again = testutil::Reencode(data.stage, *payload);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(std::equal(payload->begin(), payload->end(), testutil::AsBytes(*again).begin(),
                           testutil::AsBytes(*again).end()));
  }
}

TEST(SecAggCodecTest, AnOddLengthPayloadSurvivesAMisalignedFrameAndChunking) {
  const Message msg = MemberListData();
  ASSERT_EQ(msg.tensors[0].bytes.size() % 2, 1u) << "the sample must have an odd length";
  // One frame at an odd address: copied into aligned memory.
  std::vector<Frame> frames = EncodeToFrames(msg);
  auto storage = std::make_shared<std::vector<std::byte>>(frames[1].bytes.size() + 1);
  std::memcpy(storage->data() + 1, frames[1].bytes.data(), frames[1].bytes.size());
  frames[1] =
      Frame{storage, std::span<const std::byte>(storage->data() + 1, frames[1].bytes.size())};
  StatusOr<Message> got = Decode(frames);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NE(got->tensors[0].bytes.data(), storage->data() + 1);
  frames.clear();
  storage.reset();
  ExpectSamePayloads(got->tensors, msg.tensors);
  // In 64-byte chunks, the last one short and odd: reassembled.
  CodecLimits limits;
  limits.chunk_bytes = 64;
  frames = EncodeToFrames(msg, limits.chunk_bytes);
  ASSERT_EQ(frames.size(), 1 + ChunkCount(msg.tensors[0].bytes.size(), 64));
  got = Decode(frames, limits);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSamePayloads(got->tensors, msg.tensors);
  frames.pop_back();
  EXPECT_TRUE(Malformed(Decode(frames, limits), "needs 12 frame(s); only 11 remain"));
}

TEST(SecAggCodecTest, TheStageIsOneToTwelve) {
  for (uint32_t stage : {0u, 13u, 1000u, std::numeric_limits<uint32_t>::max()}) {
    EXPECT_TRUE(Malformed(
        DecodeCorrupted(MemberListData(),
                        [&](pb::Header& h) { h.mutable_secagg_data()->set_stage(stage); }),
        absl::StrCat("secagg_data.stage ", stage, " is not 1-12")));
  }
  // Any stage in range passes the codec: the stage's own decoder judges the bytes.
  for (uint32_t stage : {1u, 12u}) {
    StatusOr<Message> got = DecodeCorrupted(
        MemberListData(), [&](pb::Header& h) { h.mutable_secagg_data()->set_stage(stage); });
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(std::get<SecAggData>(got->body).stage, stage);
  }
}

TEST(SecAggCodecTest, TheNonceIsEmptyOrSixteenBytes) {
  for (size_t n : {size_t{1}, size_t{15}, size_t{17}, size_t{4096}}) {
    EXPECT_TRUE(Malformed(DecodeCorrupted(AdvertiseData(),
                                          [&](pb::Header& h) {
                                            h.mutable_secagg_data()->set_nonce(std::string(n, 'n'));
                                          }),
                          absl::StrCat("secagg_data.nonce is ", n, " bytes, expected 16")));
  }
  for (size_t n : {size_t{0}, size_t{16}}) {
    StatusOr<Message> got = DecodeCorrupted(AdvertiseData(), [&](pb::Header& h) {
      h.mutable_secagg_data()->set_nonce(std::string(n, 'n'));
    });
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(std::get<SecAggData>(got->body).nonce, std::string(n, 'n'));
  }
}

TEST(SecAggCodecTest, ItCarriesExactlyOneFrameNamedSecagg) {
  const std::string exactly_one =
      "secagg_data carries exactly one frame, 'secagg', of one dimension";
  // No frame at all.
  Message none = AdvertiseData();
  none.tensors.clear();
  EXPECT_TRUE(Malformed(Decode(EncodeToFrames(none)), exactly_one));
  // The header lists none, but the frame follows.
  EXPECT_TRUE(Malformed(DecodeCorrupted(AdvertiseData(), [](pb::Header& h) { h.clear_tensors(); }),
                        "header lists no tensors but 1 tensor frames follow"));
  // Two frames, whatever the second is called.
  for (const char* second : {"secagg", "extra"}) {
    Message two = AdvertiseData();
    TensorPayload copy = two.tensors[0];
    copy.spec.name = second;
    two.tensors.push_back(copy);
    EXPECT_TRUE(Malformed(Decode(EncodeToFrames(two)), exactly_one)) << second;
  }
  // Another name.
  for (const char* name : {"", "SECAGG", "secagg ", "secagg.weight", "fc0.weight"}) {
    EXPECT_TRUE(
        Malformed(DecodeCorrupted(AdvertiseData(),
                                  [&](pb::Header& h) { h.mutable_tensors(0)->set_name(name); }),
                  exactly_one))
        << "'" << name << "'";
  }
}

TEST(SecAggCodecTest, TheFrameIsUint8) {
  for (int dtype : {0, 1, 2, 3, 5, 9}) {
    EXPECT_TRUE(Malformed(
        DecodeCorrupted(
            AdvertiseData(),
            [&](pb::Header& h) { h.mutable_tensors(0)->set_dtype(static_cast<pb::DType>(dtype)); }),
        absl::StrCat("tensor 0 ('secagg') has dtype ", dtype,
                     ": a secure-aggregation stage's frame is uint8 (4)")));
  }
  // Float32 with the byte length of 24 floats (the same 96 bytes): refused all the same.
  EXPECT_TRUE(Malformed(DecodeCorrupted(AdvertiseData(),
                                        [](pb::Header& h) {
                                          h.mutable_tensors(0)->set_dtype(pb::DTYPE_FLOAT32);
                                          h.mutable_tensors(0)->set_shape(0, 24);
                                        }),
                        "has dtype 1"));
}

TEST(SecAggCodecTest, TheFrameHasOneDimensionOfItsByteCount) {
  const std::string exactly_one =
      "secagg_data carries exactly one frame, 'secagg', of one dimension";
  auto shape = [](std::vector<int64_t> dims) {
    return [dims](pb::Header& h) {
      h.mutable_tensors(0)->clear_shape();
      for (int64_t d : dims) h.mutable_tensors(0)->add_shape(d);
    };
  };
  EXPECT_TRUE(Malformed(DecodeCorrupted(AdvertiseData(), shape({1, 96})), exactly_one));
  EXPECT_TRUE(Malformed(DecodeCorrupted(AdvertiseData(), shape({96, 1})), exactly_one));
  EXPECT_TRUE(Malformed(DecodeCorrupted(AdvertiseData(), shape({})), exactly_one));
  EXPECT_TRUE(Malformed(DecodeCorrupted(AdvertiseData(), shape({-96})), "has a dimension < 1"));
  // A zero-length frame: refused by its shape before its bytes are looked at.
  std::vector<Frame> empty = testutil::CorruptFrames(AdvertiseData(), [](pb::Header& h) {
    h.mutable_tensors(0)->set_shape(0, 0);
    h.mutable_tensors(0)->set_byte_length(0);
  });
  empty[1] = testutil::ZeroFrame(0);
  EXPECT_TRUE(Malformed(Decode(empty), "tensor 0 ('secagg'): shape [0] has a dimension < 1"));
  // Byte length, shape and frame must all agree.
  EXPECT_TRUE(
      Malformed(DecodeCorrupted(AdvertiseData(),
                                [](pb::Header& h) { h.mutable_tensors(0)->set_byte_length(95); }),
                "tensor 0 ('secagg') with shape [96] needs 96 bytes; header says 95"));
  EXPECT_TRUE(Malformed(DecodeCorrupted(AdvertiseData(),
                                        [](pb::Header& h) {
                                          h.mutable_tensors(0)->set_shape(0, 97);
                                          h.mutable_tensors(0)->set_byte_length(97);
                                        }),
                        "with shape [97]: frame 1 of 1 has 96 bytes, expected 97"));
  for (size_t size : {size_t{0}, size_t{95}, size_t{97}}) {
    std::vector<Frame> frames = EncodeToFrames(AdvertiseData());
    frames[1] = testutil::ZeroFrame(size);
    EXPECT_TRUE(Malformed(Decode(frames), absl::StrCat("tensor 0 ('secagg') with shape [96]: frame "
                                                       "1 of 1 has ",
                                                       size, " bytes, expected 96")));
  }
}

TEST(SecAggCodecTest, Uint8FramesTravelOnlyOnASecAggData) {
  EXPECT_TRUE(Malformed(
      DecodeCorrupted(testutil::SampleFitResult(),
                      [](pb::Header& h) { h.mutable_tensors(1)->set_dtype(pb::DTYPE_UINT8); }),
      "tensor 1 ('fc0.bias') has dtype 4, expected float32 (1)"));
  EXPECT_TRUE(Malformed(
      DecodeCorrupted(testutil::SampleSecAggMaskedInput(),
                      [](pb::Header& h) { h.mutable_tensors(0)->set_dtype(pb::DTYPE_UINT8); }),
      "has dtype 4: a masked input's words are all uint32 (2) or all uint64 (3)"));
}

// ---- The masked input ----

TEST(SecAggCodecTest, TheMaskedInputsNonceHasItsSize) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}}) {
    EXPECT_TRUE(Malformed(DecodeCorrupted(testutil::SampleSecAggMaskedInput(),
                                          [&](pb::Header& h) {
                                            h.mutable_secagg_masked_input()->set_nonce(
                                                std::string(n, 'n'));
                                          }),
                          absl::StrCat("secagg_masked_input.nonce is ", n, " bytes")));
  }
}

TEST(SecAggCodecTest, WordsTravelOnlyOnAMaskedInputAndAllOfOneWidth) {
  // A masked input of floats, or of two widths: refused.
  EXPECT_TRUE(Malformed(
      DecodeCorrupted(testutil::SampleSecAggMaskedInput(),
                      [](pb::Header& h) { h.mutable_tensors(0)->set_dtype(pb::DTYPE_FLOAT32); }),
      "has dtype 1: a masked input's words are all uint32"));
  EXPECT_TRUE(Malformed(DecodeCorrupted(testutil::SampleSecAggMaskedInput(),
                                        [](pb::Header& h) {
                                          h.mutable_tensors(1)->set_dtype(pb::DTYPE_UINT64);
                                          h.mutable_tensors(1)->set_byte_length(32);
                                        }),
                        "tensor 1 ('fc0.bias') has dtype 3"));
  // Words on a model's message: refused.
  EXPECT_TRUE(Malformed(
      DecodeCorrupted(testutil::SampleFitResult(),
                      [](pb::Header& h) { h.mutable_tensors(1)->set_dtype(pb::DTYPE_UINT32); }),
      "has dtype 2, expected float32 (1)"));
  // 64-bit words: the byte length follows the width.
  Message wide = testutil::SampleSecAggMaskedInput();
  auto words = std::make_shared<std::vector<uint64_t>>(16, ~uint64_t{0});
  wide.tensors.resize(1);
  wide.tensors[0].spec = TensorSpec{"fc0.weight", DType::kUint64, {16}};
  wide.tensors[0].bytes = std::as_bytes(std::span<const uint64_t>(*words));
  wide.tensors[0].owner = words;
  StatusOr<Message> got = Decode(EncodeToFrames(wide));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tensors[0].spec.dtype, DType::kUint64);
  EXPECT_EQ(got->tensors[0].bytes.size(), 128u);
  EXPECT_TRUE(Malformed(
      DecodeCorrupted(wide, [](pb::Header& h) { h.mutable_tensors(0)->set_byte_length(64); }),
      "needs 128 bytes; header says 64"));
}

// ---- The session in a FitInstruction ----

pb::SecureAggregation* Session(pb::Header& h) {
  return h.mutable_fit_instruction()->mutable_secure_aggregation();
}

TEST(SecAggCodecTest, TheRoundsSessionIsChecked) {
  constexpr uint64_t k2p32 = uint64_t{1} << 32;
  struct Case {
    Mutation mutate;
    std::string error;
  };
  const Case cases[] = {
      {[](pb::Header& h) { Session(h)->set_session(std::string(31, 'x')); },
       "fit_instruction.secure_aggregation.session is 31 bytes, expected 32"},
      {[](pb::Header& h) { Session(h)->clear_session(); }, ".session is 0 bytes, expected 32"},
      {[](pb::Header& h) { Session(h)->set_bits(16); }, ".bits 16 is not 32 or 64"},
      {[](pb::Header& h) { Session(h)->set_index(10); }, "index 10, members 10,"},
      {[](pb::Header& h) { Session(h)->set_members(1); }, "members 1,"},
      {[](pb::Header& h) { Session(h)->set_threshold(0); }, "threshold 0,"},
      {[](pb::Header& h) { Session(h)->set_threshold(10); }, "threshold 10,"},
      {[](pb::Header& h) { Session(h)->set_min_survivors(0); }, "min_survivors 0,"},
      {[](pb::Header& h) { Session(h)->set_min_survivors(11); }, "min_survivors 11,"},
      {[](pb::Header& h) { Session(h)->set_edge_threshold(0); },
       "edge_threshold 0 are inconsistent"},
      {[=](pb::Header& h) { Session(h)->set_edge_threshold(k2p32 + 1); },
       "edge_threshold 4294967297 are inconsistent"},
      {[](pb::Header& h) { Session(h)->set_edge_threshold(~uint64_t{0}); },
       "edge_threshold 18446744073709551615"},
      {[](pb::Header& h) { Session(h)->set_length(0); }, "length 0,"},
      {[](pb::Header& h) { Session(h)->set_length(uint64_t{1} << 37); }, "length 137438953472"},
      {[](pb::Header& h) { Session(h)->set_scale_exponent(2000); }, "scale exponent 2000"},
      {[](pb::Header& h) { Session(h)->set_scale_exponent(-1101); }, "scale exponent -1101"},
      {[](pb::Header& h) { Session(h)->set_noise_variance((uint64_t{1} << 52) + 1); },
       "noise variance 4503599627370497"},
      {[](pb::Header& h) { Session(h)->set_clip_norm(0); }, "clip norm 0 out of range"},
      {[](pb::Header& h) { Session(h)->set_clip_norm(-1); }, "clip norm -1 out of range"},
      {[](pb::Header& h) { Session(h)->set_clip_norm(std::nan("")); }, "clip norm nan"},
      {[](pb::Header& h) { Session(h)->set_clip_norm(HUGE_VAL); }, "clip norm inf"},
      // Distributed DP: only with a session that gives the noise share.
      {[](pb::Header& h) {
         auto* p = h.mutable_fit_instruction()->mutable_privacy();
         p->set_mode(pb::UpdatePrivacy::MODE_DISTRIBUTED);
         p->set_clip_norm(1);
         Session(h)->set_noise_variance(0);
       },
       "privacy.mode distributed without a secure_aggregation noise_variance"},
      {[](pb::Header& h) {
         auto* p = h.mutable_fit_instruction()->mutable_privacy();
         p->set_mode(pb::UpdatePrivacy::MODE_DISTRIBUTED);
         p->set_clip_norm(1);
         h.mutable_fit_instruction()->clear_secure_aggregation();
       },
       "privacy.mode distributed without a secure_aggregation noise_variance"},
  };
  const Message fit = testutil::SampleSecureFitInstruction();
  for (const Case& c : cases) {
    EXPECT_TRUE(Malformed(DecodeCorrupted(fit, c.mutate), c.error)) << c.error;
  }
}

TEST(SecAggCodecTest, TheSessionsBoundsAreInclusive) {
  SecureAggregation edge = testutil::SampleSecureAggregation();
  edge.index = 9;
  edge.threshold = 9;
  edge.bits = 64;
  edge.length = uint64_t{1} << 36;
  edge.scale_exponent = -1100;
  edge.noise_variance = uint64_t{1} << 52;
  edge.weight_cap = ~uint64_t{0};
  const std::pair<uint32_t, uint64_t> survivors_and_edges[] = {
      {1, 1}, {10, uint64_t{1} << 32}, {6, (uint64_t{1} << 32) - 1}};
  for (auto [min_survivors, edge_threshold] : survivors_and_edges) {
    edge.min_survivors = min_survivors;
    edge.edge_threshold = edge_threshold;
    Message msg = testutil::SampleSecureFitInstruction();
    std::get<FitInstruction>(msg.body).secure_aggregation = edge;
    StatusOr<Message> got = Decode(EncodeToFrames(msg));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(std::get<FitInstruction>(got->body).secure_aggregation, edge);
  }
  edge.scale_exponent = 1100;
  Message msg = testutil::SampleSecureFitInstruction();
  std::get<FitInstruction>(msg.body).secure_aggregation = edge;
  EXPECT_TRUE(Decode(EncodeToFrames(msg)).ok());
}

}  // namespace
}  // namespace huddle::wire
