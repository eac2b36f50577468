// Upload slots (coordinator/upload_slots.h): order, the limit, allowances granted and withdrawn
// with the slot, and grants held too long.
#include "coordinator/upload_slots.h"

#include <gtest/gtest.h>

#include <map>

#include "tests/coordinator/fake_federation.h"

namespace huddle::coordinator {
namespace {

// Records the allowance each connection was last given.
class AllowanceRecorder final : public transport::ServerTransport {
 public:
  Status Send(const transport::PeerId&, const wire::Message&) override { return absl::OkStatus(); }
  StatusOr<std::optional<transport::Inbound>> Receive(int64_t) override {
    return std::optional<transport::Inbound>();
  }
  uint64_t bytes_in() const override { return 0; }
  uint64_t bytes_out() const override { return 0; }
  void SetUploadAllowance(const transport::PeerId& peer, size_t bytes) override {
    allowance[peer] = bytes;
  }
  std::map<transport::PeerId, size_t> allowance;
};

TEST(UploadSlotsTest, MembersAreGrantedInRequestOrderUpToTheLimit) {
  testing::ManualClock clock;
  AllowanceRecorder transport;
  UploadSlots slots(&transport, &clock, 2, 1000);
  for (const char* id : {"c", "a", "b"}) slots.Enqueue(id);
  EXPECT_EQ(slots.NextWaiting(), "c");
  slots.Hold("c", "peer-c", 100);
  EXPECT_EQ(slots.NextWaiting(), "a");
  slots.Hold("a", "peer-a", 100);
  EXPECT_EQ(slots.NextWaiting(), std::nullopt) << "both slots are held";
  EXPECT_EQ(slots.held(), 2);
  EXPECT_EQ(transport.allowance["peer-c"], 100u);

  EXPECT_TRUE(slots.Release("c"));
  EXPECT_EQ(transport.allowance["peer-c"], 0u) << "the allowance goes with the slot";
  EXPECT_FALSE(slots.Release("c"));
  EXPECT_EQ(slots.NextWaiting(), "b");
}

TEST(UploadSlotsTest, AReleasedMemberLeavesTheQueueAndResetWithdrawsEveryAllowance) {
  testing::ManualClock clock;
  AllowanceRecorder transport;
  UploadSlots slots(&transport, &clock, 1, 1000);
  slots.Enqueue("a");
  slots.Enqueue("b");
  EXPECT_FALSE(slots.Release("a")) << "it waited, it held nothing";
  EXPECT_EQ(slots.NextWaiting(), "b");
  slots.Hold("b", "peer-b", 64);
  slots.Enqueue("c");
  slots.Reset();
  EXPECT_EQ(transport.allowance["peer-b"], 0u);
  EXPECT_EQ(slots.held(), 0);
  EXPECT_EQ(slots.NextWaiting(), std::nullopt) << "the queue is empty after Reset";
}

TEST(UploadSlotsTest, GrantsHeldPastTheTimeoutAreStale) {
  testing::ManualClock clock;
  AllowanceRecorder transport;
  UploadSlots slots(&transport, &clock, 4, 1000);
  slots.Hold("a", "peer-a", 1);
  clock.Advance(600);
  slots.Hold("b", "peer-b", 1);
  clock.Advance(600);
  EXPECT_EQ(slots.Stale(), std::vector<std::string>{"a"});
  clock.Advance(600);
  EXPECT_EQ(slots.Stale(), (std::vector<std::string>{"a", "b"}));
}

TEST(UploadSlotsTest, AHeldSlotKnowsWhenItWasGranted) {
  testing::ManualClock clock;
  AllowanceRecorder transport;
  UploadSlots slots(&transport, &clock, 1, 1000);
  const int64_t granted = clock.NowMs();
  slots.Enqueue("a");
  slots.Enqueue("b");
  ASSERT_EQ(slots.NextWaiting(), "a");
  slots.Hold("a", "peer-a", 1);
  clock.Advance(300);
  EXPECT_EQ(slots.HeldSinceMs("a"), granted);
  EXPECT_EQ(slots.HeldSinceMs("b"), std::nullopt) << "waiting is not holding";
  slots.Release("a");
  EXPECT_EQ(slots.HeldSinceMs("a"), std::nullopt);
}

}  // namespace
}  // namespace huddle::coordinator
