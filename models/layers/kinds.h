// Internal to models/layers/: the LayerType of every kind, one per file of this folder, for the
// registry (registry.cc lists them) and the kinds' own files.
#pragma once

#include "models/layers/layer_type.h"

namespace huddle::models::layers {

extern const LayerType kDense;         // dense.cc
extern const LayerType kConv2d;        // conv2d.cc
extern const LayerType kMaxPool2d;     // max_pool2d.cc
extern const LayerType kAvgPool2d;     // avg_pool2d.cc
extern const LayerType kBatchNorm;     // batch_norm.cc
extern const LayerType kGroupNorm;     // group_norm.cc
extern const LayerType kRelu;          // activation.cc
extern const LayerType kTanh;          // activation.cc
extern const LayerType kDropout;       // dropout.cc
extern const LayerType kFlatten;       // flatten.cc
extern const LayerType kScattering2d;  // scattering2d.cc

}  // namespace huddle::models::layers
