// Secure aggregation's wire fields (proto/huddle.proto, version 4): each round-trips (codec_test's
// EveryMessageTypeRoundTripsWithEveryField holds the samples), and each has a corruption test that
// expects a precise error naming the field.
#include <functional>
#include <string>

#include "gtest/gtest.h"
#include "huddle.pb.h"
#include "proto/codec.h"
#include "tests/wire/corrupt.h"
#include "tests/wire/wire_testing.h"

namespace huddle::wire {
namespace {

using testutil::IsError;
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
using Mutation = std::function<void(pb::Header&)>;

using testutil::DecodeCorrupted;

pb::SecureAggregation* Session(pb::Header& h) {
  return h.mutable_fit_instruction()->mutable_secure_aggregation();
}

TEST(SecAggCodecTest, TheRoundsSessionIsChecked) {
  const Message fit = testutil::SampleSecureFitInstruction();
  struct Case {
    Mutation mutate;
    std::string error;
  };
  const Case cases[] = {
      {[](pb::Header& h) { Session(h)->set_session(std::string(31, 'x')); },
       "fit_instruction.secure_aggregation.session is 31 bytes, expected 32"},
      {[](pb::Header& h) { Session(h)->set_bits(16); }, ".bits 16 is not 32 or 64"},
      {[](pb::Header& h) { Session(h)->set_index(10); }, "index 10, members 10"},
      {[](pb::Header& h) { Session(h)->set_members(1); }, "members 1"},
      {[](pb::Header& h) { Session(h)->set_threshold(0); }, "threshold 0"},
      {[](pb::Header& h) { Session(h)->set_threshold(10); }, "threshold 10"},
      {[](pb::Header& h) { Session(h)->set_min_survivors(11); }, "min_survivors 11"},
      {[](pb::Header& h) { Session(h)->set_length(0); }, "length 0"},
      {[](pb::Header& h) { Session(h)->set_length(uint64_t{1} << 37); }, "length 137438953472"},
      {[](pb::Header& h) { Session(h)->set_scale_exponent(2000); }, "scale exponent 2000"},
      {[](pb::Header& h) { Session(h)->set_noise_variance((uint64_t{1} << 52) + 1); },
       "noise variance 4503599627370497"},
      {[](pb::Header& h) { Session(h)->set_clip_norm(0); }, "clip norm 0"},
      {[](pb::Header& h) { Session(h)->set_clip_norm(std::nan("")); }, "clip norm nan"},
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
  for (const Case& c : cases) {
    EXPECT_TRUE(IsError(DecodeCorrupted(fit, c.mutate), kInvalid, c.error)) << c.error;
  }
}

TEST(SecAggCodecTest, KeysNoncesAndCommitmentsHaveTheirSizes) {
  struct Case {
    Message sample;
    Mutation mutate;
    std::string error;
  };
  const Case cases[] = {
      {testutil::SampleSecAggAdvertise(),
       [](pb::Header& h) { h.mutable_secagg_advertise()->set_nonce("short"); },
       "secagg_advertise.nonce is 5 bytes"},
      {testutil::SampleSecAggAdvertise(),
       [](pb::Header& h) { h.mutable_secagg_advertise()->set_cipher_key(std::string(33, 'k')); },
       "secagg_advertise.cipher_key is 33 bytes, expected 32"},
      {testutil::SampleSecAggAdvertise(),
       [](pb::Header& h) { h.mutable_secagg_advertise()->clear_mask_key(); },
       "secagg_advertise.mask_key is 0 bytes"},
      {testutil::SampleSecAggKeyList(),
       [](pb::Header& h) { h.mutable_secagg_key_list()->mutable_neighbours(1)->set_mask_key("k"); },
       "secagg_key_list.neighbours.mask_key is 1 bytes"},
      {testutil::SampleSecAggShares(),
       [](pb::Header& h) { h.mutable_secagg_shares()->set_self_mask_commitment("c"); },
       "secagg_shares.self_mask_commitment is 1 bytes"},
      {testutil::SampleSecAggShares(),
       [](pb::Header& h) { h.mutable_secagg_shares()->set_nonce(""); },
       "secagg_shares.nonce is 0 bytes"},
      {testutil::SampleSecAggShares(),
       [](pb::Header& h) {
         h.mutable_secagg_shares()->mutable_shares(0)->set_ciphertext(std::string(257, 'z'));
       },
       "secagg_shares.shares.ciphertext is 257 bytes, limit 256"},
      {testutil::SampleSecAggShareList(),
       [](pb::Header& h) {
         h.mutable_secagg_share_list()->mutable_shares(0)->set_ciphertext(std::string(300, 'z'));
       },
       "secagg_share_list.shares.ciphertext is 300 bytes"},
      {testutil::SampleSecAggMaskedInput(),
       [](pb::Header& h) { h.mutable_secagg_masked_input()->set_nonce("n"); },
       "secagg_masked_input.nonce is 1 bytes"},
      {testutil::SampleSecAggUnmaskResponse(),
       [](pb::Header& h) { h.mutable_secagg_unmask_response()->set_nonce("n"); },
       "secagg_unmask_response.nonce is 1 bytes"},
      {testutil::SampleSecAggUnmaskResponse(),
       [](pb::Header& h) {
         h.mutable_secagg_unmask_response()->mutable_mask_key_shares(0)->add_y(1);
       },
       "secagg_unmask_response.mask_key_shares of member 7 has 6 values, expected 5"},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(IsError(DecodeCorrupted(c.sample, c.mutate), kInvalid, c.error)) << c.error;
  }
}

TEST(SecAggCodecTest, ListsAreBoundedByTheNeighbourLimit) {
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleSecAggKeyList(),
                                      [](pb::Header& h) {
                                        auto* l = h.mutable_secagg_key_list();
                                        while (l->neighbours_size() <= 400) {
                                          *l->add_neighbours() = l->neighbours(0);
                                        }
                                      }),
                      kInvalid, "secagg_key_list.neighbours has 401 entries, limit 400"));
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleSecAggShareList(),
                                      [](pb::Header& h) {
                                        auto* l = h.mutable_secagg_share_list();
                                        while (l->shares_size() <= 400) {
                                          *l->add_shares() = l->shares(0);
                                        }
                                      }),
                      kInvalid, "secagg_share_list.shares has 401 entries"));
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleSecAggUnmask(),
                                      [](pb::Header& h) {
                                        auto* u = h.mutable_secagg_unmask();
                                        while (u->survivors_size() <= 401) u->add_survivors(1);
                                      }),
                      kInvalid, "secagg_unmask.survivors has 401 entries"));
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleSecAggUnmaskResponse(),
                                      [](pb::Header& h) {
                                        auto* r = h.mutable_secagg_unmask_response();
                                        while (r->self_mask_shares_size() <= 400) {
                                          *r->add_self_mask_shares() = r->self_mask_shares(0);
                                        }
                                      }),
                      kInvalid, "self_mask_shares has 401 entries"));
}

TEST(SecAggCodecTest, WordsTravelOnlyOnAMaskedInputAndAllOfOneWidth) {
  // A masked input of floats, or of two widths: refused.
  EXPECT_TRUE(IsError(
      DecodeCorrupted(testutil::SampleSecAggMaskedInput(),
                      [](pb::Header& h) { h.mutable_tensors(0)->set_dtype(pb::DTYPE_FLOAT32); }),
      kInvalid, "has dtype 1: a masked input's words are all uint32"));
  EXPECT_TRUE(IsError(DecodeCorrupted(testutil::SampleSecAggMaskedInput(),
                                      [](pb::Header& h) {
                                        h.mutable_tensors(1)->set_dtype(pb::DTYPE_UINT64);
                                        h.mutable_tensors(1)->set_byte_length(32);
                                      }),
                      kInvalid, "tensor 1 ('fc0.bias') has dtype 3"));
  // Words on a model's message: refused.
  EXPECT_TRUE(IsError(
      DecodeCorrupted(testutil::SampleFitResult(),
                      [](pb::Header& h) { h.mutable_tensors(1)->set_dtype(pb::DTYPE_UINT32); }),
      kInvalid, "has dtype 2, expected float32 (1)"));
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
  EXPECT_TRUE(IsError(
      DecodeCorrupted(wide, [](pb::Header& h) { h.mutable_tensors(0)->set_byte_length(64); }),
      kInvalid, "needs 128 bytes; header says 64"));
}

}  // namespace
}  // namespace huddle::wire
