#include "aggregation/server_optimizer.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace huddle::aggregation {
namespace {

Status CheckOptions(const ServerOptimizerOptions& o) {
  if (!(o.learning_rate > 0) || !std::isfinite(o.learning_rate)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("server learning_rate %g must be finite and > 0", o.learning_rate));
  }
  if (!(o.momentum >= 0 && o.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("server momentum %g is out of range [0, 1)", o.momentum));
  }
  return absl::OkStatus();
}

// Each tensor's data holds exactly NumElements() values.
Status CheckSelfConsistent(const TensorList& list, const char* what) {
  for (const Tensor& t : list) {
    if (t.NumElements() != t.spec.NumElements()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " tensor '", t.name(), "' holds ", t.NumElements(), " values but its shape ",
          ShapeString(t.spec.shape), " has ", t.spec.NumElements()));
    }
  }
  return absl::OkStatus();
}

// `other` has the same tensors as `model` (count, names, shapes).
Status CheckSameLayout(const TensorList& other, const TensorList& model, const char* what) {
  if (other.size() != model.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", other.size(), " tensors, the model has ", model.size()));
  }
  for (size_t i = 0; i < model.size(); ++i) {
    const TensorSpec& a = other[i].spec;
    const TensorSpec& b = model[i].spec;
    if (a.name != b.name || a.shape != b.shape) {
      return absl::InvalidArgumentError(absl::StrCat(what, " tensor ", i, " is '", a.name, "' ",
                                                     ShapeString(a.shape), ", the model has '",
                                                     b.name, "' ", ShapeString(b.shape)));
    }
  }
  return CheckSelfConsistent(other, what);
}

}  // namespace

ServerOptimizer::ServerOptimizer(ServerOptimizerOptions options) : options_(options) {}

Status ServerOptimizer::Apply(const TensorList& delta, TensorList* model) {
  HUDDLE_RETURN_IF_ERROR(CheckOptions(options_));
  HUDDLE_RETURN_IF_ERROR(CheckSelfConsistent(*model, "model"));
  HUDDLE_RETURN_IF_ERROR(CheckSameLayout(delta, *model, "delta"));
  HUDDLE_RETURN_IF_ERROR(CheckFinite(delta, "delta"));
  const double lr = options_.learning_rate;
  if (options_.momentum == 0) {
    for (size_t t = 0; t < model->size(); ++t) {
      std::vector<float>& w = (*model)[t].data;
      const std::vector<float>& d = delta[t].data;
      for (size_t i = 0; i < w.size(); ++i) {
        w[i] = static_cast<float>(static_cast<double>(w[i]) + lr * static_cast<double>(d[i]));
      }
    }
    return absl::OkStatus();
  }
  if (velocity_.empty()) {
    velocity_.reserve(model->size());
    for (const Tensor& t : *model) velocity_.emplace_back(t.name(), t.spec.shape);
  } else {
    HUDDLE_RETURN_IF_ERROR(CheckSameLayout(velocity_, *model, "optimizer state"));
  }
  const double momentum = options_.momentum;
  for (size_t t = 0; t < model->size(); ++t) {
    std::vector<float>& w = (*model)[t].data;
    std::vector<float>& v = velocity_[t].data;
    const std::vector<float>& d = delta[t].data;
    for (size_t i = 0; i < w.size(); ++i) {
      v[i] = static_cast<float>(momentum * static_cast<double>(v[i]) + static_cast<double>(d[i]));
      w[i] = static_cast<float>(static_cast<double>(w[i]) + lr * static_cast<double>(v[i]));
    }
  }
  return absl::OkStatus();
}

Status ServerOptimizer::RestoreState(TensorList velocity) {
  if (!velocity.empty()) {
    if (options_.momentum == 0) {
      return absl::InvalidArgumentError(
          "cannot restore a server optimizer velocity: momentum is 0 (FedAvg keeps no state)");
    }
    HUDDLE_RETURN_IF_ERROR(CheckSelfConsistent(velocity, "optimizer state"));
    HUDDLE_RETURN_IF_ERROR(CheckFinite(velocity, "optimizer state"));
  }
  velocity_ = std::move(velocity);
  return absl::OkStatus();
}

}  // namespace huddle::aggregation
