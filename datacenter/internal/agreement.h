// What the ranks of TrainDataParallel agree on besides the gradients (data_parallel.cc): the same
// configuration and data before the first step, the stop vote, identical replicas, rank 0's resume
// state and DP-SGD's sampling stream. Each is a collective operation every rank calls at the same
// point; internal to datacenter/.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "data/dataset.h"
#include "datacenter/collective.h"
#include "datacenter/data_parallel.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/trainer.h"
#include "privacy/noise.h"

namespace huddle::datacenter::internal {

// Small host-side collectives (loss totals, digests) through a scratch buffer on the training
// device, which is where the collective's buffers live.
class Scratch {
 public:
  static StatusOr<Scratch> Create(kernels::Backend& backend, int world_size);
  Status AllReduceSum(Collective& c, std::span<double> values);
  // At most 64 bytes, from `root`.
  Status Broadcast(Collective& c, std::span<std::byte> data, int root);
  // in: at most 64 bytes.
  Status AllGather(Collective& c, std::span<const std::byte> in, std::span<std::byte> out);

 private:
  explicit Scratch(kernels::Backend& backend) : backend_(&backend) {}
  kernels::Backend* backend_;
  kernels::DeviceBuffer buffer_;
};

// Same model, options and data on every rank (one all-gather of both digests), or an error on
// every rank naming the ranks that differ from rank 0 and what differs.
Status CheckAgreement(Collective& c, Scratch& scratch, const models::ModelSpec& spec,
                      const DataParallelOptions& o, const data::DatasetView& data);

// The stop agreement (DataParallelOptions::stop): every `every` steps the ranks sum their stop
// flags, so that all of them stop after the same step. Deadlock-free: every rank votes at the
// same step counts, whatever its flag.
class StopVote {
 public:
  static StatusOr<StopVote> Create(Collective& c, kernels::Backend& backend,
                                   const DataParallelOptions& o);
  // After step `steps` (counted from the run's start): whether every rank stops now.
  StatusOr<bool> StopAfter(int64_t steps);

 private:
  const std::atomic<bool>* flag_ = nullptr;
  int64_t every_ = 1;
  kernels::Backend* backend_ = nullptr;
  kernels::DeviceBuffer buffer_;
  std::unique_ptr<PreparedAllReduce> reduce_;
};

// Compares a BLAKE2b digest of every rank's parameters; DataLoss naming the ranks that differ
// from rank 0.
Status CheckReplicas(Collective& c, models::Trainer& trainer, Scratch& scratch, int64_t step);

// Rank 0's resume state (or a fresh start), on every rank: the parameters are already uploaded on
// rank 0; this broadcasts the position and the momentum. Rank 0 checks the state first and, if it
// does not fit, every rank stops with the reason (on rank 0) or a pointer to rank 0's log.
struct ResumeHeader {
  int64_t refused = 0;
  int64_t epochs_done = 0;
  int64_t steps = 0;
  int64_t has_velocity = 0;
  double seconds = 0;
  int64_t epoch_rows = 0;  // a stop within epoch epochs_done: the rows of it already trained
};
StatusOr<ResumeHeader> ShareResume(Collective& c, Scratch& scratch, models::Trainer& trainer,
                                   const DataParallelOptions& options, int64_t n, const Status& fit,
                                   Status* refusal);

// DataParallelDpSgd's sampling stream on every rank: the single process's (its key is the first
// bytes of rank 0's noise source), broadcast from rank 0 with whether the noise is private.
StatusOr<privacy::NoiseSource> ShareSamplingStream(Collective& c, Scratch& scratch,
                                                   privacy::NoiseSource* noise,
                                                   bool* private_noise);

}  // namespace huddle::datacenter::internal
