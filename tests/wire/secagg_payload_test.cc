// Secure aggregation's stage messages in their binary encoding (aggregation/secagg/wire.h): each of
// the twelve types round-trips through Encode/Decode and through a SecAggData on the wire; every
// truncation, a trailing byte and every count past its bound are refused with InvalidArgument
// naming the message and the field; PayloadOf takes only a SecAggData's one uint8 frame.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "aggregation/secagg/graph.h"
#include "aggregation/secagg/wire.h"
#include "gtest/gtest.h"
#include "proto/codec.h"
#include "tests/wire/secagg_samples.h"
#include "tests/wire/wire_testing.h"

namespace huddle::wire {
namespace {

namespace secagg = aggregation::secagg;
using testutil::AsBytes;
using testutil::IsError;
using testutil::SampleOf;
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// `bytes` in a heap block of exactly their size, so that a sanitizer sees a read past the end.
std::vector<std::byte> Exact(std::span<const std::byte> bytes) {
  return {bytes.begin(), bytes.end()};
}

// Refused as a malformed `what` (InvalidArgument "malformed secure-aggregation <what>: ..."),
// naming `needle`.
template <class T>
::testing::AssertionResult Refused(const StatusOr<T>& got, const std::string& what,
                                   const std::string& needle = "") {
  ::testing::AssertionResult named = IsError(got, kInvalid, needle);
  if (!named) return named;
  const std::string prefix = "malformed secure-aggregation " + what + ": ";
  if (!absl::StartsWith(got.status().message(), prefix)) {
    return ::testing::AssertionFailure()
           << "expected \"" << prefix << "...\", got " << got.status();
  }
  return ::testing::AssertionSuccess();
}

// Little-endian words, as the encoding writes counts and indices.
std::string Word(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

template <class T>
StatusOr<T> DecodeString(const std::string& bytes) {
  return secagg::Decode<T>(Exact(AsBytes(bytes)));
}

// ---- Every type ----

// The name each message type's errors give.
template <class T>
struct What;
#define HUDDLE_WHAT(T, name)                   \
  template <>                                  \
  struct What<secagg::T> {                     \
    static constexpr const char* kName = name; \
  };
HUDDLE_WHAT(Advertisement, "advertisement")
HUDDLE_WHAT(MemberList, "member list")
HUDDLE_WHAT(Reveal, "reveal")
HUDDLE_WHAT(SeedList, "seed list")
HUDDLE_WHAT(ShareKeys, "share message")
HUDDLE_WHAT(ShareList, "share list")
HUDDLE_WHAT(Verdict, "verdict")
HUDDLE_WHAT(MaskRequest, "mask request")
HUDDLE_WHAT(Survivors, "survivor sets")
HUDDLE_WHAT(Consistency, "consistency signature")
HUDDLE_WHAT(UnmaskRequest, "unmask request")
HUDDLE_WHAT(UnmaskResponse, "unmask response")
#undef HUDDLE_WHAT

template <class T>
class SecAggPayloadTest : public ::testing::Test {
 protected:
  static std::string what() { return What<T>::kName; }
};
using StageMessages =
    ::testing::Types<secagg::Advertisement, secagg::MemberList, secagg::Reveal, secagg::SeedList,
                     secagg::ShareKeys, secagg::ShareList, secagg::Verdict, secagg::MaskRequest,
                     secagg::Survivors, secagg::Consistency, secagg::UnmaskRequest,
                     secagg::UnmaskResponse>;
struct StageNames {
  template <class T>
  static std::string GetName(int) {
    std::string name = What<T>::kName;
    for (char& c : name) c = c == ' ' ? '_' : c;
    return name;
  }
};
TYPED_TEST_SUITE(SecAggPayloadTest, StageMessages, StageNames);

TYPED_TEST(SecAggPayloadTest, RoundTripsAndReencodesToTheSameBytes) {
  const TypeParam sample = SampleOf<TypeParam>();
  const std::string bytes = secagg::Encode(sample);
  ASSERT_GT(bytes.size(), 4u) << "the sample should not be trivial";
  StatusOr<TypeParam> got = DecodeString<TypeParam>(bytes);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, sample);
  EXPECT_EQ(secagg::Encode(*got), bytes);
}

TYPED_TEST(SecAggPayloadTest, TravelsAsItsStageInASecAggData) {
  const TypeParam sample = SampleOf<TypeParam>();
  const secagg::Stage stage = secagg::StageOf<TypeParam>();
  ASSERT_TRUE(secagg::IsStage(static_cast<uint32_t>(stage)));
  const std::string nonce =
      secagg::FromMember(static_cast<uint32_t>(stage)) ? testutil::SampleNonce() : std::string();
  const Message msg = secagg::ToMessage(sample, 9, "client-3", nonce);
  StatusOr<Message> got = Decode(EncodeToFrames(msg));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::get<SecAggData>(got->body), (SecAggData{static_cast<uint32_t>(stage), nonce}));
  EXPECT_EQ(got->round, 9u);
  StatusOr<std::span<const std::byte>> payload = secagg::PayloadOf(*got);
  ASSERT_TRUE(payload.ok()) << payload.status();
  StatusOr<TypeParam> decoded = secagg::Decode<TypeParam>(*payload);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, sample);
}

TYPED_TEST(SecAggPayloadTest, EveryTruncationIsRefused) {
  const std::string bytes = secagg::Encode(SampleOf<TypeParam>());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<std::byte> prefix = Exact(AsBytes(bytes).first(n));
    ASSERT_TRUE(Refused(secagg::Decode<TypeParam>(prefix), this->what(), "remain"))
        << "the first " << n << " of " << bytes.size() << " bytes";
  }
}

TYPED_TEST(SecAggPayloadTest, TrailingBytesAreRefused) {
  const std::string bytes = secagg::Encode(SampleOf<TypeParam>());
  EXPECT_TRUE(Refused(DecodeString<TypeParam>(bytes + '\0'), this->what(), "1 trailing bytes"));
  EXPECT_TRUE(Refused(DecodeString<TypeParam>(bytes + bytes), this->what(),
                      absl::StrCat(bytes.size(), " trailing bytes")));
}

// ---- Counts and values past their bounds ----

TEST(SecAggPayloadBoundsTest, MemberCountsAreBoundedByTheLargestSession) {
  const uint32_t over = static_cast<uint32_t>(secagg::kMaxMembers) + 1;
  const std::string exceeds = absl::StrCat(" count ", over, " exceeds ", secagg::kMaxMembers);
  for (uint32_t n : {over, std::numeric_limits<uint32_t>::max()}) {
    const std::string count = absl::StrCat(" count ", n, " exceeds ");
    EXPECT_TRUE(
        Refused(DecodeString<secagg::MemberList>(Word(n)), "member list", "members" + count));
    EXPECT_TRUE(Refused(DecodeString<secagg::SeedList>(Word(n)), "seed list", "reveals" + count));
    EXPECT_TRUE(Refused(DecodeString<secagg::UnmaskRequest>(Word(n)), "unmask request",
                        "signatures" + count));
    EXPECT_TRUE(
        Refused(DecodeString<secagg::MaskRequest>(Word(n)), "mask request", "shared" + count));
    EXPECT_TRUE(
        Refused(DecodeString<secagg::Survivors>(Word(n)), "survivor sets", "shared" + count));
    EXPECT_TRUE(Refused(DecodeString<secagg::Survivors>(Word(1) + Word(4) + Word(n)),
                        "survivor sets", "survivors" + count));
  }
  // At the bound the count passes, and the missing entries are what is refused.
  const uint32_t at = static_cast<uint32_t>(secagg::kMaxMembers);
  EXPECT_TRUE(Refused(DecodeString<secagg::MaskRequest>(Word(at)), "mask request",
                      "shared needs 262144 bytes; 0 remain"));
  // A full-size set decodes.
  secagg::MaskRequest all;
  for (uint32_t i = 0; i < at; ++i) all.shared.push_back(i);
  StatusOr<secagg::MaskRequest> got = DecodeString<secagg::MaskRequest>(secagg::Encode(all));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->shared.size(), static_cast<size_t>(secagg::kMaxMembers));
}

// A count within its bound is still checked against the bytes that remain (each entry's fixed
// part) before any entry is made: 4 bytes saying 65536 members must not cost 65536 ListedMembers.
TEST(SecAggPayloadBoundsTest, ACountIsCheckedAgainstWhatRemainsBeforeItsEntriesAreMade) {
  const uint32_t members = static_cast<uint32_t>(secagg::kMaxMembers);
  const uint32_t neighbours = static_cast<uint32_t>(secagg::kMaxNeighbours);
  EXPECT_TRUE(Refused(DecodeString<secagg::MemberList>(Word(members)), "member list",
                      "members needs 15728640 bytes; 0 remain"));
  EXPECT_TRUE(Refused(DecodeString<secagg::SeedList>(Word(members)), "seed list",
                      "reveals needs 6291456 bytes; 0 remain"));
  EXPECT_TRUE(Refused(DecodeString<secagg::UnmaskRequest>(Word(members) + "xyz"), "unmask request",
                      "signatures needs 4456448 bytes; 3 remain"));
  EXPECT_TRUE(Refused(DecodeString<secagg::ShareList>(Word(neighbours)), "share list",
                      "share records needs 168000 bytes; 0 remain"));
  EXPECT_TRUE(Refused(DecodeString<secagg::Verdict>(Word(neighbours)), "verdict",
                      "complaints needs 8000 bytes; 0 remain"));
  EXPECT_TRUE(Refused(DecodeString<secagg::UnmaskResponse>(Word(0) + Word(neighbours)),
                      "unmask response", "revealed shares needs 44000 bytes; 0 remain"));
  // Two members' worth of bytes, less one: the count of two passes, the second entry is short.
  const std::string two = secagg::Encode(secagg::MemberList{
      {testutil::SampleMemberList().members[0], testutil::SampleMemberList().members[2]}});
  EXPECT_TRUE(Refused(DecodeString<secagg::MemberList>(two.substr(0, two.size() - 1)),
                      "member list", "remain"));
}

TEST(SecAggPayloadBoundsTest, NeighbourListsAreBoundedByTheNeighbourLimit) {
  const size_t limit = secagg::kMaxNeighbours;
  const std::string over = absl::StrCat(" count ", limit + 1, " exceeds ", limit);
  // Share records, in a member's message and in the coordinator's list.
  secagg::ShareList list;
  list.shares.assign(limit, testutil::SampleShareRecord(1));
  EXPECT_TRUE(DecodeString<secagg::ShareList>(secagg::Encode(list)).ok());
  list.shares.push_back(testutil::SampleShareRecord(2));
  EXPECT_TRUE(Refused(DecodeString<secagg::ShareList>(secagg::Encode(list)), "share list",
                      "share records" + over));
  secagg::ShareKeys keys{testutil::PatternBytes<32>(0), list.shares};
  EXPECT_TRUE(Refused(DecodeString<secagg::ShareKeys>(secagg::Encode(keys)), "share message",
                      "share records" + over));
  // Complaints.
  secagg::Verdict verdict;
  verdict.complaints.assign(limit, {3, secagg::Complaint::kMissing});
  EXPECT_TRUE(DecodeString<secagg::Verdict>(secagg::Encode(verdict)).ok());
  verdict.complaints.push_back({4, secagg::Complaint::kMissing});
  EXPECT_TRUE(Refused(DecodeString<secagg::Verdict>(secagg::Encode(verdict)), "verdict",
                      "complaints" + over));
  // Revealed shares, of either kind.
  const secagg::RevealedShare share{5, secagg::Share{0, {1, 2, 3, 4, 5}}};
  secagg::UnmaskResponse response;
  response.self_mask_shares.assign(limit, share);
  response.mask_key_shares.assign(limit, share);
  EXPECT_TRUE(DecodeString<secagg::UnmaskResponse>(secagg::Encode(response)).ok());
  response.self_mask_shares.push_back(share);
  EXPECT_TRUE(Refused(DecodeString<secagg::UnmaskResponse>(secagg::Encode(response)),
                      "unmask response", "revealed shares" + over));
  response.self_mask_shares.pop_back();
  response.mask_key_shares.push_back(share);
  EXPECT_TRUE(Refused(DecodeString<secagg::UnmaskResponse>(secagg::Encode(response)),
                      "unmask response", "revealed shares" + over));
}

TEST(SecAggPayloadBoundsTest, ACiphertextIsAtMost256Bytes) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{256}}) {
    secagg::ShareList list{{testutil::SampleShareRecord(1)}};
    list.shares[0].ciphertext.assign(size, 0xcc);
    StatusOr<secagg::ShareList> got = DecodeString<secagg::ShareList>(secagg::Encode(list));
    ASSERT_TRUE(got.ok()) << size << ": " << got.status();
    EXPECT_EQ(*got, list);
  }
  for (size_t size : {size_t{257}, size_t{4096}}) {
    secagg::ShareKeys keys = testutil::SampleShareKeys();
    keys.shares[1].ciphertext.assign(size, 0xcc);
    EXPECT_TRUE(Refused(DecodeString<secagg::ShareKeys>(secagg::Encode(keys)), "share message",
                        absl::StrCat("share ciphertext count ", size, " exceeds 256")));
  }
}

TEST(SecAggPayloadBoundsTest, ClientIdsAreOneTo128SafeCharacters) {
  auto with_id = [](std::string id) {
    secagg::MemberList list = testutil::SampleMemberList();
    list.members[1].certificate.id = std::move(id);
    return secagg::Encode(list);
  };
  for (const std::string& id : {std::string("a"), std::string(128, 'z'), std::string("A.b_c-9")}) {
    StatusOr<secagg::MemberList> got = DecodeString<secagg::MemberList>(with_id(id));
    ASSERT_TRUE(got.ok()) << id << ": " << got.status();
    EXPECT_EQ(got->members[1].certificate.id, id);
  }
  EXPECT_TRUE(Refused(DecodeString<secagg::MemberList>(with_id(std::string(129, 'z'))),
                      "member list", "client id count 129 exceeds 128"));
  EXPECT_TRUE(Refused(DecodeString<secagg::MemberList>(with_id(std::string(1 << 20, 'z'))),
                      "member list", "client id count 1048576 exceeds 128"));
  for (const std::string& id :
       {std::string(), std::string("a b"), std::string("a/b"), std::string("caf\xc3\xa9"),
        std::string("a\0b", 3), std::string("../x\n")}) {
    EXPECT_TRUE(Refused(DecodeString<secagg::MemberList>(with_id(id)), "member list",
                        "a client id is not 1-128 of [A-Za-z0-9._-]"))
        << "'" << id << "'";
  }
}

TEST(SecAggPayloadBoundsTest, AComplaintsReasonIsOneToFour) {
  for (uint32_t reason = 1; reason <= 4; ++reason) {
    StatusOr<secagg::Verdict> got = DecodeString<secagg::Verdict>(Word(1) + Word(7) + Word(reason));
    ASSERT_TRUE(got.ok()) << reason << ": " << got.status();
    EXPECT_EQ(got->complaints[0].reason, static_cast<secagg::Complaint>(reason));
  }
  for (uint32_t reason : {0u, 5u, std::numeric_limits<uint32_t>::max()}) {
    secagg::Verdict verdict = testutil::SampleVerdict();
    verdict.complaints[2].reason = static_cast<secagg::Complaint>(reason);
    EXPECT_TRUE(Refused(DecodeString<secagg::Verdict>(secagg::Encode(verdict)), "verdict",
                        absl::StrCat("complaint reason ", reason)));
  }
}

TEST(SecAggPayloadBoundsTest, EveryShareLimbIsInTheField) {
  for (bool self_mask : {true, false}) {
    for (size_t limb = 0; limb < secagg::kSecretLimbs; ++limb) {
      for (uint64_t bad : {secagg::kFieldPrime, ~uint64_t{0}}) {
        secagg::UnmaskResponse r = testutil::SampleUnmaskResponse();
        (self_mask ? r.self_mask_shares[1] : r.mask_key_shares[0]).share.y[limb] = bad;
        EXPECT_TRUE(Refused(DecodeString<secagg::UnmaskResponse>(secagg::Encode(r)),
                            "unmask response", "revealed share holds a value outside the field"))
            << (self_mask ? "self-mask" : "mask-key") << " limb " << limb << " = " << bad;
      }
    }
  }
  // p - 1 is in the field (the sample holds it).
  EXPECT_TRUE(
      DecodeString<secagg::UnmaskResponse>(secagg::Encode(testutil::SampleUnmaskResponse())).ok());
}

// ---- PayloadOf and the session ----

TEST(SecAggWireTest, PayloadOfTakesOnlyASecAggDatasOneUint8Frame) {
  const std::string error = "a secure-aggregation message carries exactly one uint8 frame";
  for (const Message& other : {testutil::SampleHeartbeat(), testutil::SampleFitResult(),
                               testutil::SampleSecAggMaskedInput()}) {
    EXPECT_TRUE(IsError(secagg::PayloadOf(other), kInvalid, error))
        << MessageTypeName(other.type());
  }
  const Message good = testutil::SampleSecAggData(testutil::SampleVerdict());
  StatusOr<std::span<const std::byte>> payload = secagg::PayloadOf(good);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(payload->data(), good.tensors[0].bytes.data()) << "a view, not a copy";
  // Built by hand, past the codec: no frame, two, another name, another dtype.
  Message none = good;
  none.tensors.clear();
  Message two = good;
  two.tensors.push_back(good.tensors[0]);
  Message renamed = good;
  renamed.tensors[0].spec.name = "weights";
  Message floats = good;
  floats.tensors[0].spec.dtype = DType::kFloat32;
  for (const Message& bad : {none, two, renamed, floats}) {
    EXPECT_TRUE(IsError(secagg::PayloadOf(bad), kInvalid, error));
  }
}

TEST(SecAggWireTest, TheSessionMapsOntoTheWireAndBack) {
  const SecureAggregation a = testutil::SampleSecureAggregation();
  StatusOr<secagg::SessionConfig> config = secagg::SessionFromWire(a);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->edge_threshold, a.edge_threshold);
  EXPECT_EQ(config->min_survivors, a.min_survivors);
  EXPECT_EQ(secagg::SessionToWire(*config, a.index), a);
  SecureAggregation short_id = a;
  short_id.session.pop_back();
  EXPECT_TRUE(IsError(secagg::SessionFromWire(short_id), kInvalid, "a session id of 31 bytes"));
}

}  // namespace
}  // namespace huddle::wire
