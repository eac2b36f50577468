// TrainMlp and EvaluateMlp: minibatch SGD and batched inference through kernels/.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/rng.h"
#include "kernels/flush_denormals.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "models/internal/mlp_workspace.h"
#include "models/mlp.h"

namespace huddle::models {

using internal::CheckModelAndData;
using internal::CheckTrainOptions;
using internal::MlpWorkspace;

StatusOr<TrainStats> TrainMlp(const MlpSpec& spec, const TrainOptions& options,
                              const data::DatasetView& data, uint64_t seed, TensorList* params) {
  const Clock* clock = options.clock != nullptr ? options.clock : SteadyClock::Get();
  const int64_t start_ms = clock->NowMs();
  if (params == nullptr) return absl::InvalidArgumentError("TrainMlp: params is null");
  HUDDLE_RETURN_IF_ERROR(CheckTrainOptions(options));
  HUDDLE_RETURN_IF_ERROR(CheckModelAndData(spec, *params, data));

  kernels::FlushDenormalsScope flush_denormals;
  const int64_t n = data.size();
  const int64_t max_batch = std::min(options.batch_size, n);
  MlpWorkspace workspace(spec, max_batch, /*training=*/true);
  const kernels::SgdHyper hyper{static_cast<float>(options.learning_rate),
                                static_cast<float>(options.momentum),
                                static_cast<float>(options.weight_decay)};
  std::vector<int64_t> order(static_cast<size_t>(n));
  double loss_sum = 0.0;
  int64_t correct = 0;
  TrainStats stats;
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), int64_t{0});
    Rng rng(DeriveSeed(seed, static_cast<uint64_t>(epoch)));
    rng.Shuffle(order);
    for (int64_t begin = 0; begin < n; begin += max_batch) {
      const int64_t batch = std::min(max_batch, n - begin);
      workspace.Gather(data, order, begin, batch);
      const kernels::LossTotals totals = workspace.Forward(*params, batch, /*training=*/true);
      if (!std::isfinite(totals.loss_sum)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "training diverged: non-finite loss at epoch ", epoch, " step ", stats.steps,
            " (learning_rate ", options.learning_rate, " is probably too high)"));
      }
      workspace.Backward(*params, batch);
      workspace.Step(hyper, params);
      loss_sum += totals.loss_sum;
      correct += totals.correct;
      ++stats.steps;
    }
  }
  stats.examples = n * options.epochs;
  stats.loss = loss_sum / static_cast<double>(stats.examples);
  stats.accuracy = static_cast<double>(correct) / static_cast<double>(stats.examples);
  stats.seconds = static_cast<double>(clock->NowMs() - start_ms) / 1000.0;
  return stats;
}

StatusOr<EvalStats> EvaluateMlp(const MlpSpec& spec, const TensorList& params,
                                const data::DatasetView& data, int64_t batch_size) {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size is ", batch_size, "; it must be >= 1"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckModelAndData(spec, params, data));

  kernels::FlushDenormalsScope flush_denormals;
  const int64_t n = data.size();
  const int64_t max_batch = std::min(batch_size, n);
  MlpWorkspace workspace(spec, max_batch, /*training=*/false);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += max_batch) {
    const int64_t batch = std::min(max_batch, n - begin);
    workspace.Gather(data, order, begin, batch);
    const kernels::LossTotals totals = workspace.Forward(params, batch, /*training=*/false);
    loss_sum += totals.loss_sum;
    correct += totals.correct;
  }
  EvalStats stats;
  stats.examples = n;
  stats.loss = loss_sum / static_cast<double>(n);
  stats.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  return stats;
}

}  // namespace huddle::models
