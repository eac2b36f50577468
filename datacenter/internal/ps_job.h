// The parameter-server mode's part of datacenter::RunRank (datacenter/job.h): one rank, server or
// worker, after the common preparation (data loaded, rank 0's checkpoint read and metrics cut back,
// the rendezvous joined and the run id agreed). Included by datacenter/job.cc only.
//
// Thread-safety: runs on the calling thread.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "data/dataset.h"
#include "datacenter/data_parallel.h"
#include "datacenter/job.h"

namespace huddle::datacenter::internal {

// Runs rank o.collective.rank of a job with c.parameter_server. `resume` (rank 0) is the
// checkpoint to continue from; `complete`: it says the job ran to its end (nothing is trained or
// written). Errors as RunRank's, with `refuse` marking those that refuse the configuration.
Status RunParameterServerRank(const DatacenterConfig& c, const RankOptions& o,
                              transport::KvStore& store, const std::string& key_prefix,
                              const data::Dataset& train, const data::Dataset* test,
                              const TrainingState* resume, bool complete,
                              const std::function<Status(std::string_view, const Status&)>& refuse);

}  // namespace huddle::datacenter::internal
