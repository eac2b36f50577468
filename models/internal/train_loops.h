// Internal to models/: DP-SGD's plan and step (the Trainer's), and the one-process runs of
// TrainModel and TrainDpSgd on a Trainer the caller prepared, so that TrainUpdate
// (models/update.h) can train and then compute the update without the model leaving the device.
// Not part of the public API (models/trainer.h is).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/status.h"
#include "models/dp_sgd.h"
#include "models/internal/net_workspace.h"
#include "models/model.h"
#include "models/trainer.h"
#include "privacy/noise.h"

namespace huddle::models::internal {

// One process's runs on a Trainer (parameters uploaded): TrainModel's epochs (fills stats except
// seconds) and TrainDpSgd's steps (the sampling key drawn from `noise` first; fills stats except
// train.seconds). The running loss is read once per epoch; a non-finite one is FailedPrecondition
// ("diverged") and the trainer holds the diverged parameters. The final parameters are NOT
// checked for finiteness (the caller does, on the host or on the device). A device fault is
// returned as the backend reports it.
// The loss totals of the epochs trained so far, read from the trainer once per epoch (one wait).
struct EpochTotals {
  double loss_sum = 0, correct = 0;
  // Adds the totals of the epoch just trained; false when its loss is not finite (a non-finite
  // loss stays non-finite in the running sum).
  StatusOr<bool> Add(Trainer& trainer) {
    HUDDLE_ASSIGN_OR_RETURN(const kernels::LossAccumulator totals, trainer.ReadTotals());
    loss_sum += totals.loss_sum;
    correct += static_cast<double>(totals.correct);
    return std::isfinite(totals.loss_sum);
  }
};
Status RunSgdEpochs(Trainer& trainer, const TrainOptions& options, int64_t n, TrainStats* stats);
Status RunDpSgdSteps(Trainer& trainer, const TrainOptions& options, const DpSgdOptions& dp,
                     int64_t n, privacy::NoiseSource& noise, DpSgdStats* stats);

// DP-SGD's chunks: example i of an n-row view belongs to chunk floor(i * K / n), K =
// ceil(expected_batch_size / kDpSgdChunkRows), so chunk j holds the view positions
// [ceil(j n / K), ceil((j + 1) n / K)) (see models/dp_sgd.h).
inline constexpr int64_t kDpSgdChunkRows = 256;

// TrainDpSgd's checks and its plan for a view of n rows.
struct DpSgdPlan {
  int64_t steps = 0;       // round(epochs * n / expected_batch_size), >= 1
  int64_t n = 0;           // rows of the view
  int64_t chunks = 0;      // K, in [1, n]
  int64_t capacity = 0;    // workspace rows to reserve for a typical chunk's sample
  bool add_noise = false;  // noise_multiplier > 0
  // The exact sum's grid 2^grid.exponent; with noise, NoiseGridFor(z, C, d, 2K) (grid.variance
  // is then the discrete Gaussian's); without, the finest grid whose chunk sums fit (variance 0).
  privacy::NoiseGrid grid;
  // The largest |units| one chunk's sum may add to a coordinate: 2^62 / K, so that K chunks plus
  // the noise (|k| <= 2^37) stay below 2^63. A larger value is refused as diverged.
  double chunk_limit = 0;
  int64_t chunk_begin(int64_t j) const {  // ceil(j n / K), in 128 bits
    return static_cast<int64_t>((static_cast<__int128>(j) * n + chunks - 1) / chunks);
  }
};
StatusOr<DpSgdPlan> PlanDpSgd(const ModelSpec& spec, const TrainOptions& options,
                              const DpSgdOptions& dp, int64_t n);

// The key of a DP-SGD run's Poisson sampling stream: the first 32 bytes drawn from `noise`
// (four NextU64 words, little-endian). Use privacy::NoiseSource::FromSharedKey(key,
// noise.is_private()); a data-parallel job draws it on rank 0 and broadcasts it, so every rank
// draws the sample the single process would.
std::array<unsigned char, 32> DrawSamplingKey(privacy::NoiseSource& noise);

// One DP-SGD step at a time on a workspace: the step of models/dp_sgd.h, the Trainer's on every
// rank (one process, or each rank of a data-parallel run). Holds the per-example norm and factor
// buffers, the int64 accumulator of the exact sum and the noise staging. ws (and `noise`) must
// outlive it.
//
// Rank r of `world` processes the chunks [K r / world, K (r + 1) / world) of every step (one
// process: all K). Each chunk's clipped gradient sum is computed on its own rows and added, on
// the grid, into units(); rank 0 then adds the noise; `all_reduce` (world > 1) sums units()
// over the ranks; every rank converts the same integers into the same float gradient. Hence the
// released gradient, and the parameters, do not depend on world (on one kind of device).
class DpSgdStepper {
 public:
  // plan and dp from PlanDpSgd; `noise` supplies the discrete Gaussian noise: required when
  // plan.add_noise and rank == 0, ignored (may be null) otherwise. Reserves plan.capacity rows.
  static StatusOr<std::unique_ptr<DpSgdStepper>> Create(NetWorkspace& ws, const DpSgdPlan& plan,
                                                        const TrainOptions& options,
                                                        const DpSgdOptions& dp,
                                                        privacy::NoiseSource* noise, int rank = 0,
                                                        int world = 1);

  // The step's exact sum, in the backend's memory: ws.trainable_span() int64 coordinates in the
  // parameters' layout, then one count of the values a chunk sum could not put on the grid (too
  // large or not finite). Fixed for the stepper's life (a collective may be prepared on it).
  int64_t* units() const { return units_.as<int64_t>(); }
  int64_t units_count() const { return span_ + 1; }
  // Sums units() over the ranks in place (wrapping int64 addition; every rank gets the same
  // integers). Called with the step's kernels possibly still pending on the backend (a GPU's
  // callback synchronises first). Required when world > 1; never called at world 1.
  void set_all_reduce(std::function<Status()> all_reduce) { all_reduce_ = std::move(all_reduce); }

  // One step on the Poisson sample `sample` (increasing positions of the loaded view; the same
  // on every rank): this rank's chunks, the noise (rank 0), the all-reduce, the released gradient
  // float(units * g / expected_batch_size) into ws.grad(), then TrainOptions' SGD step. Returns
  // the sampled rows this rank processed. An empty sample still adds the noise and steps. A chunk
  // sum off the grid's range (non-finite, or beyond chunk_limit) on any rank is FailedPrecondition
  // ("diverged", naming `step`) on every rank, before the parameters change.
  StatusOr<int64_t> Step(const std::vector<int64_t>& sample, int64_t step);
  // Step without the SGD update: leaves the released gradient in ws.grad().
  StatusOr<int64_t> Gradient(const std::vector<int64_t>& sample, int64_t step);

  // Waits for a noise draw in progress (see Gradient).
  ~DpSgdStepper();

 private:
  DpSgdStepper(NetWorkspace& ws, const DpSgdPlan& plan, const TrainOptions& options,
               const DpSgdOptions& dp, privacy::NoiseSource* noise, int rank, int world);
  Status Reserve(int64_t rows);
  // The next span_ draws of the noise stream, one per trainable coordinate in layout order.
  void DrawNoise(std::vector<int64_t>& out);

  NetWorkspace* ws_;
  DpSgdPlan plan_;
  privacy::NoiseSource* noise_;  // null where this rank adds no noise
  std::optional<privacy::DiscreteGaussian> gaussian_;
  int world_;
  int64_t first_chunk_, end_chunk_;  // this rank's chunks
  int64_t span_;                     // ws.trainable_span()
  double clip_norm_, divisor_, learning_rate_;
  kernels::SgdHyper hyper_;
  std::function<Status()> all_reduce_;
  int64_t capacity_ = 0;
  kernels::DeviceBuffer squared_, factors_;  // per-example squared norms, clip factors
  kernels::DeviceBuffer units_;              // span_ + 1 int64: the exact sum, then rejections
  kernels::DeviceBuffer noise_units_;        // span_ int64: the step's noise, uploaded
  std::vector<int64_t> noise_host_;          // its host staging (gaps zero)
  // The next step's noise, drawn on `prefetch_` while this step computes (joined before use).
  std::vector<int64_t> noise_next_;
  std::thread prefetch_;
  std::vector<int64_t> mine_;  // this rank's rows of the sample
};

// The status of a run that diverged (FailedPrecondition): its parameters are handed back anyway.
inline bool IsDiverged(const Status& status) { return absl::IsFailedPrecondition(status); }

}  // namespace huddle::models::internal
