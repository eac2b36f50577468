#include "client/builtin_trainer.h"

#include <utility>

namespace huddle::client {

TrainerFailure::TrainerFailure(const Status& status)
    : std::runtime_error(std::string(status.message())) {}

NamedTensors ToNamedTensors(const TensorList& tensors) {
  NamedTensors out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) out.push_back({t.spec.name, t.spec.shape, t.data});
  return out;
}

TensorList FromNamedTensors(const NamedTensors& tensors) {
  TensorList out;
  out.reserve(tensors.size());
  for (const NamedTensor& t : tensors) {
    Tensor& tensor = out.emplace_back();
    tensor.spec.name = t.name;
    tensor.spec.shape = t.shape;
    tensor.data = t.values;
  }
  return out;
}

Status BuiltinTrainer::SetModel(const models::ModelSpec& spec, const std::string& job_name) {
  HUDDLE_RETURN_IF_ERROR(models::ValidateModelSpec(spec));
  if (spec.input_dim() != data_->base->feature_dim) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_name, "' expects ", spec.input_dim(),
                     " input features; this client's data has ", data_->base->feature_dim));
  }
  model_ = spec;
  return absl::OkStatus();
}

StatusOr<models::Update> BuiltinTrainer::Train(const TensorList& global, const FitConfig& config,
                                               double clip_norm) {
  if (!model_) return absl::FailedPreconditionError("no model: Fit before SetModel");
  models::UpdateOptions options;
  options.train.epochs = config.epochs;
  options.train.batch_size = config.batch_size;
  options.train.learning_rate = config.learning_rate;
  options.train.momentum = config.momentum;
  options.train.weight_decay = config.weight_decay;
  options.train.backend = backend_;
  options.seed = config.seed;
  options.clip_norm = clip_norm;
  if (config.dp_sgd) {
    options.dp_sgd.emplace();
    options.dp_sgd->noise_multiplier = config.dp_sgd->noise_multiplier;
    options.dp_sgd->clip_norm = config.dp_sgd->clip_norm;
    options.dp_sgd->expected_batch_size = config.dp_sgd->expected_batch_size;
    options.noise = noise_;
  }
  return silo_ != nullptr ? silo_->TrainUpdate(*model_, options, *data_, global)
                          : models::TrainUpdate(*model_, options, *data_, global);
}

FitResult BuiltinTrainer::Fit(const NamedTensors& global, const FitConfig& config) {
  StatusOr<models::Update> update = Train(FromNamedTensors(global), config, 0);
  if (!update.ok()) throw TrainerFailure(update.status());
  FitResult result;
  result.is_delta = true;
  result.num_examples = data_->size();
  result.metrics = {{"loss", update->train.loss}, {"accuracy", update->train.accuracy}};
  if (update->dp_sgd) {
    result.dp_sgd = DpSgdReport{update->dp_sgd->noise_multiplier, update->dp_sgd->sampling_rate,
                                update->dp_sgd->steps};
  }
  result.tensors = ToNamedTensors(update->delta);
  return result;
}

EvaluateResult BuiltinTrainer::Evaluate(const NamedTensors& model) {
  if (!model_)
    throw TrainerFailure(absl::FailedPreconditionError("no model: Evaluate before SetModel"));
  // A silo evaluates on the CPU (its ranks' backends belong to the silo).
  StatusOr<models::EvalStats> stats = models::EvaluateModel(
      *model_, FromNamedTensors(model), *data_, 1000, silo_ != nullptr ? nullptr : backend_);
  if (!stats.ok()) throw TrainerFailure(stats.status());
  return {stats->examples, stats->loss, stats->accuracy};
}

}  // namespace huddle::client
