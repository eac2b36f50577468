// Gloo collectives among ranks that are threads of this process, on loopback TCP.
#include "datacenter/collective.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <type_traits>

namespace huddle::datacenter {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<transport::KvServer> StartServer() {
  auto server = transport::KvServer::Start("tcp://127.0.0.1:0");
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
}

CollectiveOptions Options(int rank, int world, milliseconds timeout = milliseconds(20000)) {
  CollectiveOptions o;
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  return o;
}

// Runs `body(rank, collective)` on `world` threads, each connected as one rank.
void RunRanks(int world, const std::function<void(int, Collective&)>& body,
              milliseconds timeout = milliseconds(20000)) {
  auto server = StartServer();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto store = transport::OpenKvStore(server->url());
      ASSERT_TRUE(store.ok()) << store.status();
      auto collective = ConnectGloo(**store, Options(r, world, timeout));
      ASSERT_TRUE(collective.ok()) << collective.status();
      EXPECT_EQ((*collective)->rank(), r);
      EXPECT_EQ((*collective)->world_size(), world);
      EXPECT_EQ((*collective)->backend(), "gloo");
      body(r, **collective);
    });
  }
  for (auto& t : threads) t.join();
}

template <typename T>
std::vector<T> RankInput(int rank, size_t n) {
  std::mt19937_64 rng(1000 + rank);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(normal(rng) * std::pow(10.0, rank % 3));
  return v;
}

// With `prepared`, the buffer's all-reduce is prepared once and run three times (refilled before
// each run), as a trainer's gradient buckets are.
template <typename T>
void ExpectAllReduceIsConsistent(int world, size_t n, bool prepared = false) {
  std::vector<std::vector<T>> results(world);
  RunRanks(world, [&](int r, Collective& c) {
    std::vector<T> data = RankInput<T>(r, n);
    {
      if (prepared) {
        auto p = c.PrepareAllReduceSum(std::span<T>(data));
        ASSERT_TRUE(p.ok()) << p.status();
        for (int run = 0; run < 3; ++run) {
          const std::vector<T> fresh = RankInput<T>(r, n);
          std::copy(fresh.begin(), fresh.end(), data.begin());  // into the prepared buffer
          const Status st = (*p)->Run();
          ASSERT_TRUE(st.ok()) << "world " << world << ", n " << n << ", run " << run << ": " << st;
        }
        // Gloo's last notifications of a run may still be in flight to a slower rank: a
        // collective operation before the ranks disconnect (a trainer's final replica check).
        ASSERT_TRUE(c.Barrier().ok());
        results[r] = std::move(data);
        return;
      }
    }
    ASSERT_TRUE(c.AllReduceSum(std::span<T>(data)).ok());
    results[r] = std::move(data);
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(results[r].size(), n) << "rank " << r;
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), n * sizeof(T)), 0)
        << "rank " << r << " has different bits from rank 0 (world " << world << ", n " << n << ")";
  }
  // And it is the sum, to within the rounding of adding `world` terms in some order.
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(RankInput<T>(r, n));
  for (size_t i = 0; i < n; ++i) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < world; ++r) {
      exact += inputs[r][i];
      magnitude += std::abs(static_cast<double>(inputs[r][i]));
    }
    ASSERT_NEAR(results[0][i], exact, magnitude * world * std::numeric_limits<T>::epsilon())
        << "element " << i;
  }
}

TEST(GlooCollective, AllReduceGivesEveryRankTheSameBits) {
  for (int world : {2, 3, 4}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, size_t{300007}}) {
      ExpectAllReduceIsConsistent<float>(world, n);
    }
  }
  ExpectAllReduceIsConsistent<double>(3, 10007);
}

TEST(GlooCollective, PreparedAllReduceGivesEveryRankTheSameBits) {
  for (int world : {1, 2, 3, 4}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, size_t{300007}}) {
      ExpectAllReduceIsConsistent<float>(world, n, /*prepared=*/true);
    }
  }
  // Doubles (batch norm's statistics).
  for (int world : {2, 3, 4}) ExpectAllReduceIsConsistent<double>(world, 512, /*prepared=*/true);
}

// The int64 sum (DP-SGD's exact gradient sum) is the integers' sum modulo 2^64 on every rank, bit
// for bit, plain and prepared: values over the whole range make the partial sums wrap, and the
// result is still the wrapped total (the true total wherever it fits).
TEST(GlooCollective, Int64AllReduceIsTheExactWrappingSum) {
  auto input = [](int rank, size_t n) {
    std::mt19937_64 rng(77 + rank);
    std::vector<int64_t> v(n);
    for (auto& x : v) x = static_cast<int64_t>(rng());
    return v;
  };
  for (int world : {1, 2, 3, 4}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, size_t{300007}}) {
      for (bool prepared : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << "world " << world << ", n " << n << ", prepared " << prepared);
        std::vector<std::vector<int64_t>> results(world);
        RunRanks(world, [&](int r, Collective& c) {
          std::vector<int64_t> data = input(r, n);
          if (prepared) {
            auto p = c.PrepareAllReduceSum(std::span<int64_t>(data));
            ASSERT_TRUE(p.ok()) << p.status();
            for (int run = 0; run < 2; ++run) {
              const std::vector<int64_t> fresh = input(r, n);
              std::copy(fresh.begin(), fresh.end(), data.begin());
              ASSERT_TRUE((*p)->Run().ok());
            }
          } else {
            ASSERT_TRUE(c.AllReduceSum(std::span<int64_t>(data)).ok());
          }
          ASSERT_TRUE(c.Barrier().ok());
          results[r] = std::move(data);
        });
        std::vector<uint64_t> expected(n, 0);
        for (int r = 0; r < world; ++r) {
          const std::vector<int64_t> in = input(r, n);
          for (size_t i = 0; i < n; ++i) expected[i] += static_cast<uint64_t>(in[i]);
        }
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(results[r].size(), n);
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(static_cast<uint64_t>(results[r][i]), expected[i])
                << "rank " << r << " @" << i;
          }
        }
      }
    }
  }
}

TEST(GlooCollective, AllReduceAtWorldSizeOneIsTheIdentity) {
  RunRanks(1, [&](int, Collective& c) {
    std::vector<float> data = RankInput<float>(0, 1000);
    std::vector<float> before = data;
    ASSERT_TRUE(c.AllReduceSum(std::span<float>(data)).ok());
    EXPECT_EQ(data, before);
    ASSERT_TRUE(c.Barrier().ok());
  });
}

TEST(GlooCollective, BroadcastAllGatherAndBarrier) {
  constexpr int kWorld = 4;
  RunRanks(kWorld, [&](int r, Collective& c) {
    std::vector<std::byte> data(1001, std::byte(r));
    ASSERT_TRUE(c.Broadcast(data, 2).ok());
    for (std::byte b : data) ASSERT_EQ(b, std::byte(2)) << "rank " << r;

    std::vector<std::byte> mine(5, std::byte(10 + r));
    std::vector<std::byte> all(5 * kWorld);
    ASSERT_TRUE(c.AllGather(mine, all).ok());
    for (int from = 0; from < kWorld; ++from) {
      for (int i = 0; i < 5; ++i) ASSERT_EQ(all[from * 5 + i], std::byte(10 + from));
    }
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(c.Barrier().ok());

    std::vector<std::byte> wrong(7);
    EXPECT_TRUE(absl::IsInvalidArgument(c.AllGather(mine, wrong)));
    EXPECT_TRUE(absl::IsInvalidArgument(c.Broadcast(data, kWorld)));
    // Refused calls are local: the group still works.
    ASSERT_TRUE(c.Barrier().ok());
  });
}

TEST(GlooCollective, MissingRankIsNamedWithinTheTimeout) {
  auto server = StartServer();
  std::vector<Status> results(2);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // ranks 0 and 1 of 3; rank 2 never comes
    threads.emplace_back([&, r] {
      auto store = transport::OpenKvStore(server->url());
      results[r] = ConnectGloo(**store, Options(r, 3, milliseconds(500))).status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
  for (const Status& s : results) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_NE(s.message().find("rank(s) 2 did not join"), std::string::npos) << s;
  }
}

// One all-reduce of `data` on c (prepared beforehand when `prepared`), timed into *took_ms.
Status TimedAllReduce(Collective& c, std::vector<float>& data, milliseconds::rep* took_ms,
                      PreparedAllReduce* prepared = nullptr) {
  auto start = std::chrono::steady_clock::now();
  Status s = prepared != nullptr ? prepared->Run() : c.AllReduceSum(std::span<float>(data));
  *took_ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start).count();
  return s;
}

TEST(GlooCollective, DeadPeerEndsTheOthersOperationsWithAnError) {
  Status survivor;
  milliseconds::rep took_ms = 0;
  RunRanks(
      2,
      [&](int r, Collective& c) {
        std::vector<float> data(100000, 1.0f);
        ASSERT_TRUE(c.AllReduceSum(std::span<float>(data)).ok());
        // Rank 1 dies: its collective (and connections) go away without another operation.
        if (r == 1) return;
        survivor = TimedAllReduce(c, data, &took_ms);  // rank 1 is gone by now
        // Broken stays broken.
        EXPECT_EQ(c.Barrier().code(), survivor.code());
      },
      milliseconds(10000));
  EXPECT_FALSE(survivor.ok());
  EXPECT_NE(survivor.message().find("rank 0 of 2"), std::string::npos) << survivor;
  EXPECT_LT(took_ms, 10000) << survivor;
}

TEST(GlooCollective, HungPeerEndsTheOthersOperationsAtTheTimeout) {
  Status survivor;
  std::atomic<bool> done{false};
  milliseconds::rep took_ms = 0;
  RunRanks(
      2,
      [&](int r, Collective& c) {
        if (r == 1) {
          while (!done) std::this_thread::sleep_for(milliseconds(10));  // hangs: never reduces
          return;
        }
        std::vector<float> data(1000, 1.0f);
        survivor = TimedAllReduce(c, data, &took_ms);
        done = true;
      },
      milliseconds(3000));
  EXPECT_TRUE(absl::IsDeadlineExceeded(survivor)) << survivor;
  EXPECT_GE(took_ms, 2900);
  EXPECT_LT(took_ms, 8000);
}

TEST(GlooCollective, PreparedAllReduceEndsAtTheTimeoutOrWhenAPeerDies) {
  for (bool dies : {true, false}) {
    SCOPED_TRACE(dies ? "dead peer" : "hung peer");
    Status survivor;
    std::atomic<bool> done{false};
    milliseconds::rep took_ms = 0;
    RunRanks(
        2,
        [&](int r, Collective& c) {
          std::vector<float> data(100000, 1.0f);
          auto prepared = c.PrepareAllReduceSum(std::span<float>(data));
          ASSERT_TRUE(prepared.ok()) << prepared.status();
          ASSERT_TRUE((*prepared)->Run().ok());
          if (r == 1) {
            while (!dies && !done) std::this_thread::sleep_for(milliseconds(10));
            return;  // dies: its collective and connections go away
          }
          survivor = TimedAllReduce(c, data, &took_ms, prepared->get());
          done = true;
          EXPECT_EQ((*prepared)->Run().code(), survivor.code());  // broken stays broken
        },
        milliseconds(3000));
    EXPECT_FALSE(survivor.ok());
    EXPECT_NE(survivor.message().find("rank 0 of 2"), std::string::npos) << survivor;
    if (!dies) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(survivor)) << survivor;
      EXPECT_GE(took_ms, 2900);
    }
    EXPECT_LT(took_ms, 8000) << survivor;
  }
}

TEST(Collective, RefusesBadOptions) {
  auto server = StartServer();
  auto store = transport::OpenKvStore(server->url());
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectGloo(**store, Options(2, 2)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectGloo(**store, Options(-1, 2)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectGloo(**store, Options(0, 0)).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(ConnectGloo(**store, Options(0, 1, milliseconds(0))).status()));
}

}  // namespace
}  // namespace huddle::datacenter
