// TrainUpdate: training and the update pipeline on one workspace; the client's one clip.
#include "models/update.h"

#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "kernels/flush_denormals.h"
#include "kernels/update.h"
#include "models/internal/train_loops.h"
#include "models/trainer.h"
#include "privacy/clip.h"

namespace huddle::models {

Status CheckUpdateOptions(const UpdateOptions& options) {
  if (!(options.clip_norm >= 0.0 && std::isfinite(options.clip_norm))) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip_norm is ", options.clip_norm, "; it must be finite and >= 0"));
  }
  if (options.dp_sgd && options.noise == nullptr) {
    return absl::InvalidArgumentError("DP-SGD needs a NoiseSource (UpdateOptions::noise)");
  }
  return absl::OkStatus();
}

Status ClipUpdate(double clip_norm, Update* update) {
  std::vector<std::span<float>> tensors;
  tensors.reserve(update->delta.size());
  for (Tensor& t : update->delta) tensors.emplace_back(t.data);
  kernels::UpdatePipelineParams params;
  params.clip_norm = clip_norm;
  kernels::UpdatePipelineStats stats;
  kernels::ClipInPlace(params, tensors, &stats);
  if (!std::isfinite(stats.norm)) {
    return absl::FailedPreconditionError(
        "training diverged: the update (local - global) has non-finite values");
  }
  update->norm = stats.norm;
  update->clipped = stats.scale != 1.0;
  // The margin keeps the clipped norm below C by about 2^-20 relative, far beyond the rounding of
  // the sums; ClipToNorm checks it in the same norm, so the bound is enforced, not only argued.
  if (update->clipped) privacy::ClipToNorm(&update->delta, clip_norm);
  return absl::OkStatus();
}

StatusOr<Update> UpdateFromTrained(TensorList local, const TensorList& global, double clip_norm) {
  // local - global in float, as the pipeline's first step takes it (kernels/update_math.h).
  for (size_t t = 0; t < global.size(); ++t) {
    std::vector<float>& l = local[t].data;
    const std::vector<float>& g = global[t].data;
    for (size_t i = 0; i < l.size(); ++i) l[i] -= g[i];
  }
  Update update;
  update.delta = std::move(local);
  HUDDLE_RETURN_IF_ERROR(ClipUpdate(clip_norm, &update));
  return update;
}

namespace {

// TrainUpdate up to the clip: training, and the unclipped delta taken on the device and
// downloaded. Subnormal floats are flushed to zero here, as in TrainModel; the clip runs without.
StatusOr<Update> TrainDelta(const ModelSpec& spec, const UpdateOptions& options,
                            const data::DatasetView& data, const TensorList& global) {
  const int64_t n = data.size();
  kernels::FlushDenormalsScope flush_denormals;
  Trainer::Loop loop;
  loop.seed = options.seed;
  if (options.dp_sgd) {
    loop.dp_sgd = *options.dp_sgd;
    loop.noise = options.noise;
  }
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                          Trainer::Create(spec, options.train, data, loop));
  kernels::Backend& backend = trainer->backend();
  // The model's one trip up; the global copy the delta is taken against stays on the device.
  trainer->UploadParams(global);
  const std::span<float> trained = trainer->params();
  const auto span = static_cast<int64_t>(trained.size());
  const int64_t bytes = span * static_cast<int64_t>(sizeof(float));
  HUDDLE_ASSIGN_OR_RETURN(kernels::DeviceBuffer global_copy, backend.Allocate(bytes));
  backend.CopyOnDevice(global_copy.data(), trained.data(), bytes);

  Update update;
  if (options.dp_sgd) {
    update.dp_sgd.emplace();
    HUDDLE_RETURN_IF_ERROR(internal::RunDpSgdSteps(*trainer, options.train, *options.dp_sgd, n,
                                                   *options.noise, &*update.dp_sgd));
  } else {
    HUDDLE_RETURN_IF_ERROR(internal::RunSgdEpochs(*trainer, options.train, n, &update.train));
  }

  // delta = local - global by the pipeline, unclipped, over the whole parameter buffer and in
  // place: the trained parameters become the delta (the gaps are zero in both copies and stay
  // zero). Then the model's one trip down, as the delta, and the clip (ClipUpdate: on the host,
  // in the receiver's order of the values).
  HUDDLE_ASSIGN_OR_RETURN(
      kernels::DeviceBuffer scratch,
      backend.Allocate(kernels::kUpdatePipelineScratch * static_cast<int64_t>(sizeof(double))));
  HUDDLE_ASSIGN_OR_RETURN(kernels::DeviceBuffer stats_buffer,
                          backend.Allocate(sizeof(kernels::UpdatePipelineStats)));
  backend.UpdatePipeline(kernels::UpdatePipelineParams{}, trained.data(), global_copy.as<float>(),
                         span, trained.data(), scratch.as<double>(),
                         stats_buffer.as<kernels::UpdatePipelineStats>());
  update.delta = global;  // the layout; every value is overwritten
  HUDDLE_RETURN_IF_ERROR(trainer->DownloadParams(&update.delta));
  return update;
}

}  // namespace

StatusOr<Update> TrainUpdate(const ModelSpec& spec, const UpdateOptions& options,
                             const data::DatasetView& data, const TensorList& global) {
  const Clock* clock = options.train.clock != nullptr ? options.train.clock : SteadyClock::Get();
  const int64_t start_ms = clock->NowMs();
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  HUDDLE_RETURN_IF_ERROR(CheckUpdateOptions(options));
  HUDDLE_RETURN_IF_ERROR(CheckParams(spec, global));  // the data: Trainer::Create
  HUDDLE_ASSIGN_OR_RETURN(Update update, TrainDelta(spec, options, data, global));
  HUDDLE_RETURN_IF_ERROR(ClipUpdate(options.clip_norm, &update));
  if (update.dp_sgd) update.train = update.dp_sgd->train;
  update.train.seconds = static_cast<double>(clock->NowMs() - start_ms) / 1000.0;
  if (update.dp_sgd) update.dp_sgd->train.seconds = update.train.seconds;
  return update;
}

}  // namespace huddle::models
