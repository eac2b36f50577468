// The CUDA backend's entry points, for the CUDA plugin's table (datacenter/cuda_plugin.cc, loaded
// by kernels/backend.cc through kernels/cuda_plugin.h). Host-only: no CUDA header is needed to
// include it.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "kernels/backend.h"

namespace huddle::kernels::cuda {

// GPUs the CUDA runtime sees; 0 with *why set (the runtime's message) when it sees none.
int DeviceCount(std::string* why);

// Opens GPU `ordinal` with its own stream and cuBLAS handle. FailedPrecondition names the ordinal
// and the runtime's message when it cannot.
StatusOr<std::unique_ptr<Backend>> OpenBackend(int ordinal);

}  // namespace huddle::kernels::cuda
