// Helpers shared by the layer kinds' files (see layer_type.h).
#include <cmath>

#include "common/rng.h"
#include "models/layers/layer_type.h"

namespace huddle::models::layers {

Status CheckRange(const std::string& where, absl::string_view what, int64_t value, int64_t min,
                  int64_t max) {
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", what, " is ", value, "; it must be in [", min, ", ", max, "]"));
  }
  return absl::OkStatus();
}

Status NeedsImage(const ShapeQuery& q) {
  if (q.in.size() == 3) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      q.where, " needs a [channels, height, width] input", "; it gets ", ShapeString(q.in)));
}

StatusOr<int64_t> WindowOut(const std::string& where, absl::string_view dim, int64_t size,
                            const LayerSpec& l) {
  const int64_t padded = size + 2 * l.padding;
  if (l.kernel > padded) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": kernel ", l.kernel, " is larger than ",
                                                   dim, " ", size, " plus padding ",
                                                   2 * l.padding));
  }
  return (padded - l.kernel) / l.effective_stride() + 1;
}

int64_t Product(const Shape& shape) {
  int64_t p = 1;
  for (int64_t d : shape) p *= d;
  return p;
}

int64_t Spatial(const Shape& shape) {
  int64_t spatial = 1;
  for (size_t d = 1; d < shape.size(); ++d) spatial *= shape[d];
  return spatial;
}

void InitFanInUniform(size_t index, const Shape& shape, bool feeds_relu, uint64_t seed,
                      std::vector<float>* data) {
  if (index != 0) return;  // the bias: zeros
  int64_t fan_in = 1;
  for (size_t d = 1; d < shape.size(); ++d) fan_in *= shape[d];
  const double bound = std::sqrt((feeds_relu ? 6.0 : 3.0) / static_cast<double>(fan_in));
  Rng rng(seed);
  for (float& w : *data) w = static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
}

void InitOnes(size_t index, const Shape& /*shape*/, bool /*feeds_relu*/, uint64_t /*seed*/,
              std::vector<float>* data) {
  if (index == 0) std::fill(data->begin(), data->end(), 1.0f);
}

void CopyUnlessInPlace(const LayerPass& pass, const LayerState& layer) {
  if (layer.out != pass.x) {
    pass.backend.CopyOnDevice(layer.out, pass.x,
                              pass.batch * layer.out_size * static_cast<int64_t>(sizeof(float)));
  }
}

bool StartElementwiseBackward(const LayerPass& pass, const LayerState& layer) {
  if (pass.dx == nullptr) return false;
  if (!layer.in_place) {
    pass.backend.CopyOnDevice(pass.dx, layer.dout,
                              pass.batch * layer.out_size * static_cast<int64_t>(sizeof(float)));
  }
  return true;
}

}  // namespace huddle::models::layers
