// The datacenter's entry in the CUDA plugin (kernels/cuda_plugin.h, libhuddle_cuda.so): the NCCL
// collective. The plugin exports it as the C symbol kNcclPluginEntry (datacenter/cuda_plugin.cc);
// ConnectNccl (collective.h) finds it with kernels::CudaPluginSymbol, so the kernels' loader
// knows nothing of collectives. Covered by the plugin's build id (the top-level CMakeLists.txt
// hashes this header): bump kNcclPluginAbiVersion when the struct changes.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "datacenter/collective.h"
#include "transport/kv_store.h"

namespace huddle::datacenter {

inline constexpr uint32_t kNcclPluginAbiVersion = 1;
inline constexpr const char* kNcclPluginEntry = "huddle_nccl_collective_v1";

struct NcclPlugin {
  uint32_t abi_version;  // kNcclPluginAbiVersion
  // ConnectNccl's work once the plugin is loaded; `options` are already validated.
  StatusOr<std::unique_ptr<Collective>> (*connect)(transport::KvStore& store,
                                                   const CollectiveOptions& options, int device);
};

}  // namespace huddle::datacenter
