// The registry of layer kinds (see registry.h): a new kind is one line here.
#include "models/layers/registry.h"

#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

// In LayerKind order: TypeOf indexes it by the enumerator.
constexpr const LayerType* kTypes[] = {
    &kDense, &kConv2d, &kMaxPool2d, &kAvgPool2d, &kBatchNorm,    &kGroupNorm,
    &kRelu,  &kTanh,   &kDropout,   &kFlatten,   &kScattering2d,
};
static_assert(std::size(kTypes) == static_cast<size_t>(LayerKind::kScattering2d) + 1,
              "every LayerKind needs its LayerType here");

// What TypeOf answers for a value outside the enum (a cast gone wrong): every spec using it fails
// validation, and nothing else runs on an invalid spec.
StatusOr<Shape> UnknownShape(const ShapeQuery& q, int64_t* /*params*/) {
  return absl::InvalidArgumentError(absl::StrCat(q.where, ": unknown kind"));
}
constexpr LayerType kUnknown = {
    .kind = LayerKind::kRelu,
    .name = "unknown",
    .output_shape = UnknownShape,
};

}  // namespace

std::span<const LayerType* const> AllLayerTypes() { return kTypes; }

const LayerType& TypeOf(LayerKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < std::size(kTypes) ? *kTypes[i] : kUnknown;
}

}  // namespace huddle::models::layers
