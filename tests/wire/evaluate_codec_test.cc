// The wire fields of issue 20: an external model's tensor specs in ModelSpec (Welcome), and
// federated evaluation's EvaluateInstruction and EvaluateResult. Each field round-trips and each
// has a corruption test expecting a precise error, built as a hostile peer would: encode a valid
// message, edit its parsed header, serialise it again.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "huddle.pb.h"
#include "proto/codec.h"
#include "tests/wire/corrupt.h"
#include "tests/wire/wire_testing.h"

namespace huddle::wire {
namespace {

using absl::StatusCode;
using testutil::Describe;
using testutil::IsError;

constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;

using testutil::DecodeCorrupted;

pb::ModelSpec* Model(pb::Header& h) { return h.mutable_welcome()->mutable_model(); }

TEST(ExternalModelCodecTest, AnExternalModelsTensorsRoundTrip) {
  const Message msg = testutil::SampleExternalWelcome();
  StatusOr<Message> got = Decode(EncodeToFrames(msg));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Describe(*got), Describe(msg));
  const auto& model = std::get<Welcome>(got->body).model;
  EXPECT_EQ(model, std::get<Welcome>(msg.body).model);
  ASSERT_EQ(model.tensors.size(), 4u);
  EXPECT_EQ(model.tensors[3].shape, std::vector<int64_t>{}) << "a scalar keeps its empty shape";
}

TEST(ExternalModelCodecTest, RejectsMoreTensorSpecsThanTheLimit) {
  auto with = [](int n) {
    return [n](pb::Header& h) {
      Model(h)->clear_tensors();
      for (int i = 0; i < n; ++i) {
        pb::TensorSpec* t = Model(h)->add_tensors();
        t->set_name("t" + std::to_string(i));
        t->set_dtype(pb::DTYPE_FLOAT32);
        t->add_shape(2);
      }
    };
  };
  EXPECT_TRUE(DecodeCorrupted(testutil::SampleExternalWelcome(), with(256)).ok());
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleExternalWelcome(), with(257)), kInvalid,
                      "welcome.model.tensors lists 257 tensors, limit 256"));
}

TEST(ExternalModelCodecTest, RejectsAnEmptyOrOverlongTensorName) {
  EXPECT_TRUE(
      IsError(DecodeCorrupted(testutil::SampleExternalWelcome(),
                              [](pb::Header& h) { Model(h)->mutable_tensors(1)->clear_name(); }),
              kInvalid, "welcome.model.tensors 1 has an empty name"));
  EXPECT_TRUE(DecodeCorrupted(testutil::SampleExternalWelcome(), [](pb::Header& h) {
                Model(h)->mutable_tensors(0)->set_name(std::string(256, 'n'));
              }).ok());
  EXPECT_TRUE(IsError(
      DecodeCorrupted(
          testutil::SampleExternalWelcome(),
          [](pb::Header& h) { Model(h)->mutable_tensors(0)->set_name(std::string(257, 'n')); }),
      kInvalid, "name is 257 bytes, limit 256"));
}

TEST(ExternalModelCodecTest, RejectsAnotherDtype) {
  for (pb::DType dtype : {pb::DTYPE_UNSPECIFIED, static_cast<pb::DType>(7)}) {
    EXPECT_TRUE(IsError(
        DecodeCorrupted(testutil::SampleExternalWelcome(),
                        [&](pb::Header& h) { Model(h)->mutable_tensors(2)->set_dtype(dtype); }),
        kInvalid, "welcome.model.tensors 2 ('head/kernel:0') has dtype"));
  }
}

TEST(ExternalModelCodecTest, RejectsBadShapesNamingTheTensor) {
  const Message welcome = testutil::SampleExternalWelcome();
  EXPECT_TRUE(
      IsError(DecodeCorrupted(welcome,
                              [](pb::Header& h) { Model(h)->mutable_tensors(0)->set_shape(1, 0); }),
              kInvalid, "('conv1.weight'): shape [8,0,3,3] has a dimension < 1"));
  EXPECT_TRUE(
      IsError(DecodeCorrupted(
                  welcome, [](pb::Header& h) { Model(h)->mutable_tensors(1)->set_shape(0, -3); }),
              kInvalid, "('conv1.bias'): shape [-3] has a dimension < 1"));
  EXPECT_TRUE(IsError(DecodeCorrupted(welcome,
                                      [](pb::Header& h) {
                                        for (int i = 0; i < 5; ++i) {
                                          Model(h)->mutable_tensors(0)->add_shape(1);
                                        }
                                      }),
                      kInvalid, "rank 9 exceeds the maximum of 8"));
  EXPECT_TRUE(IsError(DecodeCorrupted(welcome,
                                      [](pb::Header& h) {
                                        pb::TensorSpec* t = Model(h)->mutable_tensors(1);
                                        t->clear_shape();
                                        t->add_shape(int64_t{1} << 40);
                                        t->add_shape(int64_t{1} << 40);
                                      }),
                      kInvalid, "exceeds the limit of 268435456 elements"));
}

TEST(EvaluateCodecTest, BothMessagesRoundTripWithEveryField) {
  for (const Message& msg :
       {testutil::SampleEvaluateInstruction(), testutil::SampleEvaluateResult()}) {
    SCOPED_TRACE(MessageTypeName(msg.type()));
    StatusOr<Message> got = Decode(EncodeToFrames(msg));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(Describe(*got), Describe(msg));
    testutil::ExpectSamePayloads(got->tensors, msg.tensors);
  }
}

TEST(EvaluateCodecTest, AnInstructionCarriesTheModelAResultDoesNot) {
  Message result = testutil::SampleEvaluateResult();
  result.tensors = testutil::SmallModel();
  EXPECT_TRUE(
      IsError(Decode(EncodeToFrames(result)), kInvalid, "EvaluateResult must not carry tensors"));
  EXPECT_EQ(Decode(EncodeToFrames(testutil::SampleEvaluateInstruction()))->tensors.size(), 2u);
}

TEST(EvaluateCodecTest, RejectsANonceOfTheWrongLength) {
  for (size_t n : {size_t{0}, size_t{15}, size_t{17}}) {
    const std::string nonce(n, 'q');
    EXPECT_TRUE(IsError(
        DecodeCorrupted(testutil::SampleEvaluateInstruction(),
                        [&](pb::Header& h) { h.mutable_evaluate_instruction()->set_nonce(nonce); }),
        kInvalid, "evaluate_instruction.nonce is " + std::to_string(n) + " bytes"));
    EXPECT_TRUE(IsError(
        DecodeCorrupted(testutil::SampleEvaluateResult(),
                        [&](pb::Header& h) { h.mutable_evaluate_result()->set_nonce(nonce); }),
        kInvalid, "evaluate_result.nonce is " + std::to_string(n) + " bytes"));
  }
}

TEST(EvaluateCodecTest, RejectsNonFiniteLossOrAccuracy) {
  for (double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity()}) {
    EXPECT_TRUE(
        IsError(DecodeCorrupted(testutil::SampleEvaluateResult(),
                                [&](pb::Header& h) { h.mutable_evaluate_result()->set_loss(bad); }),
                kInvalid, "evaluate_result.loss is not finite"));
    EXPECT_TRUE(IsError(
        DecodeCorrupted(testutil::SampleEvaluateResult(),
                        [&](pb::Header& h) { h.mutable_evaluate_result()->set_accuracy(bad); }),
        kInvalid, "evaluate_result.accuracy is not finite"));
  }
  // Out-of-range but finite values are the coordinator's to judge (coordinator tests).
  EXPECT_TRUE(DecodeCorrupted(testutil::SampleEvaluateResult(), [](pb::Header& h) {
                h.mutable_evaluate_result()->set_accuracy(7.0);
              }).ok());
}

}  // namespace
}  // namespace huddle::wire
