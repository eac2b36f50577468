// Internal to models/: the registry of layer kinds. Every LayerKind has exactly one LayerType
// (models/layers/layer_type.h), listed here in the enum's order; model.cc and NetWorkspace reach a
// kind's rules and passes only through TypeOf. (The config/wire names are public through
// models/model.h's LayerKindName and ParseLayerKind, which read this table.)
// Thread-safety: immutable tables.
#pragma once

#include <span>

#include "models/layers/layer_type.h"

namespace huddle::models::layers {

// Every kind's type, in LayerKind order.
std::span<const LayerType* const> AllLayerTypes();

// The type of `kind`; for a value outside the enum, a type named "unknown" whose shape rule
// refuses it ("model layer 2 (unknown): unknown kind") and that has nothing else.
const LayerType& TypeOf(LayerKind kind);

}  // namespace huddle::models::layers
