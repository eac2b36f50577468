// Huddle's built-in trainer: the job's model from Huddle's layer set (models/), trained on a local
// data set on one backend or across the ranks of a silo. It is a client::Trainer like any user's
// (huddle/client/trainer.h), so the agent processes its results exactly as it does theirs.
//
// The agent gives it the job's model (SetModel, from the Welcome) before Start. A round is Train:
// SGD, or DP-SGD when the round asks, and the update, local - global taken where the model lives
// (one trip down from a GPU) and clipped once (models::TrainUpdate), returned as a status-or-value
// to the agent, which calls it directly. Fit and Evaluate are the SDK interface's versions (an
// unclipped delta as NamedTensors; errors thrown as TrainerFailure, the interface's convention).
//
// Thread-safety: none; the agent serialises calls.
#pragma once

#include <stdexcept>
#include <string>

#include "client/silo.h"
#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "huddle/client/trainer.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/update.h"
#include "privacy/noise.h"

namespace huddle::client {

// What a built-in trainer throws: the failed call's status message.
class TrainerFailure : public std::runtime_error {
 public:
  explicit TrainerFailure(const Status& status);
};

class BuiltinTrainer final : public Trainer {
 public:
  // `data` must outlive the trainer.
  explicit BuiltinTrainer(const data::DatasetView* data) : data_(data) {}

  // Where training runs (not owned, must outlive the trainer): a backend (nullptr: the CPU), or
  // the ranks of a silo (nullptr: no silo).
  void set_backend(kernels::Backend* backend) { backend_ = backend; }
  void set_silo(Silo* silo) { silo_ = silo; }
  // DP-SGD's sampling and noise (not owned; required before a DP-SGD round).
  void set_noise(privacy::NoiseSource* noise) { noise_ = noise; }
  // The job's model. FailedPrecondition when the local data cannot train it (naming the job and
  // both sizes), InvalidArgument when Huddle cannot train it (an external model).
  Status SetModel(const models::ModelSpec& spec, const std::string& job_name);

  // One round: trains from `global` as `config` says and returns the update, clipped to
  // clip_norm (0: not clipped) by models::ClipUpdate. Errors: FailedPrecondition before SetModel,
  // or those of models::TrainUpdate (a silo's: client/silo.h).
  StatusOr<models::Update> Train(const TensorList& global, const FitConfig& config,
                                 double clip_norm);

  int64_t num_examples() const override { return data_->size(); }
  FitResult Fit(const NamedTensors& global, const FitConfig& config) override;
  bool can_evaluate() const override { return true; }
  EvaluateResult Evaluate(const NamedTensors& model) override;

 private:
  const data::DatasetView* data_;
  std::optional<models::ModelSpec> model_;
  kernels::Backend* backend_ = nullptr;
  Silo* silo_ = nullptr;
  privacy::NoiseSource* noise_ = nullptr;
};

// The SDK's tensors and Huddle's (copies; the same names, shapes and values).
NamedTensors ToNamedTensors(const TensorList& tensors);
TensorList FromNamedTensors(const NamedTensors& tensors);

}  // namespace huddle::client
