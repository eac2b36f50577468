// The YAML sections the job and datacenter configs share (cli/config_sections.h): the model.
#include "cli/config_sections.h"

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "models/dp_sgd.h"

namespace huddle::cli {
namespace {

// A key that must be present, in [lo, hi].
template <typename T>
Status Required(ConfigMap& m, std::string_view key, T* out, std::type_identity_t<T> lo,
                std::type_identity_t<T> hi) {
  if (!m.Has(key)) return absl::InvalidArgumentError(absl::StrCat(m.Where(key), " is required"));
  return m.Optional(key, out, lo, hi);
}

// One option of a layer kind (models::LayerOptions) into its LayerSpec field.
template <typename T>
Status ReadLayerOption(ConfigMap& options, const models::LayerOption& o, T* field) {
  const auto lo = static_cast<T>(o.min), hi = static_cast<T>(o.max);
  if (o.required) return Required(options, o.key, field, lo, hi);
  *field = static_cast<T>(o.absent);
  return options.Optional(o.key, field, lo, hi);
}

// One entry of `model.layers`: a mapping with one key, the layer kind, whose value holds the
// layer's options (or is empty).
Status ReadLayer(ConfigMap& item, models::LayerSpec* layer) {
  const std::vector<std::string> keys = item.Keys();
  if (keys.size() != 1) {
    std::string where = item.Where("");
    where.pop_back();  // the '.' before an empty key
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     " must be a mapping with one key, the layer kind (e.g. {conv2d: {out: 32, "
                     "kernel: 5}} or {relu: {}}); it has ",
                     keys.size()));
  }
  StatusOr<models::LayerKind> kind = models::ParseLayerKind(keys[0]);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(item.Where(keys[0]), ": ", kind.status().message()));
  }
  layer->kind = *kind;
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap options, item.Child(keys[0]));
  // The kind's options, as its file in models/layers/ declares them.
  for (const models::LayerOption& o : models::LayerOptions(layer->kind)) {
    if (o.integer != nullptr) {
      HUDDLE_RETURN_IF_ERROR(ReadLayerOption(options, o, &(layer->*o.integer)));
    } else {
      HUDDLE_RETURN_IF_ERROR(ReadLayerOption(options, o, &(layer->*o.real)));
    }
  }
  HUDDLE_RETURN_IF_ERROR(options.Finish());
  return item.Finish();
}

// A model file (HUDDLEM1, common/tensor_io.h) named by `key` of the model section, read whole:
// its tensors, finite. Errors name the key and the file and say what is wrong (missing, corrupt,
// not a model file, a non-finite value).
StatusOr<TensorList> ReadModelValues(ConfigMap& model, std::string_view key) {
  std::string path;
  HUDDLE_RETURN_IF_ERROR(model.OptionalPath(key, &path));
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(model.Where(key), " is empty; give a path"));
  }
  StatusOr<TensorList> tensors = ReadModelFile(path);
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.Where(key), ": ", tensors.status().message()));
  }
  if (Status st = CheckFinite(*tensors, absl::StrCat(path, ":")); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(model.Where(key), ": ", st.message()));
  }
  return tensors;
}

// `model.init`'s tensors against the model's layout: the first tensor that differs, by name and
// shape (or the first one missing or extra).
Status CheckInitLayout(ConfigMap& model, const std::string& path, const ModelLayout& want,
                       const TensorList& got) {
  auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.Where("init"), ": ", path, ": ", what,
                     " (an init file holds the model's tensors in its layout order; see model.h)"));
  };
  for (size_t i = 0; i < std::min(want.size(), got.size()); ++i) {
    if (got[i].name() != want[i].name || got[i].spec.shape != want[i].shape) {
      return error(absl::StrCat("tensor ", i, " is '", got[i].name(), "' with shape ",
                                ShapeString(got[i].spec.shape), " in the file; the model's is '",
                                want[i].name, "' with shape ", ShapeString(want[i].shape)));
    }
  }
  if (got.size() < want.size()) {
    return error(absl::StrCat("the file has ", got.size(), " tensors, the model ", want.size(),
                              ": its tensor '", want[got.size()].name, "' with shape ",
                              ShapeString(want[got.size()].shape), " is missing"));
  }
  if (got.size() > want.size()) {
    return error(absl::StrCat("the file has ", got.size(), " tensors, the model ", want.size(),
                              ": tensor '", got[want.size()].name(), "' with shape ",
                              ShapeString(got[want.size()].spec.shape), " is not the model's"));
  }
  return absl::OkStatus();
}

// `model.init` (read into *initial) against the built-in model `spec`; nothing without it.
Status CheckInit(ConfigMap& model, const models::ModelSpec& spec,
                 const std::shared_ptr<const TensorList>* initial) {
  if (initial == nullptr || *initial == nullptr) return absl::OkStatus();
  std::string path;
  HUDDLE_RETURN_IF_ERROR(model.OptionalPath("init", &path));
  return CheckInitLayout(model, path, models::Layout(spec), **initial);
}

// `model: {file: PATH}`: an external model, whose tensors (names and shapes) are the file's and
// whose values are the initial global model.
Status ReadExternalModel(ConfigMap& model, models::ModelSpec* spec,
                         std::shared_ptr<const TensorList>* initial) {
  for (std::string_view key :
       {"init", "input", "layers", "input_dim", "hidden", "num_classes", "batch_norm"}) {
    if (model.Has(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          model.Where(key),
          " does not apply to an external model: model.file gives its tensors and their "
          "initial values, and nothing else is known of it"));
    }
  }
  std::string path;
  HUDDLE_RETURN_IF_ERROR(model.OptionalPath("file", &path));
  HUDDLE_ASSIGN_OR_RETURN(TensorList tensors, ReadModelValues(model, "file"));
  HUDDLE_RETURN_IF_ERROR(model.Finish());
  if (tensors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.Where("file"), ": ", path, " holds no tensors"));
  }
  models::ModelSpec external = models::ModelSpec::External(LayoutOf(tensors));
  if (Status st = models::ValidateModelSpec(external); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.Where("file"), ": ", path, ": ", st.message()));
  }
  *spec = std::move(external);
  *initial = std::make_shared<const TensorList>(std::move(tensors));
  return absl::OkStatus();
}

}  // namespace

// cli/config_sections.h
Status ReadModel(ConfigMap& top, models::ModelSpec* spec,
                 std::shared_ptr<const TensorList>* initial) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap model, top.Child("model"));
  if (initial == nullptr) {
    for (std::string_view key : {"file", "init"}) {
      if (model.Has(key)) {
        return absl::InvalidArgumentError(absl::StrCat(
            model.Where(key),
            " is not supported here: this command trains a model of Huddle's layer set from its "
            "seeded initialisation (model.file and model.init are for federated jobs)"));
      }
    }
  }
  const bool has_layers = model.Has("layers");
  const bool has_file = model.Has("file");
  std::string kind = has_file ? "external" : has_layers ? "layers" : "mlp";
  HUDDLE_RETURN_IF_ERROR(model.OptionalChoice("kind", &kind, {"mlp", "layers", "external"}));
  if (kind == "external" || has_file) {
    if (kind != "external" || !has_file) {
      return absl::InvalidArgumentError(absl::StrCat(
          model.Where(has_file ? "file" : "kind"),
          ": an external model is given by its file alone (model: {file: PATH}, kind external); "
          "a built-in model (kind mlp or layers) takes its initial weights from model.init"));
    }
    return ReadExternalModel(model, spec, initial);
  }
  if (model.Has("init")) {
    HUDDLE_ASSIGN_OR_RETURN(TensorList values, ReadModelValues(model, "init"));
    *initial = std::make_shared<const TensorList>(std::move(values));
  }
  if (kind == "mlp") {
    if (has_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(model.Where("layers"),
                       " is for kind: layers; kind: mlp takes input_dim, "
                       "hidden, num_classes and batch_norm"));
    }
    models::MlpSpec mlp;
    HUDDLE_RETURN_IF_ERROR(model.Optional("input_dim", &mlp.input_dim, 1, 1 << 24));
    HUDDLE_RETURN_IF_ERROR(model.Optional("hidden", &mlp.hidden, 1, 1 << 16));
    HUDDLE_RETURN_IF_ERROR(model.Optional("num_classes", &mlp.num_classes, 2, 1 << 16));
    HUDDLE_RETURN_IF_ERROR(model.Optional("batch_norm", &mlp.batch_norm));
    HUDDLE_RETURN_IF_ERROR(model.Finish());
    if (mlp.hidden.empty()) mlp.hidden = {128};
    *spec = mlp;
    return CheckInit(model, *spec, initial);
  }
  for (std::string_view mlp_key : {"input_dim", "hidden", "num_classes", "batch_norm"}) {
    if (model.Has(mlp_key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          model.Where(mlp_key), " is for kind: mlp; a layer list takes input and layers"));
    }
  }
  models::ModelSpec layers;
  layers.input.clear();
  HUDDLE_RETURN_IF_ERROR(model.Optional("input", &layers.input, 1, 1 << 24));
  if (layers.input.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.Where("input"),
                     " is required with layers: one example's shape, [features] or "
                     "[channels, height, width] (e.g. [1, 28, 28])"));
  }
  HUDDLE_ASSIGN_OR_RETURN(std::vector<ConfigMap> items, model.ChildList("layers"));
  for (ConfigMap& item : items) {
    HUDDLE_RETURN_IF_ERROR(ReadLayer(item, &layers.layers.emplace_back()));
  }
  HUDDLE_RETURN_IF_ERROR(model.Finish());
  if (Status st = models::ValidateModelSpec(layers); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(model.Where("layers"), ": ", st.message()));
  }
  *spec = std::move(layers);
  return CheckInit(model, *spec, initial);
}

// cli/config_sections.h
Status DpSgdFitsModel(ConfigMap& train, const models::ModelSpec& model) {
  if (Status st = models::CheckDpSgdModel(model); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(train.Where("dp_sgd"), ": ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace huddle::cli
