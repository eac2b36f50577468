// Training through the public API only (models/model.h), so that the same file builds at older
// commits: the CPU step before and after a change is compared by running this program from both
// builds back to back (items = examples).
//
//   BM_TrainEpoch             one epoch of TrainModel (MLP 784-128-10, batch 256, momentum 0.9,
//                             8192 examples)
//   BM_MlpStep/h1/h2/batch    issue 19's one-process CPU figure: SGD steps (forward, backward,
//                             step; momentum 0.9, lr 0.05) of the MLP 784-h1-h2-10 at `batch`, as
//                             one TrainModel epoch over a few batches (the parameters' copy
//                             before each call is not timed). scripts/bench_torch.py --mlp-steps
//                             times PyTorch on the same cases and scripts/cpu_figures.sh prints
//                             the ratios; HUDDLE_CPU_ISA=baseline|avx2 picks the CPU kernels
//                             (kernels/cpu_isa.h).
//
//   build/bench/train_bench [--benchmark_repetitions=5]
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/rng.h"
#include "data/dataset.h"
#include "models/dp_sgd.h"
#include "models/model.h"
#include "privacy/noise.h"

namespace huddle {
namespace {

// `rows` examples of 784 features uniform in [0, 1), labels cycling through 0..9.
data::Dataset RandomData(int64_t rows) {
  data::Dataset data;
  data.feature_dim = 784;
  data.num_classes = 10;
  Rng rng(4);
  for (int64_t i = 0; i < rows; ++i) {
    data.labels.push_back(static_cast<int32_t>(i % 10));
    for (int64_t j = 0; j < 784; ++j) data.features.push_back(static_cast<float>(rng.Uniform()));
  }
  return data;
}

void BM_TrainEpoch(benchmark::State& state) {
  const models::MlpSpec spec{784, {128}, 10};
  const data::Dataset data = RandomData(8192);
  const TensorList initial = models::InitModel(spec, 5);
  models::TrainOptions options;
  options.batch_size = 256;
  options.learning_rate = 0.05;
  options.momentum = 0.9;
  uint64_t seed = 0;
  for (auto _ : state) {
    TensorList params = initial;
    auto stats = models::TrainModel(spec, options, {&data, {}}, ++seed, &params);
    if (!stats.ok()) {
      state.SkipWithError("TrainModel failed");
      return;
    }
    benchmark::DoNotOptimize(params[0].data.data());
  }
  state.SetItemsProcessed(state.iterations() * data.size());
}

BENCHMARK(BM_TrainEpoch)->Unit(benchmark::kMillisecond)->UseRealTime();

// Times `train` (which trains *params in place over `rows` examples) from a fresh copy of
// `initial` per iteration, the copy untimed; items = examples.
void TimeTraining(benchmark::State& state, const TensorList& initial, int64_t rows,
                  const std::function<Status(TensorList*)>& train) {
  TensorList params;
  for (auto _ : state) {
    state.PauseTiming();
    params = initial;
    state.ResumeTiming();
    if (const Status st = train(&params); !st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(params[0].data.data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}

// Args: h1, h2, batch. Steps per call: enough that the call's set-up stays a few percent.
void BM_MlpStep(benchmark::State& state) {
  const models::MlpSpec spec{784, {state.range(0), state.range(1)}, 10};
  const int64_t batch = state.range(2);
  const int64_t steps = state.range(0) >= 1024 ? 32 : 2048 / batch * 2;
  const data::Dataset data = RandomData(batch * steps);
  models::TrainOptions options;
  options.batch_size = batch;
  options.learning_rate = 0.05;
  options.momentum = 0.9;
  uint64_t seed = 0;
  TimeTraining(state, models::InitModel(spec, 5), data.size(), [&](TensorList* params) {
    return models::TrainModel(spec, options, {&data, {}}, ++seed, params).status();
  });
}

BENCHMARK(BM_MlpStep)
    ->Args({256, 128, 64})
    ->Args({256, 128, 128})
    ->Args({2048, 2048, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// examples/fashion_mnist_cnn.yaml's CNN on 1x28x28 inputs.
models::ModelSpec ExampleCnn() {
  using models::LayerKind;
  models::ModelSpec spec;
  spec.input = {1, 28, 28};
  spec.layers = {{.kind = LayerKind::kConv2d, .out = 16, .kernel = 5, .padding = 2},
                 {.kind = LayerKind::kRelu},
                 {.kind = LayerKind::kMaxPool2d, .kernel = 2},
                 {.kind = LayerKind::kConv2d, .out = 32, .kernel = 5, .padding = 2},
                 {.kind = LayerKind::kRelu},
                 {.kind = LayerKind::kMaxPool2d, .kernel = 2},
                 {.kind = LayerKind::kFlatten},
                 {.kind = LayerKind::kDense, .out = 128},
                 {.kind = LayerKind::kRelu},
                 {.kind = LayerKind::kDense, .out = 10}};
  return spec;
}

// The CNN's SGD step at batch 64 (16 steps a call) and its DP-SGD step at expected batch 64
// (z 1, C 1: 16 Poisson steps a call, exact noise included); items = examples.
void BM_CnnStep(benchmark::State& state) {
  const bool dp = state.range(0) != 0;
  const models::ModelSpec spec = ExampleCnn();
  const int64_t batch = 64, steps = 16;
  const data::Dataset data = RandomData(batch * steps);
  models::TrainOptions options;
  options.batch_size = batch;
  options.learning_rate = 0.05;
  options.momentum = 0.9;
  privacy::NoiseSource noise = privacy::NoiseSource::SeededForTesting(7);
  uint64_t seed = 0;
  TimeTraining(state, models::InitModel(spec, 5), data.size(), [&](TensorList* params) {
    return dp ? models::TrainDpSgd(spec, options, {1.0, 1.0, batch}, {&data, {}}, noise, params)
                    .status()
              : models::TrainModel(spec, options, {&data, {}}, ++seed, params).status();
  });
}

BENCHMARK(BM_CnnStep)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace huddle

BENCHMARK_MAIN();
