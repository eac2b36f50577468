#include "privacy/clip.h"

#include <cmath>
#include <vector>

#include "kernels/update.h"

namespace huddle::privacy {

// The squares are summed in the update pipeline's order (kernels/update.h, SquaredNorm), a function
// of each value's position in the concatenation alone: the client's clip, its own check, and the
// receiver (spans of frames) compute the same bits.
double L2Norm(std::span<const std::span<const float>> tensors) {
  return std::sqrt(kernels::SquaredNorm(tensors));
}

double L2Norm(const TensorList& tensors) {
  std::vector<std::span<const float>> spans;
  spans.reserve(tensors.size());
  for (const Tensor& t : tensors) spans.emplace_back(t.data);
  return L2Norm(spans);
}

// Invariant on return: result.norm_after == L2L2Norm(*tensors) <= clip_norm whenever the input norm
// and clip_norm are finite and clip_norm >= 0. Otherwise (a contract violation) nothing changes.
ClipResult ClipToNorm(TensorList* tensors, double clip_norm) {
  ClipResult result;
  result.norm_before = L2Norm(*tensors);
  result.norm_after = result.norm_before;
  if (!std::isfinite(result.norm_before) || !std::isfinite(clip_norm) || !(clip_norm >= 0) ||
      result.norm_before <= clip_norm) {
    return result;
  }
  result.clipped = true;
  const double scale = clip_norm / result.norm_before;  // in [0, 1)
  for (Tensor& t : *tensors) {
    for (float& v : t.data) v = static_cast<float>(static_cast<double>(v) * scale);
  }
  result.norm_after = L2Norm(*tensors);
  // Float rounding can leave the norm a few ulps above clip_norm. Shrink by factors
  // 1 - 2^-23, 1 - 2^-22, ...: each moves every normal float down by at least one ulp, and the
  // 24th factor is 0, so the loop ends (an all-zero update has norm 0 <= clip_norm).
  for (int step = 0; result.norm_after > clip_norm; ++step) {
    const double shrink = step < 23 ? 1 - std::ldexp(1.0, step - 23) : 0.0;
    for (Tensor& t : *tensors) {
      for (float& v : t.data) v = static_cast<float>(static_cast<double>(v) * shrink);
    }
    result.norm_after = L2Norm(*tensors);
  }
  return result;
}

}  // namespace huddle::privacy
