// A client's local work for one round, on one device: train from the global model, then turn the
// trained model into the update it sends.
//
//   delta = local - global, its L2 norm, and clipping to clip_norm
//
// delta is taken where the model lives, by the update pipeline (kernels/update.h), so on a GPU the
// model travels once each way per round: the global model up, the delta down. The clip is
// ClipUpdate, run once on the host over the delta's tensors in Layout order (the vector the
// coordinator receives; the device's buffer has gaps between tensors, which would change the
// norm's summation order and so the clipped bits). Training is TrainModel's SGD, or TrainDpSgd's
// DP-SGD when options.dp_sgd is set, with the same semantics (models/model.h, models/dp_sgd.h).
//
// Local DP noise on the update is NOT added here: the caller adds privacy/noise.h's exact discrete
// Gaussian to the returned delta on the host (it costs about 0.12 us per parameter), so the
// update's guarantee is the same on every device.
//
// Thread-safety: stateless; concurrent calls are safe on different backends and NoiseSources.
#pragma once

#include <cstdint>
#include <optional>

#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "models/dp_sgd.h"
#include "models/model.h"
#include "privacy/noise.h"

namespace huddle::models {

struct UpdateOptions {
  TrainOptions train;                     // includes the backend (nullptr: the CPU)
  uint64_t seed = 0;                      // SGD's shuffling (TrainModel's seed)
  std::optional<DpSgdOptions> dp_sgd;     // train with DP-SGD instead of SGD
  privacy::NoiseSource* noise = nullptr;  // DP-SGD's sampling and noise; required with dp_sgd
  double clip_norm = 0;                   // > 0: clip the delta's L2 norm to this; 0: no clipping
};

struct Update {
  // local - global in Layout order, clipped by ClipUpdate: privacy::L2Norm(delta) <= clip_norm,
  // float rounding included.
  TensorList delta;
  double norm = 0;       // L2 norm of local - global before clipping (finite)
  bool clipped = false;  // clip_norm > 0 and norm > clip_norm
  TrainStats train;      // the training run; with DP-SGD, dp_sgd->train
  std::optional<DpSgdStats> dp_sgd;
};

// Trains a copy of `global` on `data` as options say and returns the update.
// Errors: those of TrainModel / TrainDpSgd (InvalidArgument for bad options or data, naming the
// field; FailedPrecondition "diverged"); InvalidArgument for a clip_norm that is negative or not
// finite or a missing NoiseSource; FailedPrecondition when the delta has a non-finite value. No
// partial result is returned.
StatusOr<Update> TrainUpdate(const ModelSpec& spec, const UpdateOptions& options,
                             const data::DatasetView& data, const TensorList& global);

// TrainUpdate's checks of `options` that do not depend on the model or the data: clip_norm finite
// and >= 0, a NoiseSource with dp_sgd (InvalidArgument naming the field).
Status CheckUpdateOptions(const UpdateOptions& options);

// TrainUpdate's update rule for a model trained elsewhere (a silo's ranks, a user's trainer), on
// the host: delta = local - global in place in `local`'s tensors, then ClipUpdate. Fills delta,
// norm and clipped; `train` and `dp_sgd` are left empty. local and global must have the same
// layout. FailedPrecondition when the delta is not finite.
StatusOr<Update> UpdateFromTrained(TensorList local, const TensorList& global, double clip_norm);

// The client's clip, the one every update goes through once (TrainUpdate and UpdateFromTrained end
// with it; a trainer's delta goes through it alone): update->delta scaled in place by the update
// pipeline's factor (kernels::ClipInPlace: the norm in kernels/update_math.h's order over the
// tensors in order, factor (C / norm)(1 - 2^-20) when norm > C). That norm is privacy::L2Norm, the
// one receivers check, and the factor's margin keeps the clipped delta's norm at most C (checked
// once more by privacy::ClipToNorm when the delta was clipped, a no-op by that margin). Sets
// update->norm (before clipping) and update->clipped. clip_norm: >= 0 and finite, 0 for no
// clipping. FailedPrecondition ("training diverged") when the delta has a non-finite value; the
// delta is then unspecified.
Status ClipUpdate(double clip_norm, Update* update);

}  // namespace huddle::models
