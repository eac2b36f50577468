// Privacy noise and clipping cost, against memcpy of the same bytes measured in the same run.
//
//   BM_NextU64            ChaCha20 keystream words per second (the sampler's only randomness)
//   BM_DiscreteGaussian   exact N_Z(0, 2^48) samples per second (the variance NoiseGridFor
//                         picks is in [2^48, 2^50])
//   BM_AddNoise/N         AddDiscreteGaussianNoise on N floats: bytes/s and ns per value
//   BM_ClipToNorm/N       ClipToNorm of N floats that always needs clipping: bytes/s (the input
//                         is restored outside the timed region each iteration)
//   BM_Memcpy/N           memcpy of N floats: the same-run baseline
// N = 101,770 (the quickstart MLP 784-128-10) and 10M. After the run, main prints
// `clip/memcpy ratio` and `noise/memcpy ratio` per size from bytes_per_second, and the sampler's
// time per sample in keystream words (`sample/word time ratio`).
//
//   build-noise/bench/privacy_bench [--benchmark_repetitions=3 ...]
#include <cstring>
#include <map>
#include <ostream>  // bench/ratio_reporter.h streams without including it
#include <string>
#include <utility>
#include <vector>

#include "bench/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "common/rng.h"
#include "common/tensor.h"
#include "privacy/clip.h"
#include "privacy/noise.h"

namespace huddle::privacy {
namespace {

constexpr int64_t kMlpParams = 101'770;  // 784*128 + 128 + 128*10 + 10
constexpr int64_t kLargeParams = 10'000'000;

// An update-like vector of n floats (std 0.01), made once per size.
const std::vector<float>& Update(size_t n) {
  static std::map<size_t, std::vector<float>> cache;
  auto& v = cache[n];
  if (v.empty()) {
    Rng rng(n);
    v.resize(n);
    for (float& x : v) x = static_cast<float>(0.01 * rng.Normal());
  }
  return v;
}

void BM_NextU64(benchmark::State& state) {
  NoiseSource source = NoiseSource::Secure();
  for (auto _ : state) benchmark::DoNotOptimize(source.NextU64());
  state.SetItemsProcessed(state.iterations());
}

void BM_DiscreteGaussian(benchmark::State& state) {
  const uint64_t s = uint64_t{1} << state.range(0);
  auto gaussian = DiscreteGaussian::Create(s);
  if (!gaussian.ok()) {
    state.SkipWithError(gaussian.status().ToString().c_str());
    return;
  }
  NoiseSource source = NoiseSource::Secure();
  for (auto _ : state) benchmark::DoNotOptimize(gaussian->Sample(source));
  state.SetItemsProcessed(state.iterations());
  state.counters["sec_per_sample"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float>& src = Update(n);
  std::vector<float> dst(n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * sizeof(float)));
}

void BM_AddNoise(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto grid = NoiseGridFor(1.0, 1.0, static_cast<int64_t>(n));
  if (!grid.ok()) {
    state.SkipWithError(grid.status().ToString().c_str());
    return;
  }
  std::vector<float> values = Update(n);
  NoiseSource source = NoiseSource::Secure();
  for (auto _ : state) {
    // The values drift by the noise each iteration; they stay far from 2^62 grid units.
    const Status st = AddDiscreteGaussianNoise(values, *grid, source);
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * sizeof(float)));
  state.counters["sec_per_value"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_ClipToNorm(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float>& src = Update(n);
  TensorList update(1);
  update[0] = Tensor("w", {static_cast<int64_t>(n)});
  update[0].data = src;
  const double clip = L2Norm(update) / 2;
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(update[0].data.data(), src.data(), n * sizeof(float));
    state.ResumeTiming();
    const ClipResult r = ClipToNorm(&update, clip);
    benchmark::DoNotOptimize(r);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * sizeof(float)));
}

BENCHMARK(BM_NextU64);
BENCHMARK(BM_DiscreteGaussian)->Arg(48)->ArgName("log2_s");
BENCHMARK(BM_Memcpy)->Arg(kMlpParams)->Arg(kLargeParams)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ClipToNorm)->Arg(kMlpParams)->Arg(kLargeParams)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AddNoise)->Arg(kMlpParams)->Arg(kLargeParams)->Unit(benchmark::kMillisecond);

// RatioReporter prints clip/memcpy; this adds noise/memcpy from the same runs.
class PrivacyReporter : public bench::RatioReporter {
 public:
  PrivacyReporter()
      : RatioReporter(
            [](const Run& run) {
              return std::make_pair("params " + run.run_name.args, Variant(run));
            },
            "clip", "memcpy", "clip/memcpy ratio") {}

  void ReportRuns(const std::vector<Run>& runs) override {
    bench::ForEachRate(runs, {"bytes_per_second", "items_per_second"},
                       [&](const Run& run, const std::string& counter, double rate, bool median) {
                         const std::string group =
                             counter[0] == 'b' ? "params " + run.run_name.args : "items";
                         Measurement& m = rates_[group][Variant(run)];
                         if (median || !m.median) m = {rate, median};
                       });
    RatioReporter::ReportRuns(runs);
  }

  void Finalize() override {
    RatioReporter::Finalize();
    if (const auto& items = rates_["items"]; items.count("gaussian") && items.count("keystream")) {
      const double gaussian = items.at("gaussian").rate, words = items.at("keystream").rate;
      GetOutputStream() << "discrete Gaussian s=2^48: " << gaussian / 1e6 << " M samples/s ("
                        << 1e9 / gaussian << " ns/sample), keystream " << words / 1e6
                        << " M words/s, sample/word time ratio = " << words / gaussian << "\n";
    }
    for (const auto& [group, by_variant] : rates_) {
      if (group == "items") continue;
      auto noise = by_variant.find("noise");
      auto memcpy = by_variant.find("memcpy");
      if (noise == by_variant.end() || memcpy == by_variant.end()) continue;
      GetOutputStream() << group << " bytes_per_second: noise " << noise->second.rate / 1e9
                        << " G/s (" << 4e9 / noise->second.rate << " ns/value), memcpy "
                        << memcpy->second.rate / 1e9
                        << " G/s, noise/memcpy ratio = " << noise->second.rate / memcpy->second.rate
                        << "\n";
    }
  }

 private:
  struct Measurement {
    double rate = 0;
    bool median = false;
  };
  static std::string Variant(const Run& run) {
    const std::string& f = run.run_name.function_name;
    return f == "BM_ClipToNorm"         ? "clip"
           : f == "BM_Memcpy"           ? "memcpy"
           : f == "BM_AddNoise"         ? "noise"
           : f == "BM_DiscreteGaussian" ? "gaussian"
           : f == "BM_NextU64"          ? "keystream"
                                        : f;
  }
  std::map<std::string, std::map<std::string, Measurement>> rates_;
};

}  // namespace
}  // namespace huddle::privacy

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  huddle::privacy::PrivacyReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
