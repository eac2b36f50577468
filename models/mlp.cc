// MlpSpec validation, parameter layout, initialisation and checks. Training is in mlp_train.cc.
#include "models/mlp.h"

#include <algorithm>
#include <cmath>

#include "common/rng.h"

namespace huddle::models {
namespace {

constexpr int64_t kMaxWidth = int64_t{1} << 24;
constexpr size_t kMaxHiddenLayers = 64;
constexpr int64_t kMaxParams = int64_t{1} << 31;

// Widths of the layer boundaries: input_dim, hidden..., num_classes.
std::vector<int64_t> Widths(const MlpSpec& spec) {
  std::vector<int64_t> widths = {spec.input_dim};
  widths.insert(widths.end(), spec.hidden.begin(), spec.hidden.end());
  widths.push_back(spec.num_classes);
  return widths;
}

Status CheckWidth(const std::string& what, int64_t width, int64_t min) {
  if (width < min || width > kMaxWidth) {
    return absl::InvalidArgumentError(absl::StrCat("MLP spec: ", what, " is ", width,
                                                   "; it must be in [", min, ", ", kMaxWidth, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

Status ValidateMlpSpec(const MlpSpec& spec) {
  HUDDLE_RETURN_IF_ERROR(CheckWidth("input_dim", spec.input_dim, 1));
  if (spec.hidden.size() > kMaxHiddenLayers) {
    return absl::InvalidArgumentError(absl::StrCat("MLP spec: ", spec.hidden.size(),
                                                   " hidden layers exceed the maximum of ",
                                                   kMaxHiddenLayers));
  }
  for (size_t i = 0; i < spec.hidden.size(); ++i) {
    HUDDLE_RETURN_IF_ERROR(CheckWidth(absl::StrCat("hidden[", i, "]"), spec.hidden[i], 1));
  }
  HUDDLE_RETURN_IF_ERROR(CheckWidth("num_classes", spec.num_classes, 2));
  const std::vector<int64_t> widths = Widths(spec);
  int64_t total = 0;
  for (size_t l = 0; l + 1 < widths.size(); ++l) total += (widths[l] + 1) * widths[l + 1];
  if (spec.batch_norm) {
    for (int64_t w : spec.hidden) total += 4 * w;
  }
  if (total > kMaxParams) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLP spec: ", total, " parameters exceed the maximum of ", kMaxParams));
  }
  return absl::OkStatus();
}

ModelLayout MlpLayout(const MlpSpec& spec) {
  const std::vector<int64_t> widths = Widths(spec);
  const size_t hidden = spec.hidden.size();
  ModelLayout layout;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    layout.push_back(
        {absl::StrCat("fc", l, ".weight"), DType::kFloat32, {widths[l + 1], widths[l]}});
    layout.push_back({absl::StrCat("fc", l, ".bias"), DType::kFloat32, {widths[l + 1]}});
    if (spec.batch_norm && l < hidden) {
      layout.push_back({absl::StrCat("bn", l, ".weight"), DType::kFloat32, {widths[l + 1]}});
      layout.push_back({absl::StrCat("bn", l, ".bias"), DType::kFloat32, {widths[l + 1]}});
    }
  }
  for (size_t l = 0; spec.batch_norm && l < hidden; ++l) {
    layout.push_back({absl::StrCat("bn", l, ".running_mean"), DType::kFloat32, {widths[l + 1]}});
    layout.push_back({absl::StrCat("bn", l, ".running_var"), DType::kFloat32, {widths[l + 1]}});
  }
  return layout;
}

std::string DescribeMlp(const MlpSpec& spec) {
  std::string s = absl::StrCat("mlp ", spec.input_dim);
  for (int64_t w : spec.hidden) absl::StrAppend(&s, "-", w);
  absl::StrAppend(&s, "-", spec.num_classes, spec.batch_norm ? " (batch norm)" : "");
  return s;
}

size_t NumTrainable(const MlpSpec& spec) {
  const size_t hidden = spec.hidden.size();
  return 2 * (hidden + 1) + (spec.batch_norm ? 2 * hidden : 0);
}

TensorList InitMlp(const MlpSpec& spec, uint64_t seed) {
  if (!ValidateMlpSpec(spec).ok()) return {};
  const ModelLayout layout = MlpLayout(spec);
  TensorList params;
  params.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    Tensor& tensor = params.emplace_back(layout[i].name, layout[i].shape);
    const std::string& name = layout[i].name;
    if (name.ends_with("running_var") || (name.starts_with("bn") && name.ends_with(".weight"))) {
      std::fill(tensor.data.begin(), tensor.data.end(), 1.0f);
      continue;
    }
    if (!name.starts_with("fc") || !name.ends_with(".weight")) continue;  // zeros
    const bool output_layer = name == absl::StrCat("fc", spec.hidden.size(), ".weight");
    const double fan_in = static_cast<double>(layout[i].shape[1]);
    const double bound = std::sqrt((output_layer ? 3.0 : 6.0) / fan_in);
    Rng rng(DeriveSeed(seed, i));
    for (float& w : tensor.data) w = static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
  }
  return params;
}

Status CheckParams(const MlpSpec& spec, const TensorList& params) {
  HUDDLE_RETURN_IF_ERROR(ValidateMlpSpec(spec));
  const ModelLayout layout = MlpLayout(spec);
  if (params.size() != layout.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLP has ", layout.size(), " parameter tensors, got ", params.size()));
  }
  for (size_t i = 0; i < layout.size(); ++i) {
    const TensorSpec& want = layout[i];
    const Tensor& got = params[i];
    if (got.name() != want.name || got.spec.shape != want.shape || got.spec.dtype != want.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", i, " is '", got.name(), "' with shape ", ShapeString(got.spec.shape),
          ", the MLP expects '", want.name, "' with shape ", ShapeString(want.shape)));
    }
    if (got.NumElements() != want.NumElements()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", got.name(), "' has ",
                                                     got.NumElements(), " values for shape ",
                                                     ShapeString(want.shape)));
    }
  }
  return absl::OkStatus();
}

}  // namespace huddle::models
