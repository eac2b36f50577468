// ModelSpec validation and shapes, parameter layout, initialisation and checks. Training is in
// train.cc.
#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/rng.h"
#include "models/layers/registry.h"

namespace huddle::models {
namespace {

using layers::AllLayerTypes;
using layers::CheckRange;
using layers::InitGain;
using layers::LayerTensors;
using layers::LayerType;
using layers::Product;
using layers::TensorShape;
using layers::TypeOf;

constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr size_t kMaxLayers = 256;
constexpr int64_t kMaxParams = int64_t{1} << 31;
constexpr int64_t kMaxActivations = int64_t{1} << 26;

using Shape = std::vector<int64_t>;

std::string LayerName(const ModelSpec& spec, size_t i) {
  return absl::StrCat("model layer ", i, " (", LayerKindName(spec.layers[i].kind), ")");
}

// Whether the first activation after layer i (past normalisation, pooling and dropout) is a ReLU.
bool FeedsRelu(const ModelSpec& spec, size_t i) {
  for (size_t j = i + 1; j < spec.layers.size(); ++j) {
    switch (TypeOf(spec.layers[j].kind).init_gain) {
      case InitGain::kLookPast:
        continue;
      case InitGain::kRelu:
        return true;
      case InitGain::kLinear:
        return false;
    }
  }
  return false;
}

// Which layer each Layout tensor belongs to, and its index in that layer's tensors (trainable
// first, then state).
struct TensorOwner {
  size_t layer = 0;
  size_t index = 0;
};

// Layout, and each tensor's owner when `owners` is not null.
ModelLayout LayoutOf(const ModelSpec& spec, std::vector<TensorOwner>* owners) {
  ModelLayout layout, running;
  std::vector<TensorOwner> trained_by, state_of;
  std::vector<int64_t> counters(AllLayerTypes().size(), 0);
  const StatusOr<std::vector<Shape>> shapes = LayerShapes(spec);
  if (!shapes.ok()) return layout;
  Shape in = spec.input;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    const LayerType& type = TypeOf(l.kind);
    if (type.tensors != nullptr) {
      const std::string name =
          absl::StrCat(type.param_prefix, counters[static_cast<size_t>(l.kind)]++);
      size_t index = 0;
      auto add = [&](std::vector<TensorShape>& from, ModelLayout* to,
                     std::vector<TensorOwner>* owned) {
        for (TensorShape& t : from) {
          to->push_back({absl::StrCat(name, ".", t.suffix), DType::kFloat32, std::move(t.shape)});
          owned->push_back({i, index++});
        }
      };
      LayerTensors tensors = type.tensors(l, in);
      add(tensors.trainable, &layout, &trained_by);
      add(tensors.state, &running, &state_of);
    }
    in = (*shapes)[i];
  }
  layout.insert(layout.end(), running.begin(), running.end());
  if (owners != nullptr) {
    *owners = std::move(trained_by);
    owners->insert(owners->end(), state_of.begin(), state_of.end());
  }
  return layout;
}

constexpr char kExternalRefusal[] =
    "the model is external (only its tensors are known): Huddle's built-in trainers cannot train "
    "or evaluate it; clients bring their own trainer (client SDK)";

// Tensor names: printable, safe in logs, file names and metrics, and PyTorch's state_dict keys
// ("layer1.0.conv1.weight", "module.fc.bias") and TensorFlow-style ones ("dense/kernel:0").
bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == ':' || c == '/' || c == '-';
}

Status ValidateExternal(const ModelSpec& spec) {
  if (!spec.input.empty() || !spec.layers.empty()) {
    return absl::InvalidArgumentError(
        "an external model is its tensors only: its input and layers must be empty");
  }
  if (spec.tensors.size() > kMaxExternalTensors) {
    return absl::InvalidArgumentError(absl::StrCat("the external model has ", spec.tensors.size(),
                                                   " tensors; the maximum is ",
                                                   kMaxExternalTensors));
  }
  std::set<std::string_view> names;
  int64_t params = 0;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    const std::string shown = t.name.substr(0, 64) + (t.name.size() > 64 ? "..." : "");
    const std::string where = absl::StrCat("model tensor ", i, " ('", shown, "')");
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("model tensor ", i, " has an empty name"));
    }
    if (t.name.size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the name is ", t.name.size(), " bytes; the maximum is ", kMaxTensorNameBytes));
    }
    for (char c : t.name) {
      if (!IsNameChar(c)) {
        return absl::InvalidArgumentError(
            absl::StrCat("model tensor ", i, ": its name has the byte ",
                         static_cast<int>(static_cast<unsigned char>(c)),
                         "; names are characters of [A-Za-z0-9_.:/-]"));
      }
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": another tensor has the same name; names must be unique"));
    }
    if (t.dtype != DType::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dtype ", DTypeName(t.dtype), "; only float32 is supported"));
    }
    HUDDLE_RETURN_IF_ERROR(ValidateShape(t.shape, kMaxExternalTensorElements, where));
    params += t.NumElements();
    if (params > kMaxParams) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the model reaches ", params,
                                                     " parameters; the maximum is ", kMaxParams));
    }
  }
  return absl::OkStatus();
}

// 215370 -> "215,370".
std::string WithThousands(int64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

bool HasParameters(LayerKind kind) { return TypeOf(kind).num_trainable > 0; }

std::string LayerKindName(LayerKind kind) { return TypeOf(kind).name; }

std::span<const LayerOption> LayerOptions(LayerKind kind) { return TypeOf(kind).options; }

StatusOr<LayerKind> ParseLayerKind(std::string_view name) {
  std::string known;
  for (const LayerType* type : AllLayerTypes()) {
    if (name == type->name) return type->kind;
    absl::StrAppend(&known, known.empty() ? "" : ", ", type->name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown layer kind '", std::string(name), "'; the kinds are ", known));
}

ModelSpec::ModelSpec(const MlpSpec& mlp) : input{mlp.input_dim} {
  for (int64_t width : mlp.hidden) {
    layers.push_back({.kind = LayerKind::kDense, .out = width});
    if (mlp.batch_norm) layers.push_back({.kind = LayerKind::kBatchNorm});
    layers.push_back({.kind = LayerKind::kRelu});
  }
  layers.push_back({.kind = LayerKind::kDense, .out = mlp.num_classes});
}

ModelSpec ModelSpec::External(ModelLayout tensors) {
  ModelSpec spec;
  spec.input.clear();
  spec.tensors = std::move(tensors);
  return spec;
}

int64_t ModelSpec::input_dim() const { return external() ? 0 : Product(input); }

int64_t ModelSpec::num_classes() const {
  if (external()) return 0;
  auto shapes = LayerShapes(*this);
  if (!shapes.ok() || shapes->empty()) return 0;
  return shapes->back()[0];
}

bool ModelSpec::has_batch_norm() const {
  return std::any_of(layers.begin(), layers.end(),
                     [](const LayerSpec& l) { return l.kind == LayerKind::kBatchNorm; });
}

Status CheckBuiltIn(const ModelSpec& spec) {
  if (spec.external()) return absl::FailedPreconditionError(kExternalRefusal);
  return absl::OkStatus();
}

StatusOr<std::vector<std::vector<int64_t>>> LayerShapes(const ModelSpec& spec) {
  HUDDLE_RETURN_IF_ERROR(CheckBuiltIn(spec));
  if (spec.input.size() != 1 && spec.input.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("model input is ", ShapeString(spec.input),
                                                   "; it must be [features] or [channels, "
                                                   "height, width]"));
  }
  for (size_t d = 0; d < spec.input.size(); ++d) {
    HUDDLE_RETURN_IF_ERROR(
        CheckRange("model input", absl::StrCat("dimension ", d), spec.input[d], 1, kMaxDim));
  }
  if (spec.layers.empty()) return absl::InvalidArgumentError("model has no layers");
  if (spec.layers.size() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model has ", spec.layers.size(), " layers; the maximum is ", kMaxLayers));
  }
  std::vector<Shape> shapes;
  Shape shape = spec.input;
  int64_t params = 0, activations = Product(shape);
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    int64_t layer_params = 0;
    const std::string where = LayerName(spec, i);
    HUDDLE_ASSIGN_OR_RETURN(
        shape,
        TypeOf(spec.layers[i].kind).output_shape({spec.layers[i], shape, i, where}, &layer_params));
    for (int64_t d : shape) {
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "an output dimension", d, 1, kMaxDim));
    }
    params += layer_params;
    activations += Product(shape);
    if (params > kMaxParams || activations > kMaxActivations) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the model reaches ", params, " parameters and ", activations,
          " activations per example; the maxima are ", kMaxParams, " and ", kMaxActivations));
    }
    shapes.push_back(shape);
  }
  if (shape.size() != 1 || shape[0] < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's output is ", ShapeString(shape),
                     "; it must be flat with one logit per class (>= 2): end with a dense layer"));
  }
  return shapes;
}

Status ValidateModelSpec(const ModelSpec& spec) {
  if (spec.external()) return ValidateExternal(spec);
  return LayerShapes(spec).status();
}

std::optional<MlpSpec> AsMlp(const ModelSpec& spec) {
  if (spec.external() || spec.input.size() != 1 || spec.layers.empty()) return std::nullopt;
  MlpSpec mlp;
  mlp.input_dim = spec.input[0];
  mlp.hidden.clear();
  mlp.num_classes = spec.layers.back().out;
  mlp.batch_norm = spec.layers.size() > 1 && spec.layers[1].kind == LayerKind::kBatchNorm;
  for (size_t i = 0; i + 1 < spec.layers.size(); ++i) {
    if (spec.layers[i].kind == LayerKind::kDense) mlp.hidden.push_back(spec.layers[i].out);
  }
  if (ModelSpec(mlp) != spec) return std::nullopt;
  return mlp;
}

std::string DescribeModel(const ModelSpec& spec) {
  if (std::optional<MlpSpec> mlp = AsMlp(spec)) {
    std::string s = absl::StrCat("mlp ", mlp->input_dim);
    for (int64_t w : mlp->hidden) absl::StrAppend(&s, "-", w);
    absl::StrAppend(&s, "-", mlp->num_classes, mlp->batch_norm ? " (batch norm)" : "");
    return s;
  }
  if (spec.external()) {
    return absl::StrCat("external model: ", spec.tensors.size(),
                        spec.tensors.size() == 1 ? " tensor, " : " tensors, ",
                        WithThousands(TotalElements(spec.tensors)), " parameters");
  }
  std::string s;
  for (size_t d = 0; d < spec.input.size(); ++d) absl::StrAppend(&s, d ? "x" : "", spec.input[d]);
  for (const LayerSpec& l : spec.layers) {
    absl::StrAppend(&s, " > ", LayerKindName(l.kind));
    if (l.out > 0) absl::StrAppend(&s, " ", l.out);
    if (l.kernel > 0) absl::StrAppend(&s, " k", l.kernel);
    if (l.stride > 0) absl::StrAppend(&s, " s", l.stride);
    if (l.padding > 0) absl::StrAppend(&s, " p", l.padding);
    if (l.groups > 0) absl::StrAppend(&s, " g", l.groups);
    if (const auto describe = layers::TypeOf(l.kind).describe) describe(l, &s);
  }
  if (ValidateModelSpec(spec).ok()) {
    absl::StrAppend(&s, " (", TotalElements(Layout(spec)), " parameters)");
  }
  return s;
}

ModelLayout Layout(const ModelSpec& spec) {
  if (spec.external()) return spec.tensors;
  return LayoutOf(spec, /*owners=*/nullptr);
}

size_t NumTrainable(const ModelSpec& spec) {
  if (spec.external()) return spec.tensors.size();
  size_t n = 0;
  for (const LayerSpec& l : spec.layers) n += TypeOf(l.kind).num_trainable;
  return n;
}

TensorList InitModel(const ModelSpec& spec, uint64_t seed) {
  if (spec.external() || !ValidateModelSpec(spec).ok()) return {};
  std::vector<TensorOwner> owners;
  const ModelLayout layout = LayoutOf(spec, &owners);
  TensorList params;
  params.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    Tensor& tensor = params.emplace_back(layout[t].name, layout[t].shape);
    const TensorOwner& owner = owners[t];
    const LayerType& type = TypeOf(spec.layers[owner.layer].kind);
    if (type.init == nullptr) continue;
    type.init(owner.index, layout[t].shape, FeedsRelu(spec, owner.layer), DeriveSeed(seed, t),
              &tensor.data);
  }
  return params;
}

Status CheckParams(const ModelSpec& spec, const TensorList& params) {
  HUDDLE_RETURN_IF_ERROR(ValidateModelSpec(spec));
  const ModelLayout layout = Layout(spec);
  if (params.size() != layout.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model has ", layout.size(), " parameter tensors, got ", params.size()));
  }
  for (size_t i = 0; i < layout.size(); ++i) {
    const TensorSpec& want = layout[i];
    const Tensor& got = params[i];
    if (got.name() != want.name || got.spec.shape != want.shape || got.spec.dtype != want.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", i, " is '", got.name(), "' with shape ", ShapeString(got.spec.shape),
          ", the model expects '", want.name, "' with shape ", ShapeString(want.shape)));
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
