// Conversions between the model library's types and their wire descriptions (proto/messages.h).
// Shared by the coordinator (Welcome, FitInstruction) and the client agent, which must agree.
#pragma once

#include "common/status.h"
#include "models/mlp.h"
#include "proto/messages.h"

namespace huddle::models {

// InvalidArgument for a model kind other than "mlp" or an invalid spec.
StatusOr<MlpSpec> MlpSpecFromWire(const wire::ModelSpec& spec);
wire::ModelSpec MlpSpecToWire(const MlpSpec& spec);
TrainOptions TrainOptionsFromWire(const wire::TrainConfig& train);

}  // namespace huddle::models
