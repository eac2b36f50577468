// ConnectNccl (collective.h): the NCCL collective comes from the CUDA plugin
// (kernels/cuda_plugin.h; this module's entry in it: nccl_plugin.h), loaded here on first use;
// nothing in this file links CUDA.
#include "datacenter/collective.h"
#include "datacenter/nccl_plugin.h"
#include "kernels/cuda_plugin.h"

namespace huddle::datacenter {

StatusOr<std::unique_ptr<Collective>> ConnectNccl(transport::KvStore& store,
                                                  const CollectiveOptions& options, int device) {
  HUDDLE_RETURN_IF_ERROR(ValidateCollectiveOptions(options));
  StatusOr<void*> symbol = kernels::CudaPluginSymbol(kNcclPluginEntry);
  if (!symbol.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL on GPU ", device, ": ", symbol.status().message()));
  }
  using Entry = const NcclPlugin* (*)();
  const NcclPlugin* plugin = reinterpret_cast<Entry>(*symbol)();
  if (plugin == nullptr || plugin->abi_version != kNcclPluginAbiVersion) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL on GPU ", device,
                                                      ": the CUDA plugin's ", kNcclPluginEntry,
                                                      " is not version ", kNcclPluginAbiVersion));
  }
  return plugin->connect(store, options, device);
}

}  // namespace huddle::datacenter
