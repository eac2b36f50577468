// Internal to models/: the training loops of TrainMlp and TrainMlpDpSgd, run on a workspace the
// caller prepared, so that TrainUpdate (models/update.h) can train and then compute the update
// without the model leaving the device. Not part of the public API.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "models/dp_sgd.h"
#include "models/internal/mlp_workspace.h"
#include "models/mlp.h"
#include "privacy/noise.h"

namespace huddle::models::internal {

// TrainMlp's epochs over the n loaded rows, on ws (parameters uploaded, data loaded, options and
// data checked). Fills stats except seconds. On divergence: FailedPrecondition, and ws holds the
// diverged parameters; a device fault is returned as the backend reports it.
Status RunSgdEpochs(MlpWorkspace& ws, const TrainOptions& options, int64_t n, uint64_t seed,
                    TrainStats* stats);

// TrainMlpDpSgd's checks and its plan for a view of n rows.
struct DpSgdPlan {
  int64_t steps = 0;        // round(epochs * n / expected_batch_size), >= 1
  int64_t capacity = 0;     // workspace rows to reserve for a typical Poisson sample
  bool add_noise = false;   // noise_multiplier > 0
  privacy::NoiseGrid grid;  // the discrete Gaussian's grid (when add_noise)
};
StatusOr<DpSgdPlan> PlanDpSgd(const MlpSpec& spec, const TrainOptions& options,
                              const DpSgdOptions& dp, int64_t n);

// One DP-SGD step at a time on a workspace (the body of RunDpSgdSteps, also timed by
// bench/kernels_bench.cc). Holds the per-example norm and factor buffers and the noise stream's
// position. ws, noise must outlive it.
class DpSgdStepper {
 public:
  // Draws the device noise key from `noise` when the backend is a GPU and the plan adds noise.
  DpSgdStepper(MlpWorkspace& ws, const DpSgdPlan& plan, const TrainOptions& options,
               const DpSgdOptions& dp, privacy::NoiseSource& noise);
  // Room for batches of up to `rows` rows (grows the workspace too, dropping its batch: reserve
  // before Gather).
  Status Reserve(int64_t rows);
  // One step on the batch of `batch` <= reserved rows that ws has gathered (0: an empty sample,
  // noise only): ghost-norm clipping, the clipped sum, noise, division by the expected batch
  // size, the SGD step. `step` names the step in a divergence error (CPU: a non-finite sum).
  Status Step(int64_t batch, int64_t step);
  // Step without the SGD update: leaves (clipped sum + noise) / expected_batch_size in ws.grad().
  // A data-parallel rank sums these across ranks; only one rank's plan adds noise.
  Status NoisyGradient(int64_t batch, int64_t step);

 private:
  MlpWorkspace* ws_;
  DpSgdPlan plan_;
  privacy::NoiseSource* noise_;
  bool host_noise_;  // the CPU adds privacy/noise.h's discrete Gaussian on the host
  double stddev_, clip_norm_, divisor_, learning_rate_;
  kernels::SgdHyper hyper_;
  kernels::NoiseKey key_;
  uint64_t noise_offset_ = 0;
  int64_t capacity_ = 0;
  kernels::DeviceBuffer squared_, factors_;  // per-example squared norms, clip factors
};

// TrainMlpDpSgd's steps on ws (created with plan.capacity rows; parameters uploaded, data loaded).
// Fills stats except train.seconds. Divergence and faults as for RunSgdEpochs; the final
// parameters are NOT checked for finiteness (the caller does, on the host or on the device).
Status RunDpSgdSteps(MlpWorkspace& ws, const DpSgdPlan& plan, const TrainOptions& options,
                     const DpSgdOptions& dp, int64_t n, privacy::NoiseSource& noise,
                     DpSgdStats* stats);

// The status of a run that diverged (FailedPrecondition): its parameters are handed back anyway.
inline bool IsDiverged(const Status& status) { return absl::IsFailedPrecondition(status); }

}  // namespace huddle::models::internal
