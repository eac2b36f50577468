#include "models/wire_spec.h"

namespace huddle::models {

StatusOr<MlpSpec> MlpSpecFromWire(const wire::ModelSpec& spec) {
  if (spec.kind != "mlp") {
    return absl::InvalidArgumentError(absl::StrCat("coordinator asks for model kind '", spec.kind,
                                                   "'; this agent supports: mlp"));
  }
  MlpSpec m;
  m.input_dim = spec.input_dim;
  m.hidden = spec.hidden;
  m.num_classes = spec.num_classes;
  m.batch_norm = spec.batch_norm;
  HUDDLE_RETURN_IF_ERROR(ValidateMlpSpec(m));
  return m;
}

wire::ModelSpec MlpSpecToWire(const MlpSpec& spec) {
  wire::ModelSpec w;
  w.kind = "mlp";
  w.input_dim = spec.input_dim;
  w.hidden = spec.hidden;
  w.num_classes = spec.num_classes;
  w.batch_norm = spec.batch_norm;
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
