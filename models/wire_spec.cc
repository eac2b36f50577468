#include "models/wire_spec.h"

namespace huddle::models {

StatusOr<ModelSpec> ModelSpecFromWire(const wire::ModelSpec& spec) {
  ModelSpec m;
  if (spec.kind != "external" && !spec.tensors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("coordinator's model of kind '", spec.kind,
                                                   "' lists tensors; only kind 'external' may"));
  }
  if (spec.kind == "external") {
    if (spec.tensors.empty()) {
      return absl::InvalidArgumentError(
          "coordinator's external model lists no tensors; it needs at least one");
    }
    if (!spec.input_shape.empty() || !spec.layers.empty() || !spec.hidden.empty()) {
      return absl::InvalidArgumentError(
          "coordinator's external model also gives an input shape, layers or hidden widths; an "
          "external model is its tensors only");
    }
    m = ModelSpec::External(spec.tensors);
  } else if (spec.kind == "mlp") {
    MlpSpec mlp;
    mlp.input_dim = spec.input_dim;
    mlp.hidden = spec.hidden;
    mlp.num_classes = spec.num_classes;
    mlp.batch_norm = spec.batch_norm;
    m = mlp;
  } else if (spec.kind == "layers") {
    m.input = spec.input_shape;
    for (const wire::Layer& w : spec.layers) {
      HUDDLE_ASSIGN_OR_RETURN(const LayerKind kind, ParseLayerKind(w.kind));
      m.layers.push_back(
          {kind, w.out, w.kernel, w.stride, w.padding, w.groups, w.rate, w.scales, w.angles});
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator asks for model kind '", spec.kind,
                     "'; this agent supports: mlp, layers, external"));
  }
  HUDDLE_RETURN_IF_ERROR(ValidateModelSpec(m));
  return m;
}

wire::ModelSpec ModelSpecToWire(const ModelSpec& spec) {
  wire::ModelSpec w;
  if (spec.external()) {
    w.kind = "external";
    w.tensors = spec.tensors;
    return w;
  }
  // An MLP travels as one, which agents of every release understand.
  if (std::optional<MlpSpec> mlp = AsMlp(spec)) {
    w.kind = "mlp";
    w.input_dim = mlp->input_dim;
    w.hidden = mlp->hidden;
    w.num_classes = mlp->num_classes;
    w.batch_norm = mlp->batch_norm;
    return w;
  }
  w.kind = "layers";
  w.input_shape = spec.input;
  for (const LayerSpec& l : spec.layers) {
    w.layers.push_back({std::string(LayerKindName(l.kind)), l.out, l.kernel, l.stride, l.padding,
                        l.groups, l.rate, l.scales, l.angles});
  }
  return w;
}

TrainOptions TrainOptionsFromWire(const wire::TrainConfig& train) {
  TrainOptions t;
  t.epochs = train.epochs;
  t.batch_size = train.batch_size;
  t.learning_rate = train.learning_rate;
  t.momentum = train.momentum;
  t.weight_decay = train.weight_decay;
  return t;
}

}  // namespace huddle::models
