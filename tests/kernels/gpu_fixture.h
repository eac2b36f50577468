// The fixture of the `gpu` parity tests: opens cuda:0, or skips the test saying why (no CUDA
// plugin in this build, the plugin or a library it needs missing, no GPU), and moves vectors to
// and from the device.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kernels/backend.h"

namespace huddle::kernels::test_util {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!BuiltWithCuda()) GTEST_SKIP() << "this build made no CUDA plugin (nvcc was not found)";
    // Loads the CUDA plugin; the reason names what is missing (the plugin, a library, a GPU).
    const StatusOr<int> gpus = CountCudaDevices();
    if (!gpus.ok()) GTEST_SKIP() << gpus.status().message();
    auto opened = OpenBackend(*ParseDeviceRequest("cuda:0"));
    ASSERT_TRUE(opened.ok()) << opened.status().message();
    gpu_ = std::move(opened).value();
  }

  template <typename T>
  DeviceBuffer Upload(const std::vector<T>& host) {
    auto buffer = gpu_->Allocate(static_cast<int64_t>(host.size() * sizeof(T)));
    EXPECT_TRUE(buffer.ok());
    gpu_->CopyToDevice(buffer->data(), host.data(), buffer->bytes());
    return std::move(buffer).value();
  }
  template <typename T>
  DeviceBuffer Filled(size_t n, T value) {
    return Upload(std::vector<T>(n, value));
  }
  template <typename T>
  DeviceBuffer Zeros(size_t n) {
    return Filled<T>(n, T{});
  }
  template <typename T>
  std::vector<T> Download(const DeviceBuffer& buffer) {
    std::vector<T> host(static_cast<size_t>(buffer.bytes()) / sizeof(T));
    const Status st = gpu_->CopyToHost(host.data(), buffer.data(), buffer.bytes());
    EXPECT_TRUE(st.ok()) << st.message();
    return host;
  }

  std::unique_ptr<Backend> gpu_;
};

}  // namespace huddle::kernels::test_util
