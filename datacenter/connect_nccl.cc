// ConnectNccl (collective.h): the NCCL collective comes from the CUDA plugin
// (kernels/cuda_plugin.h), loaded here on first use; nothing in this file links CUDA.
#include "datacenter/collective.h"
#include "kernels/cuda_plugin.h"

namespace huddle::datacenter {

StatusOr<std::unique_ptr<Collective>> ConnectNccl(transport::KvStore& store,
                                                  const CollectiveOptions& options, int device) {
  HUDDLE_RETURN_IF_ERROR(ValidateCollectiveOptions(options));
  StatusOr<const kernels::CudaPluginV1*> plugin = kernels::LoadCudaPlugin();
  if (!plugin.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL on GPU ", device, ": ", plugin.status().message()));
  }
  return (*plugin)->connect_nccl(store, options, device);
}

}  // namespace huddle::datacenter
