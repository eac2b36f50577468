// CPU reference of kernels/update.h. The arithmetic lives in kernels/update_math.h, shared with
// the CUDA kernels; this file supplies the loops in the documented order.
#include <algorithm>
#include <array>

#include "kernels/update.h"
#include "kernels/update_math.h"

namespace huddle::kernels {
namespace {

using update_math::kNormThreads;

// Σ double(v_i)² over [0, n) in update_math's order, v_i the i-th value of the concatenation of
// `pieces` (taken as the pipeline's Delta(v, 0), which is double(v)). Lane t of a block takes the
// block's elements t, t + kNormThreads, ... in increasing order, so visiting the block's elements
// in order and handing element k to lane k mod kNormThreads adds to every lane what the CUDA thread
// adds. Runs of kNormThreads values within one piece take a loop over the lanes that the compiler
// vectorises (the same additions, one per lane, so the same bits).
template <typename T>
double OrderedSquaredSum(std::span<const std::span<T>> pieces) {
  int64_t n = 0;
  for (std::span<T> piece : pieces) n += static_cast<int64_t>(piece.size());
  const int64_t blocks = update_math::NormBlocks(n);
  const int64_t length = update_math::ChunkLength(n, blocks);
  double total = 0;
  std::array<double, kNormThreads> lanes;
  size_t piece = 0, at = 0;  // the next value: pieces[piece][at]
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t left = std::min(n, (b + 1) * length) - b * length;  // values left in the block
    lanes.fill(0.0);
    int t = 0;
    while (left > 0) {
      while (at == pieces[piece].size()) {
        ++piece;
        at = 0;
      }
      const T* x = pieces[piece].data() + at;
      if (t == 0 && left >= kNormThreads &&
          pieces[piece].size() - at >= static_cast<size_t>(kNormThreads)) {
        for (int u = 0; u < kNormThreads; ++u) {
          const double v = update_math::Delta(x[u], 0.0f);
          lanes[u] = hd::Add(lanes[u], hd::Mul(v, v));
        }
        at += kNormThreads;
        left -= kNormThreads;
        continue;
      }
      const double v = update_math::Delta(*x, 0.0f);
      lanes[t] = hd::Add(lanes[t], hd::Mul(v, v));
      if (++t == kNormThreads) t = 0;
      ++at;
      --left;
    }
    for (int s = kNormThreads / 2; s >= 1; s /= 2) {
      for (int u = 0; u < s; ++u) lanes[u] = hd::Add(lanes[u], lanes[u + s]);
    }
    total = hd::Add(total, lanes[0]);
  }
  return total;
}

}  // namespace

void UpdatePipeline(const UpdatePipelineParams& p, const float* local, const float* global,
                    int64_t n, float* out, double* /*scratch*/, UpdatePipelineStats* stats) {
  // Pass 1: the norm of delta (as floats, into out: the pipeline's delta is float), and the clip
  // factor. Pass 2: scale in place.
  for (int64_t i = 0; i < n; ++i) out[i] = local[i] - global[i];
  const std::span<float> delta(out, static_cast<size_t>(n));
  ClipInPlace(p, std::span<const std::span<float>>(&delta, 1), stats);
}

void ClipInPlace(const UpdatePipelineParams& p, std::span<const std::span<float>> pieces,
                 UpdatePipelineStats* stats) {
  double norm = 0;
  const double scale = update_math::ClipScale(OrderedSquaredSum(pieces), p.clip_norm, &norm);
  if (scale != 1.0) {  // a factor of 1 leaves every value as it is
    for (std::span<float> piece : pieces) {
      for (float& v : piece) v = static_cast<float>(hd::Mul(update_math::Delta(v, 0.0f), scale));
    }
  }
  stats->norm = norm;
  stats->scale = scale;
}

double SquaredNorm(std::span<const std::span<const float>> pieces) {
  return OrderedSquaredSum(pieces);
}

}  // namespace huddle::kernels
