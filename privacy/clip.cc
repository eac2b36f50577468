#include "privacy/clip.h"

#include <cmath>

namespace huddle::privacy {
namespace {

// Sum of squares with four accumulators. Element j of the concatenation of all spans always goes
// to accumulator j % 4, and the accumulators are combined in a fixed order, so the result depends
// only on the sequence of values, not on how it is split into spans: the sender (a TensorList)
// and the receiver (spans of frames) compute the same bits.
class SumOfSquares {
 public:
  void Add(std::span<const float> values) {
    size_t i = 0;
    const size_t n = values.size();
    for (; i < n && lane_ != 0; ++i) AddOne(values[i]);
    for (; i + 4 <= n; i += 4) {
      const double a = values[i], b = values[i + 1], c = values[i + 2], d = values[i + 3];
      acc_[0] += a * a;
      acc_[1] += b * b;
      acc_[2] += c * c;
      acc_[3] += d * d;
    }
    for (; i < n; ++i) AddOne(values[i]);
  }
  // Float squares are at most 2^256 and there are fewer than 2^63 of them: no overflow, so the
  // sum is inf or NaN only if a value is.
  double Total() const { return (acc_[0] + acc_[1]) + (acc_[2] + acc_[3]); }

 private:
  void AddOne(float v) {
    const double x = v;
    acc_[lane_] += x * x;
    lane_ = (lane_ + 1) % 4;
  }
  double acc_[4] = {0, 0, 0, 0};
  size_t lane_ = 0;
};

}  // namespace

double L2Norm(std::span<const std::span<const float>> tensors) {
  SumOfSquares sum;
  for (std::span<const float> t : tensors) sum.Add(t);
  return std::sqrt(sum.Total());
}

double L2Norm(const TensorList& tensors) {
  SumOfSquares sum;
  for (const Tensor& t : tensors) sum.Add(t.data);
  return std::sqrt(sum.Total());
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
