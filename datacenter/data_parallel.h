// Synchronous data-parallel training of a models::ModelSpec across the ranks of a Collective: the
// datacenter mode's trainer, and a silo's local training.
//
// Every rank holds the whole dataset and draws the same shuffled order each epoch (from `seed`);
// each global batch of world_size x batch_size rows (or global_batch_size) is split into
// contiguous per-rank slices (rank r takes the r-th), so N ranks with batch b follow the same
// trajectory as one rank with batch N*b, up to the order of floating-point sums. The loop is the
// federated client's own (models::Trainer, models/trainer.h); this trainer fills its
// GradientSync seam with the collectives. A step:
//   1. forward and backward on the rank's slice;
//      the loss gradient is scaled by slice / global batch, so that every rank differentiates
//      its share of the global batch's mean loss;
//   2. as each layer's gradients are ready, its bucket (buckets of about bucket_bytes, a small
//      first one, in reverse layer order) is handed to a communication thread that all-reduces
//      it while backward goes on;
//   3. once every bucket is reduced, the identical SGD step on every rank.
// A batch-norm model (a batch_norm layer) normalises with the statistics of the global batch
// (SyncBatchNorm): each batch-norm layer all-reduces its per-feature sums in the forward pass
// and again in the backward pass (kernels/batch_norm.h), on the training thread and after the
// buckets handed over before it, so the result is one process's batch norm on the concatenated
// batch, running statistics included. Ranks whose slice is empty still take part.
// Parameters are broadcast from rank 0 before the first step. Every checksum_every steps, and at
// the end, the ranks compare a BLAKE2b digest of their parameters: replicas that differ stop the
// job with DataLoss naming the step and the ranks. A collective error (a rank died or hung) ends
// training on every rank with that error.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>

#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "datacenter/collective.h"
#include "models/dp_sgd.h"
#include "models/model.h"
#include "privacy/accountant.h"
#include "privacy/noise.h"

namespace huddle::datacenter {

// Everything a resume needs, taken at the end of an epoch: resuming from it gives the same bits
// as the run that wrote it would have produced (the data order of epoch e depends only on the
// seed and e).
struct TrainingState {
  int64_t epochs_done = 0;
  int64_t steps = 0;
  uint64_t seed = 0;
  int64_t world_size = 0;  // of the run that wrote it (for the record)
  int64_t batch_size = 0;  // per rank, ditto
  double seconds = 0;      // training time so far, over all sessions
  bool dp_sgd = false;     // written by a DP-SGD run (steps are DP-SGD steps)
  // A stop within epoch `epochs_done` (DataParallelOptions::stop): the rows of that epoch's
  // shuffled order already trained (whole global batches; all n when the stop came after its
  // last step, before its end-of-epoch report), and the epoch's loss sum and correct
  // count so far over all ranks, so that the resumed epoch reports the whole epoch. 0 at the end
  // of an epoch.
  int64_t epoch_rows = 0;
  double epoch_loss_sum = 0;
  double epoch_correct = 0;
  TensorList params;
  TensorList velocity;  // momentum, one per parameter; empty without momentum
};

struct EpochReport {
  int64_t epoch = 0;    // 0-based, just finished
  int64_t steps = 0;    // global steps so far
  double loss = 0;      // mean training loss of the epoch, over all ranks
  double accuracy = 0;  // fraction correct in the epoch, over all ranks
  double seconds = 0;   // training time so far (with the sessions before a resume)
  double epoch_seconds = 0;
  int64_t epochs = 0;  // of the whole run (DP-SGD: ceil(steps / ceil(n / expected batch)))
  bool last = false;   // the run's last epoch
  // Rank 0 with DataParallelOptions::state_on_rank0: the state after this epoch (for checkpoints
  // and evaluation). Null otherwise.
  const TrainingState* state = nullptr;
};

// DP-SGD across the ranks: models/dp_sgd.h's algorithm, step for step the single process's
// (the models::Trainer of every rank), with one release per global step.
//   - Every rank draws the same secret Poisson sample of the whole data set (rate q =
//     expected_batch_size / n, the GLOBAL expected batch) from a stream whose key rank 0 draws
//     from `noise` and broadcasts: the key TrainDpSgd draws from the same source.
//   - The sample is cut into models/dp_sgd.h's K chunks by position in the data set (not by
//     rank); rank r of W processes chunks [K r / W, K (r + 1) / W) (none when K < W and r is
//     low), clipping each chunk's examples (ghost norms) and rounding the chunk's clipped sum to
//     the noise grid, as integers in an int64 accumulator.
//   - Rank 0 alone adds the exact discrete Gaussian integers (from `noise`), once per global
//     step; the accumulators are all-reduced as int64 (exact, Collective::AllReduceSum), and
//     every rank converts the same integers into the same float gradient and takes the same step.
//   - Hence the released gradients, and the trained parameters, are BITWISE those of
//     TrainDpSgd (and of models::TrainUpdate with dp_sgd) with the same `noise` source state
//     and data, whatever the number of ranks (on CPU ranks; GPU ranks match each other when
//     their GEMMs do). A run of round(epochs * n / expected_batch_size) steps spends
//     DpEvent{q, z, steps} (DataParallelStats::dp_event), accounted by rank 0 with
//     privacy/accountant.h.
// train.batch_size is not used (the batch is sampled). The guarantee needs a private `noise`
// (NoiseSource::Secure) and trusted ranks: they all know the sample and see each other's chunk
// sums (rounded to the grid, not noised). A resume continues at the checkpoint's step with fresh
// streams (a new sampling key from `noise`): every step is still one independent release of the
// same mechanism, so the total spend is that of all steps; the run is then not bitwise the
// uninterrupted one (whose randomness is not stored: a stored noise key would let anyone who
// reads the checkpoint remove the noise).
struct DataParallelDpSgd {
  models::DpSgdOptions dp;
  privacy::NoiseSource* noise = nullptr;  // rank 0's; not owned; ignored on the other ranks
};

struct DataParallelOptions {
  // epochs, per-rank batch_size, learning_rate, momentum, weight_decay and the backend (nullptr:
  // the CPU). The backend must suit the collective: host memory for Gloo, the GPU for NCCL.
  models::TrainOptions train;
  uint64_t seed = 0;  // data order; the same on every rank
  // > 0: the rows of one global step, split over the ranks (slice r of a global batch of m rows
  // is [m * r / world, m * (r + 1) / world)), and train.batch_size is not used. A silo uses it
  // to train exactly as one client with that batch would. 0: world_size x train.batch_size.
  int64_t global_batch_size = 0;
  int64_t bucket_bytes = 25 << 20;       // gradient bucket size
  int64_t first_bucket_bytes = 1 << 20;  // the first (last layers') bucket, to start early
  int64_t checksum_every = 0;            // steps between replica checks; 0: at the end only
  bool overlap = true;                   // false: reduce every bucket after backward
  // Called on every rank after each epoch; an error stops training and is returned.
  std::function<Status(const EpochReport&)> on_epoch;
  bool state_on_rank0 = false;  // fill EpochReport::state on rank 0 (one download per epoch)
  // Resume: read on rank 0 only and broadcast (the other ranks need no copy of the checkpoint).
  // Its seed must equal `seed` and its tensors the model; training continues at epochs_done.
  const TrainingState* resume = nullptr;
  // DP-SGD instead of epochs of shuffled minibatches (see DataParallelDpSgd).
  std::optional<DataParallelDpSgd> dp_sgd;
  // Stopping on request (a signal). When *stop is set on ANY rank, every rank stops after the
  // same step: every stop_check_every steps the ranks sum their flags in one all-reduce of a
  // single double (prepared once; at world size 1 just a load), so all ranks see the same answer
  // at the same step, and a stop takes effect within stop_check_every steps (plus the step
  // running). Then rank 0 (with state_on_rank0, and not with DP-SGD, whose ledger counts whole
  // epochs) passes the state reached, mid-epoch, to on_stop (e.g. to write a checkpoint that a
  // resume continues from exactly), and every rank returns Cancelled. Null: never checked.
  const std::atomic<bool>* stop = nullptr;
  int64_t stop_check_every = 8;
  std::function<Status(const TrainingState&)> on_stop;
  // Fault injection for tests: called after every step with the packed parameters (on the
  // training device) and their count, to corrupt a replica the way failing hardware would.
  std::function<void(int64_t step, float* params, int64_t count)> after_step_for_testing;
};

struct DataParallelStats {
  int64_t steps = 0;
  int64_t examples = 0;  // rows this rank trained on
  double loss = 0;       // of the last epoch, over all ranks
  double accuracy = 0;
  double seconds = 0;
  double reduce_seconds = 0;  // inside AllReduceSum calls on the communication thread
  double wait_seconds = 0;    // the step waiting for reductions after its backward
  int64_t bytes_reduced = 0;  // gradient bytes all-reduced (DP-SGD: int64 units, 8 per value)
  int64_t buckets = 0;        // per step (DP-SGD: 1, the exact sum's one int64 all-reduce)
  int64_t checksums = 0;      // replica checks passed
  // With DP-SGD: what the run spent (q, z, steps), for privacy::ComputeEpsilon; and whether the
  // noise came from a private source (rank 0's NoiseSource::is_private, known on every rank).
  std::optional<privacy::DpEvent> dp_event;
  bool private_noise = false;
};

// Checks the options (errors name the field).
Status ValidateDataParallelOptions(const DataParallelOptions& options);

// Trains *params in place on every rank (rank 0's initial values, or its resume state, win) and
// leaves every rank with identical parameters. `data` must be the same on every rank: before the
// first step the ranks compare a digest of the model, the options that shape the trajectory and
// the seed, and a BLAKE2b digest of the data itself (every example's features and label, in the
// view's order), and refuse to start (FailedPrecondition naming the ranks that differ from rank
// 0, and whether the configuration or the data differs) when they differ. Cancelled when
// stopped on request (options.stop).
StatusOr<DataParallelStats> TrainDataParallel(Collective& collective, const models::ModelSpec& spec,
                                              const DataParallelOptions& options,
                                              const data::DatasetView& data, TensorList* params);

}  // namespace huddle::datacenter
