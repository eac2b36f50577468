// Training and update-pipeline kernels on every device of this machine, as ratios to a baseline
// measured in the same run (issue 5's figures):
//
//   BM_Pipeline/<dev>/N     the fused update pipeline on N floats: delta, norm and clip
//                           (kernels/update.h). Bytes counted: the memory it moves, 20 per
//                           element (pass 1 reads local and global for the norm; pass 2 reads
//                           them again and writes the float; the clip scale depends on every
//                           element, so two passes are the fewest). Its useful rate (12 bytes per
//                           element) is 0.6 of this.
//   BM_DeviceCopy/<dev>/N   a device-to-device copy of N floats (memcpy on the CPU); bytes counted:
//                           8 per element (read and write)
//   BM_SgdStep/<dev>        one minibatch SGD step (momentum 0.9) of the MLP 784-128-10, batch 256:
//                           gather, forward, backward, step; items = examples
//   BM_DpSgdStep/<dev>/B    one DP-SGD step of the same model (models/dp_sgd.h) on a sample of B
//                           rows (expected batch B: ceil(B / 256) chunks): per chunk ghost-norm
//                           clipping and the exact sum on the noise grid, then the exact
//                           discrete Gaussian noise (z = 1, C = 1; drawn on the host on every
//                           device), the conversion and the same SGD step; items = examples
//   BM_PoissonSample/n      the host's Poisson draw of a DP-SGD batch from n examples
//                           (q = 256 / n), which happens once per step besides the kernels
// <dev> is 0 for the CPU and 1 for cuda:0 (registered only when a GPU is usable). A GPU
// iteration enqueues its work and then waits for the device (the training steps: 16 steps, then
// one wait). After the run main prints, per device, the pipeline's bandwidth over the copy's and
// the DP-SGD step's time (B = 256) over the SGD step's.
//
//   build/bench/kernels_bench [--benchmark_repetitions=3 --benchmark_filter=...]
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>  // bench/ratio_reporter.h streams without including it
#include <string>
#include <vector>

#include "bench/ratio_reporter.h"
#include "benchmark/benchmark.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/flush_denormals.h"
#include "models/dp_sgd.h"
#include "models/model.h"
#include "models/trainer.h"
#include "privacy/noise.h"

namespace huddle {
namespace {

constexpr int64_t kBatch = 256;
constexpr int64_t kStepsPerWait = 16;
const models::MlpSpec kMlp{784, {128}, 10};

// The backends, opened once: [0] the CPU, [1] cuda:0 when usable.
std::vector<std::unique_ptr<kernels::Backend>>& Devices() {
  static auto* devices = [] {
    auto* list = new std::vector<std::unique_ptr<kernels::Backend>>;
    list->push_back(kernels::OpenCpuBackend());
    if (kernels::BuiltWithCuda() && kernels::CudaDeviceCount() > 0) {
      auto gpu = kernels::OpenBackend(*kernels::ParseDeviceRequest("cuda:0"));
      if (gpu.ok()) {
        list->push_back(std::move(gpu).value());
      } else {
        std::fprintf(stderr, "cuda:0 not benchmarked: %s\n",
                     std::string(gpu.status().message()).c_str());
      }
    }
    return list;
  }();
  return *devices;
}

kernels::Backend& DeviceOf(const benchmark::State& state) {
  return *Devices()[static_cast<size_t>(state.range(0))];
}

kernels::DeviceBuffer Filled(kernels::Backend& device, int64_t n, uint64_t seed, double stddev) {
  std::vector<float> host(static_cast<size_t>(n));
  Rng rng(seed);
  for (float& x : host) x = static_cast<float>(stddev * rng.Normal());
  kernels::DeviceBuffer buffer = device.Allocate(n * 4).value();
  device.CopyToDevice(buffer.data(), host.data(), n * 4);
  return buffer;
}

void Wait(benchmark::State& state, kernels::Backend& device) {
  const Status st = device.Synchronize();
  if (!st.ok()) state.SkipWithError(std::string(st.message()).c_str());
}

void BM_Pipeline(benchmark::State& state) {
  kernels::Backend& device = DeviceOf(state);
  const int64_t n = state.range(1);
  const kernels::DeviceBuffer local = Filled(device, n, 1, 1.0);
  const kernels::DeviceBuffer global = Filled(device, n, 2, 1.0);
  kernels::DeviceBuffer out = device.Allocate(n * 4).value();
  kernels::DeviceBuffer scratch = device.Allocate(kernels::kUpdatePipelineScratch * 8).value();
  kernels::DeviceBuffer stats = device.Allocate(sizeof(kernels::UpdatePipelineStats)).value();
  kernels::UpdatePipelineParams p;
  p.clip_norm = 1.0;  // the norm is ~sqrt(2n): always clipped
  for (auto _ : state) {
    device.UpdatePipeline(p, local.as<float>(), global.as<float>(), n, out.as<float>(),
                          scratch.as<double>(), stats.as<kernels::UpdatePipelineStats>());
    Wait(state, device);
  }
  state.SetBytesProcessed(state.iterations() * n * 20);
}

void BM_DeviceCopy(benchmark::State& state) {
  kernels::Backend& device = DeviceOf(state);
  const int64_t n = state.range(1);
  const kernels::DeviceBuffer src = Filled(device, n, 1, 1.0);
  kernels::DeviceBuffer dst = device.Allocate(n * 4).value();
  for (auto _ : state) {
    device.CopyOnDevice(dst.data(), src.data(), n * 4);
    Wait(state, device);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 8);
}

// The MLP's trainer (SGD, batch kBatch, or DP-SGD with `dp`) on a data set of 8192 examples,
// with a shuffled order set.
struct StepFixture {
  explicit StepFixture(kernels::Backend& device,
                       std::optional<models::DpSgdOptions> dp = std::nullopt)
      : data(MakeData()), params(models::InitModel(kMlp, 5)) {
    models::TrainOptions options;
    options.learning_rate = 0.05;
    options.momentum = 0.9;
    options.batch_size = kBatch;
    options.backend = &device;
    // DP-SGD: a plan far longer than any timing, so that every timed step's noise is drawn one
    // step ahead as in a run (none is drawn past the plan's last step).
    if (dp) options.epochs = 1000;
    models::Trainer::Loop loop;
    loop.dp_sgd = dp;
    loop.noise = &noise;
    auto created = models::Trainer::Create(kMlp, options, {&data, {}}, loop);
    if (!created.ok()) {
      error = std::string(created.status().message());
      return;
    }
    trainer = std::move(*created);
    trainer->UploadParams(params);
    order.resize(static_cast<size_t>(data.size()));
    std::iota(order.begin(), order.end(), int64_t{0});
    Rng(6).Shuffle(order);
    (void)trainer->SetOrder(order);
  }
  static data::Dataset MakeData() {
    data::Dataset d;
    d.feature_dim = kMlp.input_dim;
    d.num_classes = kMlp.num_classes;
    Rng rng(4);
    for (int64_t i = 0; i < 8192; ++i) {
      d.labels.push_back(static_cast<int32_t>(i % 10));
      for (int64_t j = 0; j < d.feature_dim; ++j) {
        d.features.push_back(static_cast<float>(rng.Uniform()));
      }
    }
    return d;
  }
  // The first row of the k-th batch of the order (cycling).
  int64_t BatchStart(int64_t k) const { return (k * kBatch) % (data.size() - kBatch + 1); }

  // The k-th DP-SGD sample of `rows` rows: the order's rows from BatchStart(k), in increasing
  // position (a Poisson sample's form).
  std::vector<int64_t> Sample(int64_t k, int64_t rows) const {
    const int64_t start = (k * rows) % (data.size() - rows + 1);
    std::vector<int64_t> sample(order.begin() + start, order.begin() + start + rows);
    std::sort(sample.begin(), sample.end());
    return sample;
  }

  data::Dataset data;
  TensorList params;
  privacy::NoiseSource noise = privacy::NoiseSource::Secure();
  std::unique_ptr<models::Trainer> trainer;
  std::string error;  // why there is no trainer
  std::vector<int64_t> order;
};

void BM_SgdStep(benchmark::State& state) {
  kernels::FlushDenormalsScope flush_denormals;
  kernels::Backend& device = DeviceOf(state);
  StepFixture f(device);
  if (f.trainer == nullptr) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  int64_t k = 0;
  for (auto _ : state) {
    for (int64_t s = 0; s < kStepsPerWait; ++s, ++k) {
      (void)f.trainer->SgdStep(f.BatchStart(k), kBatch);
    }
    Wait(state, device);
  }
  state.SetItemsProcessed(state.iterations() * kStepsPerWait * kBatch);
}

void BM_DpSgdStep(benchmark::State& state) {
  kernels::FlushDenormalsScope flush_denormals;
  kernels::Backend& device = DeviceOf(state);
  const int64_t batch = state.range(1);
  models::DpSgdOptions dp;
  dp.noise_multiplier = 1.0;
  dp.clip_norm = 1.0;
  dp.expected_batch_size = batch;
  StepFixture f(device, dp);
  if (f.trainer == nullptr) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  std::vector<std::vector<int64_t>> samples;
  for (int64_t k = 0; k < kStepsPerWait; ++k) samples.push_back(f.Sample(k, batch));
  int64_t k = 0;
  for (auto _ : state) {
    for (int64_t s = 0; s < kStepsPerWait; ++s, ++k) {
      const auto st = f.trainer->DpSgdStep(samples[static_cast<size_t>(s)], k);
      if (!st.ok()) {
        state.SkipWithError(std::string(st.status().message()).c_str());
        return;
      }
    }
    Wait(state, device);
  }
  state.SetItemsProcessed(state.iterations() * kStepsPerWait * batch);
}

void BM_PoissonSample(benchmark::State& state) {
  const int64_t n = state.range(0);
  privacy::NoiseSource noise = privacy::NoiseSource::Secure();
  std::vector<int64_t> rows;
  for (auto _ : state) {
    models::SamplePoissonBatch(n, kBatch, noise, &rows);
    benchmark::DoNotOptimize(rows.data());
  }
  state.counters["sec_per_step"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Prints the two ratios per device from the runs' rates (medians with repetitions).
class KernelsReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    bench::ForEachRate(runs, {"bytes_per_second", "items_per_second"},
                       [&](const Run& run, const std::string&, double rate, bool median) {
                         const std::string key =
                             run.run_name.function_name + "/" + run.run_name.args;
                         if (median || !rates_.count(key)) rates_[key] = rate;
                       });
    ConsoleReporter::ReportRuns(runs);
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::ostream& out = GetOutputStream();
    for (size_t d = 0; d < Devices().size(); ++d) {
      const std::string name = Devices()[d]->name();
      for (int64_t n : PipelineSizes(d)) {
        const std::string args = std::to_string(d) + "/" + std::to_string(n);
        const double* fused = Find("BM_Pipeline/" + args);
        const double* copy = Find("BM_DeviceCopy/" + args);
        if (fused == nullptr || copy == nullptr) continue;
        out << name << ", " << n << " floats: fused pipeline " << *fused / 1e9
            << " GB/s, device copy " << *copy / 1e9
            << " GB/s, pipeline/copy bandwidth ratio = " << *fused / *copy << "\n";
      }
      const double* sgd = Find("BM_SgdStep/" + std::to_string(d));
      const double* dp = Find("BM_DpSgdStep/" + std::to_string(d) + "/" + std::to_string(kBatch));
      if (sgd != nullptr && dp != nullptr) {
        out << name << ", MLP 784-128-10 batch " << kBatch << ": SGD step " << *sgd
            << " examples/s, DP-SGD step " << *dp
            << " examples/s, DP-SGD/SGD step time ratio = " << *sgd / *dp << "\n";
      }
    }
  }

  static std::vector<int64_t> PipelineSizes(size_t device) {
    if (device == 0) return {101'770, 10'000'000};
    return {101'770, 16'777'216, 134'217'728};
  }

 private:
  const double* Find(const std::string& key) const {
    auto it = rates_.find(key);
    return it == rates_.end() ? nullptr : &it->second;
  }
  std::map<std::string, double> rates_;
};

void Register() {
  for (size_t d = 0; d < Devices().size(); ++d) {
    const auto dev = static_cast<int64_t>(d);
    for (int64_t n : KernelsReporter::PipelineSizes(d)) {
      benchmark::RegisterBenchmark("BM_Pipeline", BM_Pipeline)
          ->Args({dev, n})
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark("BM_DeviceCopy", BM_DeviceCopy)
          ->Args({dev, n})
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark("BM_SgdStep", BM_SgdStep)
        ->Arg(dev)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    for (int64_t batch : {kBatch, int64_t{2048}}) {
      benchmark::RegisterBenchmark("BM_DpSgdStep", BM_DpSgdStep)
          ->Args({dev, batch})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  benchmark::RegisterBenchmark("BM_PoissonSample", BM_PoissonSample)
      ->Arg(60'000)
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace
}  // namespace huddle

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  huddle::Register();
  huddle::KernelsReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
