// One round's update on the client (client/agent.h, FitInstruction): the trainer's run, its report
// checked against the round, the delta clipped once (models::ClipUpdate) and, in local DP mode,
// noised. The built-in trainer is called directly, its errors as statuses; a user's trainer
// through the SDK interface (client::Trainer), its exceptions caught here.
#include <cmath>
#include <exception>
#include <optional>

#include "client/agent.h"
#include "common/clock.h"
#include "common/rng.h"
#include "models/dp_sgd.h"
#include "models/update.h"

namespace huddle::client {
namespace {

// The SDK's per-round settings from the instruction.
FitConfig FitConfigOf(const wire::FitInstruction& fit, uint64_t round, uint64_t seed) {
  FitConfig config;
  config.round = round;
  config.seed = seed;
  config.epochs = fit.train.epochs;
  config.batch_size = fit.train.batch_size;
  config.learning_rate = fit.train.learning_rate;
  config.momentum = fit.train.momentum;
  config.weight_decay = fit.train.weight_decay;
  if (fit.train.dp_sgd) {
    const wire::DpSgdConfig& d = *fit.train.dp_sgd;
    config.dp_sgd = DpSgdConfig{d.noise_multiplier, d.clip_norm, d.expected_batch_size, d.delta};
  }
  return config;
}

// A trainer's result as Huddle's tensors, checked against the job's layout: the same tensors in
// the same order, each with its shape's number of finite values. Errors name the tensor.
StatusOr<TensorList> CheckedResult(NamedTensors tensors, const ModelLayout& layout) {
  if (tensors.size() != layout.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the trainer returned ", tensors.size(),
                                                   " tensors; the model has ", layout.size()));
  }
  TensorList out;
  out.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    NamedTensor& t = tensors[i];
    if (t.name != layout[i].name || t.shape != layout[i].shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("the trainer's tensor ", i, " is '", t.name, "' ", ShapeString(t.shape),
                       "; the model's is '", layout[i].name, "' ", ShapeString(layout[i].shape)));
    }
    if (static_cast<int64_t>(t.values.size()) != layout[i].NumElements()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the trainer's tensor '", t.name, "' has ", t.values.size(), " values; its shape ",
          ShapeString(t.shape), " has ", layout[i].NumElements()));
    }
    if (const int64_t bad = FirstNonFinite(t.values); bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("the trainer's tensor '", t.name,
                                                     "' has a non-finite value at element ", bad,
                                                     " (training diverged?)"));
    }
    Tensor& tensor = out.emplace_back();
    tensor.spec = layout[i];
    tensor.data = std::move(t.values);
  }
  return out;
}

// A DP-SGD run the trainer reports must spend no more than the round allowed: the instruction's
// noise multiplier or more, and no more than the sampling rate and steps of its expected batch on
// the n examples the round was admitted for (the client's guard accounted that much).
Status CheckDpSgdReport(const std::optional<DpSgdReport>& report, const wire::FitInstruction& fit,
                        int64_t n) {
  const wire::DpSgdConfig& c = *fit.train.dp_sgd;
  if (!report) {
    return absl::FailedPreconditionError(
        absl::StrCat("the round asks for DP-SGD (noise multiplier ", c.noise_multiplier,
                     ", clip norm ", c.clip_norm, ", expected batch ", c.expected_batch_size,
                     ") and the trainer reported no DP-SGD run (FitResult::dp_sgd)"));
  }
  n = std::max<int64_t>(1, n);
  const int64_t m = std::min(c.expected_batch_size, n);
  const double q = static_cast<double>(m) / static_cast<double>(n);
  HUDDLE_ASSIGN_OR_RETURN(const int64_t steps, models::DpSgdSteps(fit.train.epochs, n, m));
  if (!(report->noise_multiplier >= c.noise_multiplier) || !(report->sampling_rate > 0) ||
      !(report->sampling_rate <= q * (1 + 1e-12)) || report->steps < 1 || report->steps > steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the trainer's DP-SGD run (noise multiplier ", report->noise_multiplier, ", sampling rate ",
        report->sampling_rate, ", ", report->steps,
        " steps) spends more than the round allows (noise multiplier >= ", c.noise_multiplier,
        ", sampling rate <= ", q, ", steps <= ", steps, " on ", n, " examples)"));
  }
  return absl::OkStatus();
}

// A trainer's report of its run, checked against the round: at least one example, and a DP-SGD
// run within what the round allowed when it asks for DP-SGD.
Status CheckRun(int64_t num_examples, const std::optional<DpSgdReport>& dp_sgd,
                const wire::FitInstruction& fit, int64_t n) {
  if (num_examples < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the trainer reported ", num_examples, " examples trained on; at least 1"));
  }
  if (fit.train.dp_sgd) HUDDLE_RETURN_IF_ERROR(CheckDpSgdReport(dp_sgd, fit, n));
  return absl::OkStatus();
}

// The round's update as the agent reports any trainer's run: the clipped delta, its norm and clip
// bit, and what the trainer reported (a non-finite metric is not sent; DP-SGD's run when the round
// asked for it).
models::Update Reported(models::Update&& clipped, int64_t num_examples, double loss,
                        double accuracy, const std::optional<DpSgdReport>& dp_sgd,
                        const wire::FitInstruction& fit) {
  models::Update update;
  update.delta = std::move(clipped.delta);
  update.norm = clipped.norm;
  update.clipped = clipped.clipped;
  update.train.examples = num_examples;
  if (std::isfinite(loss)) update.train.loss = loss;
  if (std::isfinite(accuracy)) update.train.accuracy = accuracy;
  if (fit.train.dp_sgd) {
    update.dp_sgd.emplace();
    update.dp_sgd->noise_multiplier = dp_sgd->noise_multiplier;
    update.dp_sgd->sampling_rate = dp_sgd->sampling_rate;
    update.dp_sgd->steps = dp_sgd->steps;
  }
  return update;
}

}  // namespace

StatusOr<FitResult> ClientAgent::CallFit(const TensorList& global, const FitConfig& config) {
  try {
    return trainer_->Fit(ToNamedTensors(global), config);
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  } catch (...) {
    return absl::InternalError("the trainer threw a non-standard exception");
  }
}

StatusOr<models::Update> ClientAgent::TrainAndPrivatize(const wire::Message& msg,
                                                        const wire::FitInstruction& fit,
                                                        double clip_norm, int64_t n,
                                                        const TensorList& global) {
  const wire::UpdatePrivacy& dp_update = fit.privacy;
  const FitConfig config =
      FitConfigOf(fit, msg.round, DeriveSeed(fit.seed, StableHash(client_id_)));
  double clip = dp_update.mode != wire::UpdatePrivacy::Mode::kNone ? clip_norm : 0.0;
  if (fit.secure_aggregation) {
    // The coordinator cannot clip a masked update: the client clips it to the round's bound.
    const double bound = fit.secure_aggregation->clip_norm;
    clip = clip > 0 ? std::min(clip, bound) : bound;
  }
  const int64_t start_ms = SteadyClock::Get()->NowMs();
  HUDDLE_ASSIGN_OR_RETURN(models::Update update, builtin_ ? FitBuiltin(fit, config, clip, n, global)
                                                          : FitUser(fit, config, clip, n, global));
  update.train.seconds = static_cast<double>(SteadyClock::Get()->NowMs() - start_ms) / 1000.0;
  if (dp_update.mode == wire::UpdatePrivacy::Mode::kLocal) {
    // Local DP: the exact discrete Gaussian, added on the host whatever the device.
    HUDDLE_ASSIGN_OR_RETURN(const privacy::NoiseGrid grid,
                            privacy::NoiseGridFor(dp_update.noise_multiplier, clip_norm,
                                                  TotalElements(models::Layout(*model_))));
    for (Tensor& t : update.delta) {
      HUDDLE_RETURN_IF_ERROR(privacy::AddDiscreteGaussianNoise(t.data, grid, noise()));
    }
  }
  return update;
}

StatusOr<models::Update> ClientAgent::FitBuiltin(const wire::FitInstruction& fit,
                                                 const FitConfig& config, double clip, int64_t n,
                                                 const TensorList& global) {
  if (fit.train.dp_sgd) builtin_->set_noise(&noise());
  HUDDLE_ASSIGN_OR_RETURN(models::Update trained, builtin_->Train(global, config, clip));
  std::optional<DpSgdReport> dp_sgd;
  if (trained.dp_sgd) {
    dp_sgd = DpSgdReport{trained.dp_sgd->noise_multiplier, trained.dp_sgd->sampling_rate,
                         trained.dp_sgd->steps};
  }
  const int64_t examples = builtin_->num_examples();
  HUDDLE_RETURN_IF_ERROR(CheckRun(examples, dp_sgd, fit, n));
  const double loss = trained.train.loss, accuracy = trained.train.accuracy;
  return Reported(std::move(trained), examples, loss, accuracy, dp_sgd, fit);
}

StatusOr<models::Update> ClientAgent::FitUser(const wire::FitInstruction& fit,
                                              const FitConfig& config, double clip, int64_t n,
                                              const TensorList& global) {
  HUDDLE_ASSIGN_OR_RETURN(FitResult result, CallFit(global, config));
  HUDDLE_RETURN_IF_ERROR(CheckRun(result.num_examples, result.dp_sgd, fit, n));
  HUDDLE_ASSIGN_OR_RETURN(TensorList trained,
                          CheckedResult(std::move(result.tensors), models::Layout(*model_)));
  // delta = local - global (or the trainer's delta) and the clip, for every trainer the same.
  models::Update update;
  if (result.is_delta) {
    update.delta = std::move(trained);
    HUDDLE_RETURN_IF_ERROR(models::ClipUpdate(clip, &update));
  } else {
    HUDDLE_ASSIGN_OR_RETURN(update, models::UpdateFromTrained(std::move(trained), global, clip));
  }
  // Metrics the trainer computed (NaN when absent).
  auto metric = [&result](const char* key) {
    auto it = result.metrics.find(key);
    return it != result.metrics.end() ? it->second : std::nan("");
  };
  return Reported(std::move(update), result.num_examples, metric("loss"), metric("accuracy"),
                  result.dp_sgd, fit);
}

}  // namespace huddle::client
