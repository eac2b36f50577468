// The one training loop of every mode: a federated client's local training (TrainModel,
// TrainDpSgd, TrainUpdate), the in-process simulation, a silo and `huddle datacenter` all step a
// Trainer. It holds the model on one kernels::Backend for the whole run and runs, step by step,
// forward, backward and the optimizer step (SGD), or DP-SGD's Poisson-sampled, per-example
// clipped, exactly noised step (models/dp_sgd.h), over the loaded data.
//
// Gradient synchronisation is a seam (GradientSync): a federated client passes none; the
// datacenter trainer (datacenter/data_parallel.h) passes its bucketed all-reduce, and then the
// Trainer is one rank of `world`:
//   - SGD: each epoch's shuffled order (from the seed and the epoch) is cut into global batches of
//     global_batch rows; rank r takes the r-th contiguous slice [m r / world, m (r + 1) / world)
//     of a batch of m rows, scales its loss gradient by slice / m (so that the ranks' gradients
//     sum to the global batch's), hands each layer's gradients to the sync as backward produces
//     them, waits for the sum, and takes the same SGD step as every other rank. Batch-norm layers
//     normalise with the global batch's statistics through the same seam (SyncBatchNorm).
//   - DP-SGD: every rank draws the same Poisson sample (the caller gives every rank the same
//     sampling stream) and processes its share of the step's chunks; the exact int64 sums are
//     added over the ranks through the seam; rank 0 alone adds the noise.
// At world 1 without a sync the loop is exactly the single process's (bitwise: the scaling and the
// hand-offs are skipped).
//
// Thread-safety: one thread at a time; the sync's methods are called on that thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "kernels/backend.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "models/dp_sgd.h"
#include "models/model.h"
#include "privacy/noise.h"

namespace huddle::models {

namespace internal {
class NetWorkspace;
class DpSgdStepper;
}  // namespace internal

// How the ranks of a data-parallel run sum what each computed. Every method is called on the
// training thread, on every rank in the same order (a collective may be prepared on first use:
// the buffers passed are the same from step to step).
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // An SGD step begins; its global batch has global_rows >= 1 rows over all ranks.
  virtual void StartStep(int64_t global_rows) = 0;
  // Layer `layer`'s parameter gradients (see Trainer::layout) have been enqueued on the backend;
  // called for every layer, last to first, during backward (or after it, without overlap).
  virtual void LayerDone(size_t layer) = 0;
  // After the last LayerDone: returns once every gradient holds its sum over the ranks; the first
  // error of the step's collective operations (which stops training on every rank).
  virtual Status FinishStep() = 0;
  // SyncBatchNorm: sums the `count` doubles at `sums` (backend memory, kernels possibly pending)
  // over the ranks in place, in the step's order of collective operations. A failure is kept
  // and returned by FinishStep.
  virtual void AllReduceBatchNormSums(double* sums, int64_t count) = 0;
  // DP-SGD: sums the step's exact sum (int64, backend memory, kernels possibly pending; the same
  // buffer every step) over the ranks in place, wrapping.
  virtual Status AllReduceUnits(std::span<int64_t> units) = 0;
};

// Where the trainable parameters' gradients live (Trainer::gradients()): parameter i at
// offsets[i], sizes[i] floats; layer l's parameters are [first_param[l], first_param[l + 1]).
// A data-parallel trainer cuts its all-reduce buckets from this.
struct GradientLayout {
  std::vector<int64_t> offsets, sizes;
  std::vector<size_t> first_param;  // num_layers + 1 entries
  int64_t span = 0;                 // floats of gradients() (trainable parameters and gaps)
};

class Trainer {
 public:
  struct Loop {
    uint64_t seed = 0;             // data order (epoch e: DeriveSeed(seed, e)) and dropout
    int rank = 0, world = 1;       // this process's share of every step
    int64_t global_batch = 0;      // SGD: rows of one step over all ranks; 0: train.batch_size
    GradientSync* sync = nullptr;  // required when world > 1
    bool overlap = true;           // hand layers to the sync during backward (false: after it)
    std::optional<DpSgdOptions> dp_sgd;  // DP-SGD steps instead of epochs of minibatches
    // DP-SGD: the noise (rank 0; required when dp_sgd->noise_multiplier > 0), not owned.
    privacy::NoiseSource* noise = nullptr;
  };
  // Called after every step with the rows of the epoch done so far (SGD: the epoch's order's
  // positions [0, rows) are trained; DP-SGD: the rows sampled in this epoch's steps so far).
  using AfterStep = std::function<Status(int64_t epoch_rows)>;
  // Called after every epoch (DP-SGD: every ceil(n / expected_batch_size) steps, and after the
  // last), with the loss totals of its steps still in ReadTotals.
  using EndEpoch = std::function<Status(int64_t epoch, int64_t epoch_rows)>;

  // Checks the options, the model and the data (errors name the field or the row), then
  // allocates the model's buffers on train.backend (nullptr: a CPU backend the Trainer owns) and
  // makes `data` addressable (the CPU reads it in place: it must outlive the Trainer). The
  // parameters are zero until UploadParams.
  static StatusOr<std::unique_ptr<Trainer>> Create(const ModelSpec& spec, const TrainOptions& train,
                                                   const data::DatasetView& data, Loop loop);
  ~Trainer();

  // SGD: epochs [first_epoch, train.epochs); the first of them from position first_row of its
  // order (a resume within an epoch; a multiple of global_batch). Totals are reset at each epoch's
  // start. Hooks may be empty.
  Status TrainEpochs(int64_t first_epoch, int64_t first_row, const AfterStep& after_step,
                     const EndEpoch& end_epoch);
  // DP-SGD: steps [first_step, dp_steps()), each on a Poisson sample drawn from `sampling` (the
  // same stream on every rank). An empty sample still adds the noise and steps. A chunk sum off
  // the noise grid's range on any rank is FailedPrecondition ("diverged") before the parameters
  // change.
  Status TrainDpSgd(int64_t first_step, privacy::NoiseSource& sampling, const AfterStep& after_step,
                    const EndEpoch& end_epoch);
  // The run's DP-SGD steps, round(epochs * n / expected_batch_size); 0 without DP-SGD.
  int64_t dp_steps() const;
  // The key of a DP-SGD run's sampling stream: the first 32 bytes drawn from `noise`. Use
  // privacy::NoiseSource::FromSharedKey(key, noise.is_private()); a data-parallel run draws it on
  // rank 0 and broadcasts it, so that every rank draws the sample one process would.
  static std::array<unsigned char, 32> DrawSamplingKey(privacy::NoiseSource& noise);

  // One SGD step on the global batch at positions [begin, begin + rows) of the current order
  // (TrainEpochs sets it; SetOrder for a caller that steps by hand).
  Status SgdStep(int64_t begin, int64_t rows);
  // The parameter-server mode's worker (datacenter/parameter_server.h): SgdStep without the
  // optimizer step, on a trainer of one rank (no sync, no DP-SGD): forward and backward on the
  // positions [begin, begin + rows) of the current order (rows <= the global batch), leaving
  // gradients() holding the gradient of the batch's mean loss and adding its loss to the totals.
  // Dropout's masks follow steps() (set_steps). The step counter does not move. Returns rows.
  StatusOr<int64_t> ComputeGradient(int64_t begin, int64_t rows);
  Status SetOrder(const std::vector<int64_t>& positions);
  // One DP-SGD step on `sample` (increasing positions of the data); returns the rows this rank
  // processed.
  StatusOr<int64_t> DpSgdStep(const std::vector<int64_t>& sample, int64_t step);

  // The run's epochs (DP-SGD: ceil(dp_steps() / ceil(n / expected_batch_size))) and the one being
  // trained (0-based).
  int64_t epochs() const;
  int64_t epoch() const { return epoch_; }
  // Steps taken (with the count a resume starts from, set_steps) and rows this rank trained.
  int64_t steps() const { return steps_; }
  int64_t examples() const { return examples_; }
  // A resume: the steps already taken (dropout's masks continue where the run left them).
  void set_steps(int64_t steps);

  // The loss totals since the last reset (waits for the device).
  StatusOr<kernels::LossAccumulator> ReadTotals();
  void ResetTotals();

  // The model: one upload before training, one download after (which waits). Precondition of
  // UploadParams: CheckParams(spec, params).ok().
  void UploadParams(const TensorList& params);
  Status DownloadParams(TensorList* params);
  // Momentum buffers (empty before a step with momentum): for checkpoints. UploadVelocity
  // allocates them; `velocity` must be empty or match the parameters.
  Status DownloadVelocity(TensorList* velocity);
  Status UploadVelocity(const TensorList& velocity);
  // Allocates zeroed momentum buffers unless they exist; parameter i's (trainable i).
  Status EnsureVelocity();
  std::span<float> velocity(size_t i) const;
  // The parameters in backend memory, packed (every tensor at a 256-byte aligned offset, gaps
  // zero): what a data-parallel run broadcasts and checksums. UnpackParams reads a host copy of
  // it back into tensors.
  std::span<float> params() const;
  void UnpackParams(const std::vector<float>& packed, TensorList* params) const;
  // The trainable parameters' gradients in backend memory and their layout.
  std::span<float> gradients() const;
  const GradientLayout& layout() const { return layout_; }
  kernels::Backend& backend() const { return *backend_; }

 private:
  class BatchNormAdapter;
  Trainer(const TrainOptions& train, Loop loop, int64_t n);
  int64_t DpStepsPerEpoch() const;  // ceil(n / expected_batch_size)
  // SgdStep up to the optimizer step (sync included); returns this rank's rows.
  StatusOr<int64_t> Gradient(int64_t begin, int64_t m);

  TrainOptions train_;
  Loop loop_;
  int64_t n_;
  kernels::SgdHyper hyper_;
  int64_t global_batch_ = 0;
  std::unique_ptr<kernels::Backend> owned_backend_;
  kernels::Backend* backend_ = nullptr;
  std::unique_ptr<internal::NetWorkspace> ws_;
  std::unique_ptr<internal::DpSgdStepper> stepper_;
  std::unique_ptr<BatchNormAdapter> batch_norm_;
  int64_t dp_steps_ = 0;
  GradientLayout layout_;
  std::vector<int64_t> order_;
  kernels::DeviceBuffer factor_;  // slice / global batch, on the device (world > 1)
  float last_factor_;
  int64_t steps_ = 0, examples_ = 0;
  int64_t epoch_ = 0;
};

// The error of a run whose training loss became non-finite in `epoch` (FailedPrecondition,
// "training diverged"), for a Trainer's EndEpoch hook.
Status LossDiverged(int64_t epoch, double learning_rate);

// The TrainOptions checks of every trainer (errors name the field).
Status CheckTrainOptions(const TrainOptions& options);
// Checks params against the spec and every row of the view against the model (non-empty view,
// feature_dim == the input's size, labels in [0, num_classes())).
Status CheckModelAndData(const ModelSpec& spec, const TensorList& params,
                         const data::DatasetView& view);
// The data half of CheckModelAndData. Precondition: ValidateModelSpec(spec).ok().
Status CheckData(const ModelSpec& spec, const data::DatasetView& view);

}  // namespace huddle::models
