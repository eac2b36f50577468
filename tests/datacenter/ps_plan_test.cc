// The parameter-server mode's parts without sockets: shards, the dispatcher (task queue, SSP gate,
// backup workers' steps, re-queue on death), a shard's optimizer step, and the message codec.
#include "datacenter/ps_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "datacenter/ps_shard.h"
#include "datacenter/ps_wire.h"

namespace huddle::datacenter {
namespace {

using Kind = Task::Kind;

DispatcherOptions Async(int64_t workers, int64_t batches, std::optional<int64_t> bound = {}) {
  DispatcherOptions o;
  o.workers = workers;
  o.batches_per_epoch = batches;
  o.epochs = 2;
  o.staleness_bound = bound;
  o.timeout_ms = 1000;
  return o;
}

DispatcherOptions Sync(int64_t workers, int64_t backups, int64_t batches) {
  DispatcherOptions o = Async(workers, batches);
  o.async = false;
  o.backup_workers = backups;
  return o;
}

// Runs task t for worker w: done at once.
bool RunAndReport(Dispatcher& d, int64_t w, int64_t now) {
  const Task t = d.Next(w, now);
  if (t.kind != Kind::kRun) return false;
  return d.Done(w, t.epoch, t.batch, t.version, now);
}

TEST(PsPlan, ShardsAreContiguousBalancedAndCoverTheVector) {
  for (int64_t total : {1, 7, 100, 101, 109386}) {
    for (int servers : {1, 2, 3, 7}) {
      if (servers > total) continue;
      const auto shards = PlanShards(total, servers);
      ASSERT_EQ(shards.size(), static_cast<size_t>(servers));
      int64_t next = 0, lo = total, hi = 0;
      for (const ShardRange& s : shards) {
        EXPECT_EQ(s.begin, next);
        next += s.count;
        lo = std::min(lo, s.count);
        hi = std::max(hi, s.count);
      }
      EXPECT_EQ(next, total);
      EXPECT_LE(hi - lo, 1) << total << " over " << servers;
    }
  }
}

TEST(PsPlan, RefusesImpossibleOptionsNamingThem) {
  auto backups = Dispatcher::Create(Sync(2, 2, 10), 0);
  ASSERT_FALSE(backups.ok());
  EXPECT_NE(backups.status().message().find("backup_workers is 2 with 2 workers"),
            std::string::npos);
  EXPECT_FALSE(Dispatcher::Create(Async(0, 10), 0).ok());
  DispatcherOptions async_backup = Async(3, 10);
  async_backup.backup_workers = 1;
  EXPECT_FALSE(Dispatcher::Create(async_backup, 0).ok());
}

TEST(PsPlan, AsyncHandsOutEveryBatchOnceAndEndsTheEpochAtTheBarrier) {
  auto d = Dispatcher::Create(Async(2, 5), 0);
  ASSERT_TRUE(d.ok());
  std::vector<int64_t> seen;
  Task a = d->Next(0, 0), b = d->Next(1, 0);
  seen = {a.batch, b.batch};
  ASSERT_TRUE(d->Done(0, a.epoch, a.batch, 0, 1));
  for (int i = 0; i < 3; ++i) {
    const Task t = d->Next(0, 1);
    ASSERT_EQ(t.kind, Kind::kRun);
    seen.push_back(t.batch);
    ASSERT_TRUE(d->Done(0, t.epoch, t.batch, 0, 1));
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // Every batch handed out, one still running: the barrier holds the next epoch.
  EXPECT_EQ(d->Next(0, 2).kind, Kind::kWait);
  EXPECT_FALSE(d->epoch_complete());
  ASSERT_TRUE(d->Done(1, b.epoch, b.batch, 0, 2));
  EXPECT_TRUE(d->epoch_complete());
  EXPECT_FALSE(d->Done(1, b.epoch, b.batch, 0, 2)) << "a batch counts once";
  d->AdvanceEpoch();
  EXPECT_EQ(d->epoch(), 1);
  EXPECT_FALSE(d->epoch_complete());
  while (RunAndReport(*d, 0, 3)) {
  }
  d->AdvanceEpoch();
  EXPECT_TRUE(d->finished());
  EXPECT_EQ(d->Next(1, 4).kind, Kind::kFinished);
}

TEST(PsPlan, SspGateHoldsAWorkerMoreThanTheBoundAheadOfTheSlowest) {
  auto d = Dispatcher::Create(Async(2, 100, /*bound=*/1), 0);
  ASSERT_TRUE(d.ok());
  const Task slow = d->Next(1, 0);  // worker 1 holds a batch and is slow
  ASSERT_EQ(slow.kind, Kind::kRun);
  // Worker 0 completes steps 1 and 2 (clock 0 and 1 <= 0 + 1 when they start) ...
  EXPECT_TRUE(RunAndReport(*d, 0, 10));
  EXPECT_TRUE(RunAndReport(*d, 0, 20));
  EXPECT_EQ(d->clock(0), 2);
  // ... and may not start a third: 2 > 0 + 1.
  const Task held = d->Next(0, 30);
  EXPECT_EQ(held.kind, Kind::kWait);
  EXPECT_TRUE(held.gated);
  EXPECT_EQ(d->Next(0, 40).kind, Kind::kWait);
  EXPECT_EQ(d->ssp_waits(), 1) << "one wait, however often it asks";
  // The slow worker finishes: its clock 1, so worker 0 (clock 2 <= 1 + 1) goes on.
  ASSERT_TRUE(d->Done(1, slow.epoch, slow.batch, 0, 130));
  EXPECT_EQ(d->Next(0, 130).kind, Kind::kRun);
  EXPECT_NEAR(d->ssp_wait_seconds(), 0.1, 1e-9);
  // Bound 0 is lockstep: no worker starts a step while another has completed fewer.
  auto lock = Dispatcher::Create(Async(2, 100, 0), 0);
  EXPECT_TRUE(RunAndReport(*lock, 0, 0));
  EXPECT_TRUE(lock->Next(0, 0).gated);
  EXPECT_EQ(lock->Next(1, 0).kind, Kind::kRun);
}

TEST(PsPlan, ADeadWorkersBatchesAreRequeuedAndItsClockNoLongerHoldsTheGate) {
  auto d = Dispatcher::Create(Async(3, 6, /*bound=*/0), 0);
  ASSERT_TRUE(d.ok());
  const Task lost = d->Next(2, 0);  // worker 2 takes batch 0 and dies
  ASSERT_EQ(lost.batch, 0);
  EXPECT_TRUE(RunAndReport(*d, 0, 500));
  EXPECT_TRUE(RunAndReport(*d, 1, 900));
  EXPECT_TRUE(d->Next(0, 900).gated) << "held by worker 2's clock 0";
  EXPECT_TRUE(d->CheckLiveness(1000).empty()) << "silent for exactly the timeout: still alive";
  d->Heard(0, 1001);
  d->Heard(1, 1001);
  EXPECT_EQ(d->CheckLiveness(1001), std::vector<int64_t>{2});
  EXPECT_EQ(d->dead(), std::vector<int64_t>{2});
  EXPECT_EQ(d->requeued(), 1);
  EXPECT_EQ(d->live_workers(), 2);
  // Its batch is first in line for the others, and the gate ignores it now.
  const Task again = d->Next(0, 1001);
  ASSERT_EQ(again.kind, Kind::kRun);
  EXPECT_EQ(again.batch, 0);
  EXPECT_EQ(d->Next(2, 1001).kind, Kind::kExcluded);
  EXPECT_FALSE(d->Done(2, lost.epoch, lost.batch, 0, 1001)) << "the dead one's late report";
  EXPECT_TRUE(d->Done(0, again.epoch, again.batch, 0, 1001));
  while (RunAndReport(*d, 1, 1002) || RunAndReport(*d, 0, 1002)) {
  }
  EXPECT_TRUE(d->epoch_complete());
}

TEST(PsPlan, SyncStepTakesTheFirstNOfNPlusBackupsAndDropsTheLateOne) {
  // 3 workers, 1 backup: steps of 3 batches, need 2. 7 batches: steps {0,1,2}, {3,4,5}, {6}.
  auto d = Dispatcher::Create(Sync(3, 1, 7), 0);
  ASSERT_TRUE(d.ok());
  const Task t0 = d->Next(0, 0), t1 = d->Next(1, 0), t2 = d->Next(2, 0);
  EXPECT_EQ(t0.version, 0);
  EXPECT_EQ(t0.need, 2);
  EXPECT_EQ(t2.batch, 2);
  EXPECT_EQ(d->Next(0, 0).kind, Kind::kWait) << "one batch each per step";
  EXPECT_TRUE(d->Done(2, t2.epoch, t2.batch, t2.version, 1));
  EXPECT_EQ(d->version(), 0);
  EXPECT_TRUE(d->Done(0, t0.epoch, t0.batch, t0.version, 2));
  EXPECT_EQ(d->version(), 1) << "two of three close the step";
  EXPECT_FALSE(d->Done(1, t1.epoch, t1.batch, t1.version, 3)) << "the backup's, late";
  const Task s = d->Next(1, 3);
  EXPECT_EQ(s.batch, 3);
  EXPECT_EQ(s.version, 1);
  EXPECT_TRUE(d->Done(1, s.epoch, s.batch, s.version, 3));
  EXPECT_TRUE(RunAndReport(*d, 0, 3));
  EXPECT_EQ(d->version(), 2);
  const Task last = d->Next(2, 4);
  EXPECT_EQ(last.batch, 6);
  EXPECT_EQ(last.need, 1) << "the epoch's tail step takes what it has";
  EXPECT_TRUE(d->Done(2, last.epoch, last.batch, last.version, 4));
  EXPECT_TRUE(d->epoch_complete());
}

TEST(PsPlan, SyncStepOfADeadWorkerIsRunByAnother) {
  auto d = Dispatcher::Create(Sync(2, 0, 4), 0);
  const Task a = d->Next(0, 0), b = d->Next(1, 0);
  ASSERT_TRUE(d->Done(0, a.epoch, a.batch, a.version, 10));
  d->Heard(0, 1500);
  EXPECT_EQ(d->CheckLiveness(1500), std::vector<int64_t>{1});
  const Task redo = d->Next(0, 1500);
  EXPECT_EQ(redo.batch, b.batch);
  EXPECT_EQ(redo.version, 0);
  EXPECT_TRUE(d->Done(0, redo.epoch, redo.batch, redo.version, 1500));
  EXPECT_EQ(d->version(), 1);
}

TEST(PsShard, AsyncAppliesEachGradientWithItsStaleness) {
  const kernels::SgdHyper hyper{0.5f, 0.0f, 0.0f};
  Shard s({10, 2}, {1.0f, 2.0f}, {}, 0, hyper, /*async=*/true);
  auto a = s.Push(0, 4, 0, std::vector<float>{1.0f, 1.0f});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->accepted);
  EXPECT_EQ(a->staleness, 0);
  auto b = s.Push(0, 4, 0, std::vector<float>{2.0f, 0.0f});  // pulled before a
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->staleness, 1);
  EXPECT_EQ(s.version(), 2);
  EXPECT_EQ(s.params(), (std::vector<float>{-0.5f, 1.5f}));
  // Bad gradients are refused, the shard unchanged.
  EXPECT_FALSE(s.Push(0, 4, 0, std::vector<float>{1.0f}).ok());
  EXPECT_FALSE(s.Push(3, 4, 0, std::vector<float>{1.0f, 1.0f}).ok()) << "from the future";
  EXPECT_FALSE(s.Push(2, 4, 0, std::vector<float>{NAN, 1.0f}).ok());
  EXPECT_FALSE(s.Push(2, 0, 0, std::vector<float>{1.0f, 1.0f}).ok());
  EXPECT_EQ(s.version(), 2);
}

TEST(PsShard, SyncTakesTheRowWeightedMeanOfTheFirstNeedAndDropsLateOnes) {
  const kernels::SgdHyper hyper{1.0f, 0.9f, 0.0f};
  Shard s({0, 1}, {0.0f}, {}, 5, hyper, /*async=*/false);
  ASSERT_EQ(s.velocity(), std::vector<float>{0.0f});
  auto a = s.Push(5, 3, 2, std::vector<float>{1.0f});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->accepted);
  EXPECT_EQ(a->version, 5) << "waits for the second";
  auto b = s.Push(5, 1, 2, std::vector<float>{5.0f});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->version, 6);
  // (3 * 1 + 1 * 5) / 4 = 2: velocity 2, param -2.
  EXPECT_EQ(s.params(), std::vector<float>{-2.0f});
  EXPECT_EQ(s.velocity(), std::vector<float>{2.0f});
  auto late = s.Push(5, 3, 2, std::vector<float>{100.0f});
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->accepted);
  EXPECT_EQ(late->staleness, 1);
  EXPECT_EQ(s.dropped(), 1);
  EXPECT_EQ(s.params(), std::vector<float>{-2.0f});
  ASSERT_TRUE(s.Push(6, 1, 2, std::vector<float>{1.0f}).ok());
  EXPECT_FALSE(s.Push(6, 1, 3, std::vector<float>{1.0f}).ok()) << "need changed within a step";
}

TEST(PsWire, RoundTripsAndRefusesMalformedFrames) {
  Msg m;
  m.type = MsgType::kPush;
  m.flags = 1;
  m.worker = 3;
  m.seq = 99;
  m.epoch = 2;
  m.batch = 17;
  m.version = 1234;
  m.need = 2;
  m.rows = 8;
  m.staleness = 4;
  m.correct = 6;
  m.dropped = 1;
  m.loss_sum = 1.25;
  m.values = {1.0f, -2.5f, 3.0f};
  const std::string frame = EncodeMsg(m, 42);
  auto back = DecodeMsg(frame, 42, 3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->type, MsgType::kPush);
  EXPECT_EQ(back->flags, 1);
  EXPECT_EQ(back->worker, 3);
  EXPECT_EQ(back->seq, 99);
  EXPECT_EQ(back->batch, 17);
  EXPECT_EQ(back->version, 1234);
  EXPECT_EQ(back->dropped, 1);
  EXPECT_EQ(back->loss_sum, 1.25);
  EXPECT_EQ(back->values, m.values);
  Msg err;
  err.type = MsgType::kError;
  err.text = "no";
  EXPECT_EQ(DecodeMsg(EncodeMsg(err, 42), 42, 0)->text, "no");

  const auto refused = [](const std::string& f, int64_t max_values, const char* what) {
    auto got = DecodeMsg(f, 42, max_values);
    ASSERT_FALSE(got.ok()) << what;
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << what;
  };
  refused(frame.substr(0, 100), 3, "short header");
  refused(frame.substr(0, frame.size() - 1), 3, "truncated payload");
  refused(frame + "x", 3, "trailing byte");
  refused(frame, 2, "more values than allowed");
  EXPECT_FALSE(DecodeMsg(frame, 43, 3).ok()) << "another job's tag";
  std::string bad_magic = frame;
  bad_magic[0] = 'X';
  refused(bad_magic, 3, "magic");
  std::string bad_type = frame;
  bad_type[4] = 99;
  refused(bad_type, 3, "type");
  Msg pull;
  pull.type = MsgType::kPull;
  std::string with_payload = EncodeMsg(pull, 42);
  with_payload[104] = 4;  // announces 4 payload bytes
  refused(with_payload + "abcd", 3, "payload on a pull");
}

}  // namespace
}  // namespace huddle::datacenter
