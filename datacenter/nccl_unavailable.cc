// ConnectNccl in a build without the CUDA toolkit.
#include "datacenter/collective.h"

namespace huddle::datacenter {

StatusOr<std::unique_ptr<Collective>> ConnectNccl(transport::KvStore&, const CollectiveOptions&,
                                                  int) {
  return absl::UnimplementedError(
      "NCCL: this huddle was built without CUDA (reconfigure with the CUDA toolkit installed and "
      "-DHUDDLE_ENABLE_CUDA=ON)");
}

}  // namespace huddle::datacenter
