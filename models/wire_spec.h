// Conversions between the model library's types and their wire descriptions (proto/messages.h).
// Shared by the coordinator (Welcome, FitInstruction) and the client agent, which must agree.
#pragma once

#include "common/status.h"
#include "models/model.h"
#include "proto/messages.h"

namespace huddle::models {

// InvalidArgument for a model kind other than "mlp" or "layers", an unknown layer kind, or an
// invalid spec.
StatusOr<ModelSpec> ModelSpecFromWire(const wire::ModelSpec& spec);
wire::ModelSpec ModelSpecToWire(const ModelSpec& spec);
TrainOptions TrainOptionsFromWire(const wire::TrainConfig& train);

}  // namespace huddle::models
