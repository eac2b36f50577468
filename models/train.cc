// TrainModel, Evaluator and EvaluateModel: minibatch SGD and batched inference through kernels/.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/flush_denormals.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "models/internal/net_workspace.h"
#include "models/internal/train_loops.h"
#include "models/model.h"
#include "models/trainer.h"

namespace huddle::models {

using internal::NetWorkspace;

namespace internal {

Status RunSgdEpochs(Trainer& trainer, const TrainOptions& options, int64_t n, TrainStats* stats) {
  EpochTotals totals;
  HUDDLE_RETURN_IF_ERROR(
      trainer.TrainEpochs(0, 0, {}, [&](int64_t epoch, int64_t /*rows*/) -> Status {
        HUDDLE_ASSIGN_OR_RETURN(const bool finite, totals.Add(trainer));
        return finite ? absl::OkStatus() : LossDiverged(epoch, options.learning_rate);
      }));
  stats->steps = trainer.steps();
  stats->examples = n * options.epochs;
  stats->loss = totals.loss_sum / static_cast<double>(stats->examples);
  stats->accuracy = totals.correct / static_cast<double>(stats->examples);
  return absl::OkStatus();
}

}  // namespace internal

StatusOr<TrainStats> TrainModel(const ModelSpec& spec, const TrainOptions& options,
                                const data::DatasetView& data, uint64_t seed, TensorList* params) {
  const Clock* clock = options.clock != nullptr ? options.clock : SteadyClock::Get();
  const int64_t start_ms = clock->NowMs();
  if (params == nullptr) return absl::InvalidArgumentError("TrainModel: params is null");
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  HUDDLE_RETURN_IF_ERROR(CheckTrainOptions(options));
  HUDDLE_RETURN_IF_ERROR(CheckParams(spec, *params));  // the data: Trainer::Create

  kernels::FlushDenormalsScope flush_denormals;
  Trainer::Loop loop;
  loop.seed = seed;
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                          Trainer::Create(spec, options, data, loop));
  trainer->UploadParams(*params);
  TrainStats stats;
  const Status run = internal::RunSgdEpochs(*trainer, options, data.size(), &stats);
  if (!run.ok() && !internal::IsDiverged(run)) return run;
  // The diverged values are handed back too, as documented.
  HUDDLE_RETURN_IF_ERROR(trainer->DownloadParams(params));
  HUDDLE_RETURN_IF_ERROR(run);
  stats.seconds = static_cast<double>(clock->NowMs() - start_ms) / 1000.0;
  return stats;
}

struct Evaluator::State {
  ModelSpec spec;
  int64_t n = 0, max_batch = 0;
  std::unique_ptr<kernels::Backend> owned;
  std::unique_ptr<NetWorkspace> ws;
};

Evaluator::Evaluator(std::unique_ptr<State> state) : state_(std::move(state)) {}
Evaluator::~Evaluator() = default;

StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(const ModelSpec& spec,
                                                       const data::DatasetView& data,
                                                       int64_t batch_size,
                                                       kernels::Backend* backend) {
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", batch_size, "; it must be >= 1"));
  }
  HUDDLE_RETURN_IF_ERROR(ValidateModelSpec(spec));
  HUDDLE_RETURN_IF_ERROR(CheckData(spec, data));
  auto state = std::make_unique<State>();
  state->spec = spec;
  TrainOptions on;
  on.backend = backend;
  kernels::Backend& device = internal::BackendFor(on, &state->owned);
  state->n = data.size();
  state->max_batch = std::min(batch_size, state->n);
  HUDDLE_ASSIGN_OR_RETURN(state->ws, NetWorkspace::Create(device, spec, state->max_batch,
                                                          /*training=*/false));
  HUDDLE_RETURN_IF_ERROR(state->ws->LoadData(data));
  std::vector<int64_t> order(static_cast<size_t>(state->n));
  std::iota(order.begin(), order.end(), int64_t{0});
  HUDDLE_RETURN_IF_ERROR(state->ws->SetOrder(order));
  return std::unique_ptr<Evaluator>(new Evaluator(std::move(state)));
}

StatusOr<EvalStats> Evaluator::Evaluate(const TensorList& params) {
  State& s = *state_;
  HUDDLE_RETURN_IF_ERROR(CheckParams(s.spec, params));
  kernels::FlushDenormalsScope flush_denormals;
  NetWorkspace& ws = *s.ws;
  ws.ResetTotals();
  ws.UploadParams(params);
  for (int64_t begin = 0; begin < s.n; begin += s.max_batch) {
    const int64_t batch = std::min(s.max_batch, s.n - begin);
    ws.Gather(begin, batch);
    ws.Forward(batch, /*training=*/false);
  }
  HUDDLE_ASSIGN_OR_RETURN(const kernels::LossAccumulator totals, ws.ReadTotals());
  EvalStats stats;
  stats.examples = s.n;
  stats.loss = totals.loss_sum / static_cast<double>(s.n);
  stats.accuracy = static_cast<double>(totals.correct) / static_cast<double>(s.n);
  return stats;
}

StatusOr<EvalStats> EvaluateModel(const ModelSpec& spec, const TensorList& params,
                                  const data::DatasetView& data, int64_t batch_size,
                                  kernels::Backend* backend) {
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", batch_size, "; it must be >= 1"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckParams(spec, params));  // the data: checked once, by Create
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<Evaluator> evaluator,
                          Evaluator::Create(spec, data, batch_size, backend));
  return evaluator->Evaluate(params);
}

}  // namespace huddle::models
