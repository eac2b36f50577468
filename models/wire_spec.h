// Conversions between the model library's types and their wire descriptions (proto/messages.h).
// Shared by the coordinator (Welcome, FitInstruction) and the client agent, which must agree.
#pragma once

#include "common/status.h"
#include "models/model.h"
#include "proto/messages.h"

namespace huddle::models {

// InvalidArgument for a model kind other than "mlp", "layers" or "external", an unknown layer
// kind, tensors on a kind other than "external", an external model without tensors, or an invalid
// spec (for an external one, ValidateModelSpec's error naming the tensor).
StatusOr<ModelSpec> ModelSpecFromWire(const wire::ModelSpec& spec);
wire::ModelSpec ModelSpecToWire(const ModelSpec& spec);
TrainOptions TrainOptionsFromWire(const wire::TrainConfig& train);

}  // namespace huddle::models
