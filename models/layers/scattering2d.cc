// scattering2d {scales, angles}: the 2-D scattering transform (kernels/scattering.h), fixed
// wavelet features without parameters; J = scales, L = angles give
// [c * (1 + J L + L^2 J (J-1) / 2), h / 2^J, w / 2^J]. Only as the first layer: no gradient flows
// through it, and a workspace transforms its data once when it loads them (NetWorkspace::LoadData),
// so it never runs as a workspace layer (no forward or backward here).
#include "kernels/scattering.h"
#include "models/layers/kinds.h"

namespace huddle::models::layers {
namespace {

StatusOr<Shape> OutputShape(const ShapeQuery& q, int64_t* /*params*/) {
  const LayerSpec& l = q.spec;
  if (q.index != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(q.where,
                     " must be the first layer: it is a fixed feature extractor that no "
                     "gradient flows through"));
  }
  HUDDLE_RETURN_IF_ERROR(NeedsImage(q));
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "scales", l.scales, 1, 4));
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "angles", l.angles, 1, 16));
  const int64_t min_side = int64_t{2} << l.scales;
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "the input height", q.in[1], min_side, 256));
  HUDDLE_RETURN_IF_ERROR(CheckRange(q.where, "the input width", q.in[2], min_side, 256));
  return Shape{q.in[0] * kernels::ScatteringPaths(l.scales, l.angles), q.in[1] >> l.scales,
               q.in[2] >> l.scales};
}

void Describe(const LayerSpec& spec, std::string* line) {
  absl::StrAppend(line, " J", spec.scales, " L", spec.angles);
}

// J = 2 and L = 8 unless given.
constexpr LayerOption kOptions[] = {
    {.key = "scales", .integer = &LayerSpec::scales, .min = 1, .max = 4, .absent = 2},
    {.key = "angles", .integer = &LayerSpec::angles, .min = 1, .max = 16, .absent = 8},
};

}  // namespace

const LayerType kScattering2d = {
    .kind = LayerKind::kScattering2d,
    .name = "scattering2d",
    .init_gain = InitGain::kLinear,
    .options = kOptions,
    .describe = Describe,
    .output_shape = OutputShape,
};

}  // namespace huddle::models::layers
