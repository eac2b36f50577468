// CPU reference of kernels/update.h. The arithmetic lives in kernels/update_math.h, shared with
// the CUDA kernels; this file supplies the loops in the documented order.
#include <algorithm>
#include <array>

#include "kernels/update.h"
#include "kernels/update_math.h"

namespace huddle::kernels {
namespace {

using update_math::kNormThreads;

// Σ double(f(i))² over [0, n) in update_math's order, f(i) = the i-th value given by `value`.
template <typename Value>
double OrderedSquaredSum(int64_t n, Value value) {
  const int64_t blocks = update_math::NormBlocks(n);
  const int64_t length = update_math::ChunkLength(n, blocks);
  double total = 0;
  std::array<double, kNormThreads> lanes;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * length, end = std::min(n, begin + length);
    lanes.fill(0.0);
    for (int64_t t = 0; t < kNormThreads; ++t) {
      for (int64_t i = begin + t; i < end; i += kNormThreads) {
        const double v = value(i);
        lanes[t] = hd::Add(lanes[t], hd::Mul(v, v));
      }
    }
    for (int s = kNormThreads / 2; s >= 1; s /= 2) {
      for (int t = 0; t < s; ++t) lanes[t] = hd::Add(lanes[t], lanes[t + s]);
    }
    total = hd::Add(total, lanes[0]);
  }
  return total;
}

}  // namespace

double SquaredNorm(const float* x, int64_t n) {
  return OrderedSquaredSum(n, [x](int64_t i) { return static_cast<double>(x[i]); });
}

void UpdatePipeline(const UpdatePipelineParams& p, const float* local, const float* global,
                    int64_t n, float* out, double* /*scratch*/, UpdatePipelineStats* stats) {
  // Pass 1: the norm of delta, and the clip factor.
  const double squared =
      OrderedSquaredSum(n, [&](int64_t i) { return update_math::Delta(local[i], global[i]); });
  double norm = 0;
  const double scale = update_math::ClipScale(squared, p.clip_norm, &norm);
  // Pass 2: scale.
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(hd::Mul(update_math::Delta(local[i], global[i]), scale));
  }
  stats->norm = norm;
  stats->scale = scale;
}

}  // namespace huddle::kernels
