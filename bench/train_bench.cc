// One epoch of TrainMlp (MLP 784-128-10, batch 256, momentum 0.9, 8192 examples) through the
// public API only, so that the same file builds at older commits: the CPU step before and after a
// change is compared by running this program from both builds back to back (items = examples).
//
//   build/bench/train_bench [--benchmark_repetitions=5]
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/rng.h"
#include "data/dataset.h"
#include "models/mlp.h"

namespace huddle {
namespace {

void BM_TrainEpoch(benchmark::State& state) {
  const models::MlpSpec spec{784, {128}, 10};
  data::Dataset data;
  data.feature_dim = 784;
  data.num_classes = 10;
  Rng rng(4);
  for (int64_t i = 0; i < 8192; ++i) {
    data.labels.push_back(static_cast<int32_t>(i % 10));
    for (int64_t j = 0; j < 784; ++j) data.features.push_back(static_cast<float>(rng.Uniform()));
  }
  const TensorList initial = models::InitMlp(spec, 5);
  models::TrainOptions options;
  options.batch_size = 256;
  options.learning_rate = 0.05;
  options.momentum = 0.9;
  uint64_t seed = 0;
  for (auto _ : state) {
    TensorList params = initial;
    auto stats = models::TrainMlp(spec, options, {&data, {}}, ++seed, &params);
    if (!stats.ok()) {
      state.SkipWithError("TrainMlp failed");
      return;
    }
    benchmark::DoNotOptimize(params[0].data.data());
  }
  state.SetItemsProcessed(state.iterations() * data.size());
}

BENCHMARK(BM_TrainEpoch)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace huddle

BENCHMARK_MAIN();
