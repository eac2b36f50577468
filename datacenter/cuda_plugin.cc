// The CUDA plugin's exported symbols: the CUDA backend's table (kernels/cuda_plugin.h,
// kernels/cuda/cuda_backend.h) and the NCCL collective's (nccl_plugin.h, nccl_collective.h), in
// libhuddle_cuda.so. HUDDLE_CUDA_PLUGIN_BUILD_ID comes from the top-level CMakeLists.txt.
#include "kernels/cuda_plugin.h"

#include "datacenter/nccl_collective.h"
#include "datacenter/nccl_plugin.h"
#include "kernels/cuda/cuda_backend.h"

extern "C" __attribute__((visibility("default"))) const huddle::kernels::CudaPlugin*
huddle_cuda_plugin_v2() {
  static const huddle::kernels::CudaPlugin plugin = {
      .abi_version = huddle::kernels::kCudaPluginAbiVersion,
      .build_id = HUDDLE_CUDA_PLUGIN_BUILD_ID,
      .device_count = &huddle::kernels::cuda::DeviceCount,
      .open_backend = &huddle::kernels::cuda::OpenBackend,
  };
  return &plugin;
}

extern "C" __attribute__((visibility("default"))) const huddle::datacenter::NcclPlugin*
huddle_nccl_collective_v1() {
  static const huddle::datacenter::NcclPlugin plugin = {
      .abi_version = huddle::datacenter::kNcclPluginAbiVersion,
      .connect = &huddle::datacenter::nccl::Connect,
  };
  return &plugin;
}
