// The YAML sections that the job config (cli/job_config.cc) and the datacenter config
// (cli/datacenter_config.cc) share. Internal to cli/.
#pragma once

#include <cstdint>
#include <memory>

#include "common/config_reader.h"
#include "common/status.h"
#include "common/tensor_io.h"
#include "models/model.h"

namespace huddle::cli {

// The `model` section: `kind: mlp` (the default; input_dim, hidden defaulting to [128],
// num_classes, batch_norm), a layer list (`input` and `layers`, kind `layers`), or an external
// model (`file`, kind `external`). `init: PATH` next to a built-in model gives its initial weights.
// `initial` (the initial model, or null for the seeded initialisation) may be null: then `file`
// and `init` are refused (huddle datacenter trains built-in models from their seeded init).
Status ReadModel(ConfigMap& top, models::ModelSpec* spec,
                 std::shared_ptr<const TensorList>* initial);

// `train.dp_sgd` cannot train every model (models::CheckDpSgdModel).
Status DpSgdFitsModel(ConfigMap& train, const models::ModelSpec& model);

// The SGD keys of a `train` section (a client's local epochs in a federated job, a datacenter
// job's epochs), into wire::TrainConfig or models::TrainOptions.
template <typename Train>
Status ReadSgd(ConfigMap& train, Train* t, int64_t max_epochs) {
  HUDDLE_RETURN_IF_ERROR(train.Optional("epochs", &t->epochs, 1, max_epochs));
  HUDDLE_RETURN_IF_ERROR(train.Optional("batch_size", &t->batch_size, 1, 65536));
  HUDDLE_RETURN_IF_ERROR(train.Optional("learning_rate", &t->learning_rate, 1e-9, 100.0));
  HUDDLE_RETURN_IF_ERROR(train.Optional("momentum", &t->momentum, 0.0, 0.999));
  return train.Optional("weight_decay", &t->weight_decay, 0.0, 1.0);
}

}  // namespace huddle::cli
