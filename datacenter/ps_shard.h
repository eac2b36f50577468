// One parameter server's shard: a contiguous range of the flat parameter vector (ps_plan.h), its
// momentum buffer and its version, and the optimizer step applied to it (kernels/optimizer.h's
// SgdStep, the kernel every trainer's step runs, element-wise, so a shard steps exactly as the
// same range of the whole model would).
//
//   - async: every gradient is applied on arrival, one SGD step each; its staleness is the shard's
//     version then minus the version the worker pulled.
//   - sync: gradients tagged with the shard's version v are summed, each weighted by its rows; at
//     the `need`-th the shard takes one step with their row-weighted mean (the gradient of the
//     mean loss over all their rows, as the all-reduce mode's global batch) and moves to v + 1.
//     A gradient tagged with an older version (a backup worker's, late) is dropped and counted.
//     Each shard takes the first `need` to reach it (as TensorFlow's per-variable accumulators).
// Gradients are checked (length, finite values, versions) and refused with a typed error.
//
// Thread-safety: none (its server's loop).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "datacenter/ps_plan.h"
#include "kernels/optimizer.h"

namespace huddle::datacenter {

class Shard {
 public:
  // `params` holds the range's values; `velocity` the momentum (empty: zeros when momentum > 0).
  Shard(ShardRange range, std::vector<float> params, std::vector<float> velocity, int64_t version,
        const kernels::SgdHyper& hyper, bool async);

  struct Pushed {
    bool accepted = false;  // false: dropped (sync, late)
    int64_t staleness = 0;  // the shard's version minus the gradient's base version, on arrival
    int64_t version = 0;    // the shard's version after it
  };
  // A worker's gradient of the range, computed on the parameters of `base_version` (sync: the
  // step's version) from `rows` rows; sync: `need` of them make the step.
  StatusOr<Pushed> Push(int64_t base_version, int64_t rows, int64_t need,
                        std::span<const float> grad);

  const ShardRange& range() const { return range_; }
  int64_t version() const { return version_; }
  const std::vector<float>& params() const { return params_; }
  // The momentum buffer (zeros before the first step); empty without momentum.
  const std::vector<float>& velocity() const { return velocity_; }
  int64_t dropped() const { return dropped_; }

 private:
  ShardRange range_;
  std::vector<float> params_, velocity_;
  int64_t version_;
  kernels::SgdHyper hyper_;
  bool async_;
  // Sync: the row-weighted sum of the current version's gradients so far.
  std::vector<double> sum_;
  std::vector<float> mean_;
  int64_t rows_ = 0, count_ = 0, need_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace huddle::datacenter
