// Datacenter checkpoints: a TrainingState in one file, written by rank 0 after an epoch.
//
//   "HUDDLED2" (8 bytes), u64 epochs_done, u64 steps, u64 seed, u64 world_size, u64 batch_size,
//   f64 seconds (as u64 bits), u64 flags (bit 0: DP-SGD), u64 epoch_rows, f64 epoch_loss_sum,
//   f64 epoch_correct (a stop within an epoch; 0 otherwise), tensor list params, tensor list
//   velocity (common/tensor_io.h), then a 32-byte BLAKE2b digest of everything before it.
//   "HUDDLED1" files (before stops within an epoch) lack the three epoch_ fields and still read.
//
// The write is atomic (temporary file, fsync, rename, directory fsync): a job killed at any
// moment leaves the previous checkpoint or the new one, never a torn file. The digest catches a
// file damaged afterwards; every length is checked before it is used.
#pragma once

#include <string>

#include "common/status.h"
#include "datacenter/data_parallel.h"

namespace huddle::datacenter {

inline constexpr char kDatacenterCheckpointFile[] = "checkpoint.bin";

Status WriteTrainingState(const std::string& path, const TrainingState& state);
// DataLoss naming the file and what is wrong when it is not a whole, undamaged checkpoint.
StatusOr<TrainingState> ReadTrainingState(const std::string& path);

}  // namespace huddle::datacenter
