// ModelSpec validation and shapes, parameter layout, initialisation and checks. Training is in
// train.cc.
#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/rng.h"
#include "kernels/scattering.h"

namespace huddle::models {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr size_t kMaxLayers = 256;
constexpr int64_t kMaxParams = int64_t{1} << 31;
constexpr int64_t kMaxActivations = int64_t{1} << 26;

using Shape = std::vector<int64_t>;

struct KindName {
  LayerKind kind;
  std::string_view name;
};
constexpr KindName kKindNames[] = {
    {LayerKind::kDense, "dense"},
    {LayerKind::kConv2d, "conv2d"},
    {LayerKind::kMaxPool2d, "max_pool2d"},
    {LayerKind::kAvgPool2d, "avg_pool2d"},
    {LayerKind::kBatchNorm, "batch_norm"},
    {LayerKind::kGroupNorm, "group_norm"},
    {LayerKind::kRelu, "relu"},
    {LayerKind::kTanh, "tanh"},
    {LayerKind::kDropout, "dropout"},
    {LayerKind::kFlatten, "flatten"},
    {LayerKind::kScattering2d, "scattering2d"},
};

int64_t Product(const Shape& shape) {
  int64_t p = 1;
  for (int64_t d : shape) p *= d;
  return p;
}

std::string LayerName(const ModelSpec& spec, size_t i) {
  return absl::StrCat("model layer ", i, " (", LayerKindName(spec.layers[i].kind), ")");
}

Status CheckRange(const std::string& where, absl::string_view what, int64_t value, int64_t min,
                  int64_t max) {
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", what, " is ", value, "; it must be in [", min, ", ", max, "]"));
  }
  return absl::OkStatus();
}

// A window layer's (conv2d, pools) output side, or an error naming the dimension.
StatusOr<int64_t> WindowOut(const std::string& where, absl::string_view dim, int64_t size,
                            const LayerSpec& l) {
  const int64_t padded = size + 2 * l.padding;
  if (l.kernel > padded) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": kernel ", l.kernel, " is larger than ",
                                                   dim, " ", size, " plus padding ",
                                                   2 * l.padding));
  }
  return (padded - l.kernel) / l.effective_stride() + 1;
}

// The output shape of layer i given its input shape, and the number of its parameters.
StatusOr<Shape> OutputShape(const ModelSpec& spec, size_t i, const Shape& in, int64_t* params) {
  const LayerSpec& l = spec.layers[i];
  const std::string where = LayerName(spec, i);
  *params = 0;
  auto needs_image = [&]() -> Status {
    if (in.size() == 3) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        where, " needs a [channels, height, width] input", "; it gets ", ShapeString(in)));
  };
  switch (l.kind) {
    case LayerKind::kDense:
      if (in.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(where, " needs a flat input; it gets ",
                                                       ShapeString(in),
                                                       ": add a flatten layer before it"));
      }
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "out", l.out, 1, kMaxDim));
      *params = (in[0] + 1) * l.out;
      return Shape{l.out};
    case LayerKind::kConv2d: {
      HUDDLE_RETURN_IF_ERROR(needs_image());
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "out", l.out, 1, kMaxDim));
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "kernel", l.kernel, 1, 64));
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "stride", l.effective_stride(), 1, 64));
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "padding", l.padding, 0, l.kernel - 1));
      HUDDLE_ASSIGN_OR_RETURN(const int64_t h, WindowOut(where, "height", in[1], l));
      HUDDLE_ASSIGN_OR_RETURN(const int64_t w, WindowOut(where, "width", in[2], l));
      *params = (in[0] * l.kernel * l.kernel + 1) * l.out;
      return Shape{l.out, h, w};
    }
    case LayerKind::kMaxPool2d:
    case LayerKind::kAvgPool2d: {
      HUDDLE_RETURN_IF_ERROR(needs_image());
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "kernel", l.kernel, 1, 64));
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "stride", l.effective_stride(), 1, 64));
      // PyTorch's rule: padding at most half the window.
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "padding", l.padding, 0, l.kernel / 2));
      HUDDLE_ASSIGN_OR_RETURN(const int64_t h, WindowOut(where, "height", in[1], l));
      HUDDLE_ASSIGN_OR_RETURN(const int64_t w, WindowOut(where, "width", in[2], l));
      return Shape{in[0], h, w};
    }
    case LayerKind::kBatchNorm:
      *params = 4 * in[0];
      return in;
    case LayerKind::kGroupNorm:
      if (in.size() != 1 && in.size() != 3) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " needs a [features] or [channels, height, width] input"));
      }
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "groups", l.groups, 1, in[0]));
      if (in[0] % l.groups != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": groups ", l.groups, " does not divide its ", in[0], " channels"));
      }
      *params = 2 * in[0];
      return in;
    case LayerKind::kDropout:
      if (!(l.rate >= 0.0 && l.rate < 1.0)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": rate is ", l.rate, "; it must be in [0, 1)"));
      }
      return in;
    case LayerKind::kRelu:
    case LayerKind::kTanh:
      return in;
    case LayerKind::kFlatten:
      return Shape{Product(in)};
    case LayerKind::kScattering2d: {
      if (i != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where,
                         " must be the first layer: it is a fixed feature extractor that no "
                         "gradient flows through"));
      }
      HUDDLE_RETURN_IF_ERROR(needs_image());
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "scales", l.scales, 1, 4));
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "angles", l.angles, 1, 16));
      const int64_t min_side = int64_t{2} << l.scales;
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "the input height", in[1], min_side, 256));
      HUDDLE_RETURN_IF_ERROR(CheckRange(where, "the input width", in[2], min_side, 256));
      return Shape{in[0] * kernels::ScatteringPaths(l.scales, l.angles), in[1] >> l.scales,
                   in[2] >> l.scales};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(where, ": unknown kind"));
}

const char* ParamPrefix(LayerKind kind) {
  switch (kind) {
    case LayerKind::kDense:
      return "fc";
    case LayerKind::kConv2d:
      return "conv";
    case LayerKind::kBatchNorm:
      return "bn";
    default:
      return "gn";
  }
}

// Whether the first activation after layer i (past normalisation, pooling and dropout) is a ReLU.
bool FeedsRelu(const ModelSpec& spec, size_t i) {
  for (size_t j = i + 1; j < spec.layers.size(); ++j) {
    switch (spec.layers[j].kind) {
      case LayerKind::kRelu:
        return true;
      case LayerKind::kBatchNorm:
      case LayerKind::kGroupNorm:
      case LayerKind::kMaxPool2d:
      case LayerKind::kAvgPool2d:
      case LayerKind::kDropout:
      case LayerKind::kFlatten:
        continue;
      default:
        return false;
    }
  }
  return false;
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

bool HasParameters(LayerKind kind) {
  return kind == LayerKind::kDense || kind == LayerKind::kConv2d || kind == LayerKind::kBatchNorm ||
         kind == LayerKind::kGroupNorm;
}

std::string LayerKindName(LayerKind kind) {
  for (const KindName& k : kKindNames) {
    if (k.kind == kind) return std::string(k.name);
  }
  return "unknown";
}

StatusOr<LayerKind> ParseLayerKind(std::string_view name) {
  std::string known;
  for (const KindName& k : kKindNames) {
    if (k.name == name) return k.kind;
    absl::StrAppend(&known, known.empty() ? "" : ", ", std::string(k.name));
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
    HUDDLE_ASSIGN_OR_RETURN(shape, OutputShape(spec, i, shape, &layer_params));
    for (int64_t d : shape) {
      HUDDLE_RETURN_IF_ERROR(CheckRange(LayerName(spec, i), "an output dimension", d, 1, kMaxDim));
    }
    params += layer_params;
    activations += Product(shape);
    if (params > kMaxParams || activations > kMaxActivations) {
      return absl::InvalidArgumentError(absl::StrCat(
          LayerName(spec, i), ": the model reaches ", params, " parameters and ", activations,
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
    if (l.kind == LayerKind::kDropout) absl::StrAppend(&s, " ", l.rate);
    if (l.kind == LayerKind::kScattering2d) absl::StrAppend(&s, " J", l.scales, " L", l.angles);
  }
  if (ValidateModelSpec(spec).ok()) {
    absl::StrAppend(&s, " (", TotalElements(Layout(spec)), " parameters)");
  }
  return s;
}

ModelLayout Layout(const ModelSpec& spec) {
  if (spec.external()) return spec.tensors;
  ModelLayout layout, running;
  std::vector<int64_t> counters(std::size(kKindNames), 0);
  Shape in = spec.input;
  const StatusOr<std::vector<Shape>> shapes = LayerShapes(spec);
  if (!shapes.ok()) return layout;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    if (HasParameters(l.kind)) {
      const std::string name =
          absl::StrCat(ParamPrefix(l.kind), counters[static_cast<size_t>(l.kind)]++);
      auto add = [&](ModelLayout& to, const char* suffix, std::vector<int64_t> shape) {
        to.push_back({absl::StrCat(name, ".", suffix), DType::kFloat32, std::move(shape)});
      };
      switch (l.kind) {
        case LayerKind::kDense:
          add(layout, "weight", {l.out, in[0]});
          add(layout, "bias", {l.out});
          break;
        case LayerKind::kConv2d:
          add(layout, "weight", {l.out, in[0], l.kernel, l.kernel});
          add(layout, "bias", {l.out});
          break;
        default:
          add(layout, "weight", {in[0]});
          add(layout, "bias", {in[0]});
          if (l.kind == LayerKind::kBatchNorm) {
            add(running, "running_mean", {in[0]});
            add(running, "running_var", {in[0]});
          }
      }
    }
    in = (*shapes)[i];
  }
  layout.insert(layout.end(), running.begin(), running.end());
  return layout;
}

size_t NumTrainable(const ModelSpec& spec) {
  if (spec.external()) return spec.tensors.size();
  size_t n = 0;
  for (const LayerSpec& l : spec.layers) n += HasParameters(l.kind) ? 2 : 0;
  return n;
}

TensorList InitModel(const ModelSpec& spec, uint64_t seed) {
  if (spec.external() || !ValidateModelSpec(spec).ok()) return {};
  const ModelLayout layout = Layout(spec);
  TensorList params;
  params.reserve(layout.size());
  // Which layer each trainable tensor belongs to.
  std::vector<size_t> owner;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    if (HasParameters(spec.layers[i].kind)) owner.insert(owner.end(), 2, i);
  }
  for (size_t t = 0; t < layout.size(); ++t) {
    Tensor& tensor = params.emplace_back(layout[t].name, layout[t].shape);
    if (t >= owner.size()) {  // running statistics: mean 0, variance 1
      if (layout[t].name.ends_with("running_var")) {
        std::fill(tensor.data.begin(), tensor.data.end(), 1.0f);
      }
      continue;
    }
    const LayerKind kind = spec.layers[owner[t]].kind;
    const bool weight = layout[t].name.ends_with(".weight");
    if (!weight) continue;  // biases: zeros
    if (kind == LayerKind::kBatchNorm || kind == LayerKind::kGroupNorm) {
      std::fill(tensor.data.begin(), tensor.data.end(), 1.0f);
      continue;
    }
    const std::vector<int64_t>& shape = layout[t].shape;
    int64_t fan_in = 1;
    for (size_t d = 1; d < shape.size(); ++d) fan_in *= shape[d];
    const double bound =
        std::sqrt((FeedsRelu(spec, owner[t]) ? 6.0 : 3.0) / static_cast<double>(fan_in));
    Rng rng(DeriveSeed(seed, t));
    for (float& w : tensor.data) w = static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
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
