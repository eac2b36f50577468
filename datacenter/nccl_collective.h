// The NCCL backend of Collective, internal to the CUDA plugin (kernels/cuda_plugin.h,
// nccl_plugin.h): only datacenter/cuda_plugin.cc includes this header. Everything else reaches it
// through ConnectNccl (collective.h), which loads the plugin.
#pragma once

#include <memory>

#include "common/status.h"
#include "datacenter/collective.h"
#include "transport/kv_store.h"

namespace huddle::datacenter::nccl {

// ConnectNccl's work once the plugin is loaded; `options` are already validated.
StatusOr<std::unique_ptr<Collective>> Connect(transport::KvStore& store,
                                              const CollectiveOptions& options, int device);

}  // namespace huddle::datacenter::nccl
