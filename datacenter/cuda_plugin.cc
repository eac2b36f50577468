// The CUDA plugin's one exported symbol (kernels/cuda_plugin.h): the CUDA backend
// (kernels/cuda/cuda_backend.h) and the NCCL collective (nccl_collective.h), in libhuddle_cuda.so.
// HUDDLE_CUDA_PLUGIN_BUILD_ID comes from the top-level CMakeLists.txt.
#include "kernels/cuda_plugin.h"

#include "datacenter/nccl_collective.h"
#include "kernels/cuda/cuda_backend.h"

extern "C" __attribute__((visibility("default"))) const huddle::kernels::CudaPluginV1*
huddle_cuda_plugin_v1() {
  static const huddle::kernels::CudaPluginV1 plugin = {
      .abi_version = huddle::kernels::kCudaPluginAbiVersion,
      .build_id = HUDDLE_CUDA_PLUGIN_BUILD_ID,
      .device_count = &huddle::kernels::cuda::DeviceCount,
      .open_backend = &huddle::kernels::cuda::OpenBackend,
      .connect_nccl = &huddle::datacenter::nccl::Connect,
  };
  return &plugin;
}
