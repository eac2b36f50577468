// Streaming aggregation throughput, as a fraction of memcpy bandwidth measured in the same run.
//
// For each model size (1M and 10M float parameters) a pool of update buffers is folded
// round-robin: 8 buffers by default (32 MB at 1M parameters, which on a machine with a large last-
// level cache stays in it), or as many as fill --pool_mib=N MiB (e.g. 1024, so that inputs stream
// from DRAM like real arrivals rather than from cache). Every benchmark reports bytes of update
// input per second; memcpy copies the same bytes into a reused destination. After the run, main
// prints per size `aggregation/memcpy ratio` (target >= 0.8) and `int64 path/memcpy ratio`.
//
// Two folds, because a fold's terms take one of two paths (aggregation/streaming_aggregator.h):
//   BM_Fold      FedAvg's weights and values (weight 100, values ~0.01, 17 fraction bits): terms
//                near 2^19 go to the int32 partial sums; per parameter the fold moves 12 bytes
//                (the float read, the int32 read and written back), as memcpy does (read, the
//                destination line's read-for-ownership, write).
//   BM_FoldWide  client-level DP's (weight 1, max_abs_value 1, so 51 fraction bits): terms near
//                2^44 go to the int64 sums, 20 bytes per parameter, so about 0.6 of memcpy is its
//                ceiling when bandwidth is the limit.
// BM_TrafficFloor and BM_TrafficFloorWide measure those two ceilings on this machine: the same
// traffic (acc[i] += bits(x[i]) into int32 or int64) with no rounding or bound check.
//
//   build/bench/aggregation_bench [--pool_mib=1024] [--benchmark_repetitions=5 ...]
#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "aggregation/streaming_aggregator.h"
#include "bench/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "common/rng.h"

namespace huddle::aggregation {
namespace {

size_t pool_mib = 0;  // --pool_mib

// The update buffers of n floats each (see the top), filled (and so faulted in) once per size.
const std::vector<std::vector<float>>& UpdatePool(size_t n) {
  static std::map<size_t, std::vector<std::vector<float>>> pools;
  auto& pool = pools[n];
  if (pool.empty()) {
    Rng rng(n);
    const size_t size = std::max<size_t>(8, (pool_mib << 20) / (n * sizeof(float)));
    for (size_t k = 0; k < size; ++k) {
      std::vector<float> v(n);
      for (float& x : v) x = static_cast<float>(0.01 * rng.Normal());
      pool.push_back(std::move(v));
    }
  }
  return pool;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto& pool = UpdatePool(n);
  std::vector<float> dst(n);
  size_t k = 0;
  for (auto _ : state) {
    std::memcpy(dst.data(), pool[k].data(), n * sizeof(float));
    benchmark::ClobberMemory();
    k = (k + 1) % pool.size();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * sizeof(float)));
}

// Folds the pool round-robin at `weight` into an aggregator made with `options`.
void FoldPool(benchmark::State& state, AggregatorOptions options, int64_t weight) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto& pool = UpdatePool(n);
  auto created =
      StreamingAggregator::Create({{"w", DType::kFloat32, {static_cast<int64_t>(n)}}}, options);
  if (!created.ok()) {
    state.SkipWithError(created.status().ToString().c_str());
    return;
  }
  StreamingAggregator agg = std::move(created).value();
  std::vector<std::vector<std::span<const float>>> updates;
  for (const auto& u : pool) updates.push_back({u});
  size_t k = 0;
  for (auto _ : state) {
    Status st = agg.Fold(updates[k], weight);
    if (st.code() == absl::StatusCode::kResourceExhausted) {  // capacity: start a new sum
      agg.Reset();
      st = agg.Fold(updates[k], weight);
    }
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
    benchmark::ClobberMemory();
    k = (k + 1) % pool.size();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * sizeof(float)));
}

void BM_Fold(benchmark::State& state) { FoldPool(state, {}, 100); }

void BM_FoldWide(benchmark::State& state) {
  FoldPool(state, {.max_weight = 1, .max_abs_value = 1.0}, 1);
}

// The folds' memory traffic without their arithmetic (see the top): one pass that reads the update
// and adds its bit patterns into int32 or int64 accumulators, vectorised as the fold is (fixed trip
// counts, the same clones; n is a multiple of 512 here).
template <typename Acc>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), noinline)) void AddBits(
    const float* x, size_t n, Acc* acc) {
  constexpr size_t kBlock = 512;
  for (size_t b = 0; b + kBlock <= n; b += kBlock) {
    for (size_t i = 0; i < kBlock; ++i) acc[b + i] += std::bit_cast<uint32_t>(x[b + i]);
  }
}

template <typename Acc>
void TrafficFloor(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto& pool = UpdatePool(n);
  std::vector<Acc> acc(n);
  size_t k = 0;
  for (auto _ : state) {
    AddBits(pool[k].data(), n, acc.data());
    benchmark::ClobberMemory();
    k = (k + 1) % pool.size();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * sizeof(float)));
}

void BM_TrafficFloor(benchmark::State& state) { TrafficFloor<uint32_t>(state); }
void BM_TrafficFloorWide(benchmark::State& state) { TrafficFloor<uint64_t>(state); }

void BM_WeightedMean(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto agg = StreamingAggregator::Create({{"w", DType::kFloat32, {static_cast<int64_t>(n)}}});
  const std::vector<std::span<const float>> update = {UpdatePool(n)[0]};
  if (!agg.ok() || !agg->Fold(update, 3).ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  TensorList out;
  for (auto _ : state) {
    if (!agg->WeightedMean(&out).ok()) state.SkipWithError("WeightedMean failed");
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * sizeof(float)));
}

BENCHMARK(BM_Memcpy)->Arg(1 << 20)->Arg(10 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Fold)->Arg(1 << 20)->Arg(10 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FoldWide)->Arg(1 << 20)->Arg(10 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrafficFloor)->Arg(1 << 20)->Arg(10 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrafficFloorWide)->Arg(1 << 20)->Arg(10 << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WeightedMean)->Arg(1 << 20)->Arg(10 << 20)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace huddle::aggregation

int main(int argc, char** argv) {
  // --pool_mib=N is ours; the rest go to Google Benchmark.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--pool_mib=", 0) == 0) {
      huddle::aggregation::pool_mib = std::strtoull(arg.c_str() + 11, nullptr, 10);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Each fold's bytes/s over memcpy's for each size.
  huddle::bench::RatioReporter reporter(
      [](const benchmark::BenchmarkReporter::Run& run) {
        const std::string& f = run.run_name.function_name;
        return std::make_pair("params " + run.run_name.args, f == "BM_Fold"       ? "aggregation"
                                                             : f == "BM_FoldWide" ? "int64 path"
                                                             : f == "BM_Memcpy"   ? "memcpy"
                                                                                  : f);
      },
      "aggregation", "memcpy", "aggregation/memcpy ratio");
  reporter.AddRatio("int64 path", "int64 path/memcpy ratio");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
