// The NCCL backend of Collective on a real GPU: a one-rank communicator (NCCL refuses two ranks on
// one GPU, so several ranks need several GPUs), every operation on device buffers, and
// data-parallel training through it against the CPU. Skipped, with the reason, where this build
// made no CUDA plugin, the plugin does not load, or the machine has no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "datacenter/collective.h"
#include "datacenter/data_parallel.h"
#include "kernels/backend.h"
#include "tests/models/test_data.h"
#include "transport/kv_store.h"

namespace huddle::datacenter {
namespace {

using std::chrono::seconds;

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::BuiltWithCuda())
      GTEST_SKIP() << "this build made no CUDA plugin (nvcc was not found)";
    // Loads the CUDA plugin (NCCL is in it); the reason names what is missing.
    const StatusOr<int> gpus = kernels::CountCudaDevices();
    if (!gpus.ok()) GTEST_SKIP() << gpus.status().message();
    auto opened = kernels::OpenBackend(*kernels::ParseDeviceRequest("cuda:0"));
    ASSERT_TRUE(opened.ok()) << opened.status();
    gpu_ = std::move(opened).value();
    auto server = transport::KvServer::Start("tcp://127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    auto store = transport::OpenKvStore(server_->url());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    CollectiveOptions o;
    o.rank = 0;
    o.world_size = 1;
    o.timeout = seconds(30);
    auto nccl = ConnectNccl(*store_, o, /*device=*/0);
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    nccl_ = std::move(nccl).value();
  }

  template <typename T>
  kernels::DeviceBuffer Upload(const std::vector<T>& host) {
    auto buffer = gpu_->Allocate(static_cast<int64_t>(host.size() * sizeof(T)));
    EXPECT_TRUE(buffer.ok());
    gpu_->CopyToDevice(buffer->data(), host.data(), buffer->bytes());
    EXPECT_TRUE(gpu_->Synchronize().ok());
    return std::move(buffer).value();
  }
  template <typename T>
  std::vector<T> Download(const kernels::DeviceBuffer& buffer) {
    std::vector<T> host(static_cast<size_t>(buffer.bytes()) / sizeof(T));
    EXPECT_TRUE(gpu_->CopyToHost(host.data(), buffer.data(), buffer.bytes()).ok());
    return host;
  }

  std::unique_ptr<kernels::Backend> gpu_;
  std::unique_ptr<transport::KvServer> server_;
  std::unique_ptr<transport::KvStore> store_;
  std::unique_ptr<Collective> nccl_;
};

TEST_F(NcclTest, OneRankCommunicatorRunsEveryOperation) {
  EXPECT_EQ(nccl_->backend(), "nccl");
  EXPECT_EQ(nccl_->world_size(), 1);
  // A sum over one rank is the identity, bit for bit, for both element types and when prepared.
  std::vector<float> values(4099);
  std::iota(values.begin(), values.end(), -2000.5f);
  kernels::DeviceBuffer f = Upload(values);
  ASSERT_TRUE(nccl_->AllReduceSum(std::span<float>(f.as<float>(), values.size())).ok());
  EXPECT_EQ(Download<float>(f), values);
  auto prepared = nccl_->PrepareAllReduceSum(std::span<float>(f.as<float>(), values.size()));
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  for (int run = 0; run < 3; ++run) ASSERT_TRUE((*prepared)->Run().ok());
  EXPECT_EQ(Download<float>(f), values);
  const std::vector<double> doubles = {1.0 / 3, -2.5e300, 7};
  kernels::DeviceBuffer d = Upload(doubles);
  ASSERT_TRUE(nccl_->AllReduceSum(std::span<double>(d.as<double>(), doubles.size())).ok());
  EXPECT_EQ(Download<double>(d), doubles);
  auto prepared_d = nccl_->PrepareAllReduceSum(std::span<double>(d.as<double>(), doubles.size()));
  ASSERT_TRUE(prepared_d.ok()) << prepared_d.status();
  ASSERT_TRUE((*prepared_d)->Run().ok());
  EXPECT_EQ(Download<double>(d), doubles);
  // int64 (DP-SGD's exact sum), plain and prepared.
  const std::vector<int64_t> integers = {INT64_MIN, -1, 0, 7, INT64_MAX};
  kernels::DeviceBuffer i64 = Upload(integers);
  ASSERT_TRUE(nccl_->AllReduceSum(std::span<int64_t>(i64.as<int64_t>(), integers.size())).ok());
  EXPECT_EQ(Download<int64_t>(i64), integers);
  auto prepared_i =
      nccl_->PrepareAllReduceSum(std::span<int64_t>(i64.as<int64_t>(), integers.size()));
  ASSERT_TRUE(prepared_i.ok()) << prepared_i.status();
  ASSERT_TRUE((*prepared_i)->Run().ok());
  EXPECT_EQ(Download<int64_t>(i64), integers);
  // Broadcast from rank 0, all-gather of one rank, barrier.
  const std::vector<std::byte> bytes = {std::byte{1}, std::byte{2}, std::byte{3}};
  kernels::DeviceBuffer b = Upload(bytes);
  ASSERT_TRUE(nccl_->Broadcast(std::span<std::byte>(b.as<std::byte>(), 3), 0).ok());
  EXPECT_EQ(Download<std::byte>(b), bytes);
  kernels::DeviceBuffer gathered = Upload(std::vector<std::byte>(3));
  ASSERT_TRUE(nccl_
                  ->AllGather(std::span<const std::byte>(b.as<std::byte>(), 3),
                              std::span<std::byte>(gathered.as<std::byte>(), 3))
                  .ok());
  EXPECT_EQ(Download<std::byte>(gathered), bytes);
  EXPECT_TRUE(nccl_->Barrier().ok());
  // Mistakes are errors, not crashes.
  EXPECT_FALSE(nccl_->Broadcast(std::span<std::byte>(b.as<std::byte>(), 3), 1).ok());
  EXPECT_FALSE(nccl_
                   ->AllGather(std::span<const std::byte>(b.as<std::byte>(), 3),
                               std::span<std::byte>(gathered.as<std::byte>(), 2))
                   .ok());
}

// TrainDataParallel through NCCL on the GPU follows the CPU's trajectory (cuBLAS sums in another
// order: float rounding), with and without batch norm.
TEST_F(NcclTest, DataParallelTrainingOnTheGpuMatchesTheCpu) {
  for (const bool batch_norm : {false, true}) {
    SCOPED_TRACE(batch_norm ? "batch norm" : "plain");
    const models::MlpSpec spec{64, {128, 32}, 10, batch_norm};
    const data::Dataset data = models::Blobs(2048, 64, 10, 9);
    DataParallelOptions options;
    options.train.epochs = 1;
    options.train.batch_size = 128;
    options.train.learning_rate = 0.05;
    options.train.momentum = 0.9;
    options.seed = 11;
    options.checksum_every = 4;
    TensorList on_cpu = models::InitModel(spec, 10), on_gpu = on_cpu;
    auto cpu = models::TrainModel(spec, options.train, {&data, {}}, options.seed, &on_cpu);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    options.train.backend = gpu_.get();
    auto gpu = TrainDataParallel(*nccl_, spec, options, {&data, {}}, &on_gpu);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_EQ(gpu->steps, cpu->steps);
    EXPECT_GT(gpu->checksums, 1);
    for (size_t t = 0; t < on_cpu.size(); ++t) {
      for (size_t i = 0; i < on_cpu[t].data.size(); ++i) {
        ASSERT_NEAR(on_gpu[t].data[i], on_cpu[t].data[i], 1e-3 + 1e-3 * std::abs(on_cpu[t].data[i]))
            << on_cpu[t].name() << "[" << i << "]";
      }
    }
  }
  // DP-SGD through NCCL: the same sample and noise integers as the CPU's single process (the
  // noise is drawn on the host for both), the chunks' GEMMs in cuBLAS's order: rounding level.
  {
    const models::MlpSpec spec{64, {32}, 10};
    const data::Dataset data = models::Blobs(1024, 64, 10, 12);
    const models::DpSgdOptions dp{1.0, 0.5, 300};
    DataParallelOptions options;
    options.train.epochs = 1;
    options.train.learning_rate = 0.1;
    TensorList on_cpu = models::InitModel(spec, 13), on_gpu = on_cpu;
    auto cpu_noise = privacy::NoiseSource::SeededForTesting(14);
    auto cpu = models::TrainDpSgd(spec, options.train, dp, {&data, {}}, cpu_noise, &on_cpu);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    auto gpu_noise = privacy::NoiseSource::SeededForTesting(14);
    options.train.backend = gpu_.get();
    options.dp_sgd = DataParallelDpSgd{dp, &gpu_noise};
    auto gpu = TrainDataParallel(*nccl_, spec, options, {&data, {}}, &on_gpu);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_EQ(gpu->examples, cpu->train.examples);
    for (size_t t = 0; t < on_cpu.size(); ++t) {
      for (size_t i = 0; i < on_cpu[t].data.size(); ++i) {
        ASSERT_NEAR(on_gpu[t].data[i], on_cpu[t].data[i], 1e-3 + 1e-3 * std::abs(on_cpu[t].data[i]))
            << "DP-SGD " << on_cpu[t].name() << "[" << i << "]";
      }
    }
  }
  // The NCCL collective cannot reduce host buffers: a CPU backend is refused with the reason.
  TensorList params = models::InitModel(models::MlpSpec{64, {32}, 10}, 1);
  const data::Dataset data = models::Blobs(64, 64, 10, 1);
  DataParallelOptions options;
  auto refused =
      TrainDataParallel(*nccl_, models::MlpSpec{64, {32}, 10}, options, {&data, {}}, &params);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
}

}  // namespace
}  // namespace huddle::datacenter
