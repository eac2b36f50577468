// The datacenter mode's figures, as ratios measured in the same run (ranks are threads of this
// process on loopback TCP, Gloo):
//
//   in-step / bare   the all-reduce bandwidth inside TrainDataParallel's steps (gradient bytes over
//                    the time spent in AllReduceSum on the communication thread) over a bare Gloo
//                    all-reduce of the same bytes, 2 ranks (target >= 0.9);
//   ws1 overhead     steps/s of TrainDataParallel at world size 1 (collective, bucket thread,
//                    checksum at the end) over TrainModel's on the same data (target >= 0.95, i.e.
//                    overhead <= 5%).
// Model 784-256-10, batch 64 per rank, momentum 0.9, synthetic data.
//
//   build/bench/datacenter_bench [--benchmark_repetitions=5]
#include <atomic>
#include <numeric>
#include <thread>

#include "bench/ratio_reporter.h"
#include "common/rng.h"
#include "datacenter/collective.h"
#include "datacenter/data_parallel.h"
#include "models/model.h"

namespace huddle {
namespace {

const models::MlpSpec kSpec{784, {256}, 10};
constexpr int64_t kBatch = 64;
constexpr int64_t kSteps = 200;  // per training run

const data::Dataset& Data() {
  static const data::Dataset* data = [] {
    auto* d = new data::Dataset;
    d->feature_dim = 784;
    d->num_classes = 10;
    Rng rng(4);
    for (int64_t i = 0; i < kBatch * 2 * kSteps; ++i) {
      d->labels.push_back(static_cast<int32_t>(i % 10));
      for (int64_t j = 0; j < 784; ++j) d->features.push_back(static_cast<float>(rng.Uniform()));
    }
    return d;
  }();
  return *data;
}

datacenter::DataParallelOptions TrainOptions() {
  datacenter::DataParallelOptions o;
  o.train.batch_size = kBatch;
  o.train.learning_rate = 0.05;
  o.train.momentum = 0.9;
  o.seed = 1;
  return o;
}

// Connects `world` ranks; calls body(rank, collective) on each (rank 0 on this thread).
template <typename F>
bool WithRanks(int world, F&& body) {
  auto server = transport::KvServer::Start("tcp://127.0.0.1:0");
  if (!server.ok()) return false;
  std::atomic<bool> ok{true};
  auto run = [&](int rank) {
    auto store = transport::OpenKvStore((*server)->url());
    datacenter::CollectiveOptions co;
    co.rank = rank;
    co.world_size = world;
    auto c = store.ok() ? datacenter::ConnectGloo(**store, co)
                        : StatusOr<std::unique_ptr<datacenter::Collective>>(store.status());
    if (!c.ok()) {
      ok = false;
      return;
    }
    if (!body(rank, **c)) ok = false;
  };
  std::vector<std::thread> others;
  for (int r = 1; r < world; ++r) others.emplace_back(run, r);
  run(0);
  for (auto& t : others) t.join();
  return ok;
}

// Gradient bytes a step reduces (the packed layout, gaps included): from one step at world 1.
int64_t StepBytes() {
  static const int64_t bytes = [] {
    int64_t b = 0;
    WithRanks(1, [&](int, datacenter::Collective& c) {
      TensorList params = models::InitModel(kSpec, 5);
      datacenter::DataParallelOptions o = TrainOptions();
      std::vector<int64_t> rows(kBatch);
      std::iota(rows.begin(), rows.end(), 0);
      auto stats = datacenter::TrainDataParallel(c, kSpec, o, {&Data(), rows}, &params);
      if (stats.ok()) b = stats->bytes_reduced / stats->steps;
      return stats.ok();
    });
    return b;
  }();
  return bytes;
}

// Bare: all-reduces of one step's gradient bytes, 2 ranks, prepared once as the trainer's
// buckets are (the same Gloo algorithm, nothing else running).
void BM_AllReduce_Bare(benchmark::State& state) {
  const auto n = static_cast<size_t>(StepBytes() / 4);
  const int64_t iterations = state.max_iterations;
  bool ok = WithRanks(2, [&](int rank, datacenter::Collective& c) {
    std::vector<float> grad(n, 1.0f);
    auto prepared = c.PrepareAllReduceSum(std::span<float>(grad));
    if (!prepared.ok()) return false;
    if (rank != 0) {
      for (int64_t i = 0; i < iterations; ++i) {
        if (!(*prepared)->Run().ok()) return false;
      }
    } else {
      for (auto _ : state) {
        if (!(*prepared)->Run().ok()) return false;
      }
    }
    return c.Barrier().ok();  // the last run's notifications, before disconnecting
  });
  if (!ok) state.SkipWithError("all-reduce failed");
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * 4));
}

// In-step: the bandwidth of the all-reduces inside kSteps training steps, 2 ranks connected once.
void BM_AllReduce_InStep(benchmark::State& state) {
  double bytes = 0, seconds = 0;
  const int64_t iterations = state.max_iterations;
  bool ok = WithRanks(2, [&](int rank, datacenter::Collective& c) {
    auto train = [&] {
      TensorList params = models::InitModel(kSpec, 5);
      auto stats = datacenter::TrainDataParallel(c, kSpec, TrainOptions(), {&Data(), {}}, &params);
      if (stats.ok() && rank == 0) {
        bytes += static_cast<double>(stats->bytes_reduced);
        seconds += stats->reduce_seconds;
      }
      return stats.ok();
    };
    if (rank != 0) {
      for (int64_t i = 0; i < iterations; ++i) {
        if (!train()) return false;
      }
      return true;
    }
    for (auto _ : state) {
      if (!train()) return false;
    }
    return true;
  });
  if (!ok) state.SkipWithError("training failed");
  state.counters["bytes_per_second"] = benchmark::Counter(bytes / seconds);
}

// World size 1: TrainDataParallel (collective connected once, outside the timing) vs TrainModel,
// kSteps steps of batch kBatch each.
void BM_Step_WorldSize1Collective(benchmark::State& state) {
  std::vector<int64_t> rows(static_cast<size_t>(kBatch * kSteps));
  std::iota(rows.begin(), rows.end(), 0);
  bool ok = WithRanks(1, [&](int, datacenter::Collective& c) {
    for (auto _ : state) {
      TensorList params = models::InitModel(kSpec, 5);
      if (!datacenter::TrainDataParallel(c, kSpec, TrainOptions(), {&Data(), rows}, &params).ok()) {
        return false;
      }
    }
    return true;
  });
  if (!ok) state.SkipWithError("training failed");
  state.counters["steps_per_second"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kSteps), benchmark::Counter::kIsRate);
}

void BM_Step_WorldSize1None(benchmark::State& state) {
  std::vector<int64_t> rows(static_cast<size_t>(kBatch * kSteps));
  std::iota(rows.begin(), rows.end(), 0);
  for (auto _ : state) {
    TensorList params = models::InitModel(kSpec, 5);
    if (!models::TrainModel(kSpec, TrainOptions().train, {&Data(), rows}, 1, &params).ok()) {
      state.SkipWithError("training failed");
    }
  }
  state.counters["steps_per_second"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kSteps), benchmark::Counter::kIsRate);
}

BENCHMARK(BM_AllReduce_Bare)->Iterations(2000)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_AllReduce_InStep)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Step_WorldSize1Collective)
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Step_WorldSize1None)->Iterations(10)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace huddle

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // Groups "BM_AllReduce" (InStep over Bare, bytes/s) and "BM_Step" (WorldSize1Collective over
  // WorldSize1None, steps/s): the first-named variant of each is the measured one.
  huddle::bench::RatioReporter reporter(
      [](const benchmark::BenchmarkReporter::Run& run) {
        std::string name = run.benchmark_name();
        name = name.substr(0, name.find('/'));
        const size_t cut = name.rfind('_');
        const std::string variant = name.substr(cut + 1);
        const bool measured = variant == "InStep" || variant == "WorldSize1Collective";
        return std::pair{name.substr(0, cut), std::string(measured ? "measured" : "baseline")};
      },
      "measured", "baseline", "measured / baseline", {"bytes_per_second", "steps_per_second"});
  benchmark::RunSpecifiedBenchmarks(&reporter);
  return 0;
}
