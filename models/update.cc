// TrainUpdate: training and the update pipeline on one workspace.
#include "models/update.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/flush_denormals.h"
#include "kernels/update.h"
#include "models/internal/train_loops.h"
#include "models/trainer.h"
#include "privacy/clip.h"

namespace huddle::models {

namespace {

// The end of the update rule, wherever the pipeline ran: the pipeline's delta and statistics into
// *update, and the exact bound.
Status FinishUpdate(TensorList delta, const kernels::UpdatePipelineStats& stats, double clip_norm,
                    Update* update) {
  if (!std::isfinite(stats.norm)) {
    return absl::FailedPreconditionError(
        "training diverged: the update (local - global) has non-finite values");
  }
  update->delta = std::move(delta);
  update->norm = stats.norm;
  update->clipped = stats.scale != 1.0;
  if (clip_norm > 0) {
    // The pipeline's bound holds in its summation order; a receiver checks with privacy::L2Norm,
    // whose order differs. A delta within an ulp of the bound is nudged below it here.
    privacy::ClipToNorm(&update->delta, clip_norm);
  }
  return absl::OkStatus();
}

}  // namespace

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

StatusOr<Update> UpdateFromTrained(const TensorList& local, const TensorList& global,
                                   double clip_norm) {
  // The tensors together as one vector, in order, as the device's packed buffer is.
  std::vector<float> l, g;
  for (size_t t = 0; t < global.size(); ++t) {
    l.insert(l.end(), local[t].data.begin(), local[t].data.end());
    g.insert(g.end(), global[t].data.begin(), global[t].data.end());
  }
  std::vector<float> packed(g.size());
  kernels::UpdatePipelineParams params;
  params.clip_norm = clip_norm;
  kernels::UpdatePipelineStats stats;
  kernels::UpdatePipeline(params, l.data(), g.data(), static_cast<int64_t>(g.size()), packed.data(),
                          nullptr, &stats);
  TensorList delta = global;
  auto next = packed.begin();
  for (Tensor& t : delta) {
    std::copy(next, next + static_cast<std::ptrdiff_t>(t.data.size()), t.data.begin());
    next += static_cast<std::ptrdiff_t>(t.data.size());
  }
  Update update;
  HUDDLE_RETURN_IF_ERROR(FinishUpdate(std::move(delta), stats, clip_norm, &update));
  return update;
}

StatusOr<Update> TrainUpdate(const ModelSpec& spec, const UpdateOptions& options,
                             const data::DatasetView& data, const TensorList& global) {
  const Clock* clock = options.train.clock != nullptr ? options.train.clock : SteadyClock::Get();
  const int64_t start_ms = clock->NowMs();
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  HUDDLE_RETURN_IF_ERROR(CheckUpdateOptions(options));
  HUDDLE_RETURN_IF_ERROR(CheckParams(spec, global));  // the data: Trainer::Create
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

  // The pipeline over the whole parameter buffer: its gaps are zero in both copies, so they add
  // nothing to the norm and come back as zeros.
  HUDDLE_ASSIGN_OR_RETURN(kernels::DeviceBuffer out, backend.Allocate(bytes));
  HUDDLE_ASSIGN_OR_RETURN(
      kernels::DeviceBuffer scratch,
      backend.Allocate(kernels::kUpdatePipelineScratch * static_cast<int64_t>(sizeof(double))));
  HUDDLE_ASSIGN_OR_RETURN(kernels::DeviceBuffer stats_buffer,
                          backend.Allocate(sizeof(kernels::UpdatePipelineStats)));
  kernels::UpdatePipelineParams params;
  params.clip_norm = options.clip_norm;
  backend.UpdatePipeline(params, trained.data(), global_copy.as<float>(), span, out.as<float>(),
                         scratch.as<double>(), stats_buffer.as<kernels::UpdatePipelineStats>());
  // The model's one trip down, as the delta.
  std::vector<float> packed(static_cast<size_t>(span));
  HUDDLE_RETURN_IF_ERROR(backend.CopyToHost(packed.data(), out.data(), bytes));
  kernels::UpdatePipelineStats stats;
  HUDDLE_RETURN_IF_ERROR(backend.CopyToHost(&stats, stats_buffer.data(), sizeof stats));
  TensorList delta = global;
  trainer->UnpackParams(packed, &delta);
  HUDDLE_RETURN_IF_ERROR(FinishUpdate(std::move(delta), stats, options.clip_norm, &update));
  if (update.dp_sgd) update.train = update.dp_sgd->train;
  update.train.seconds = static_cast<double>(clock->NowMs() - start_ms) / 1000.0;
  if (update.dp_sgd) update.dp_sgd->train.seconds = update.train.seconds;
  return update;
}

}  // namespace huddle::models
