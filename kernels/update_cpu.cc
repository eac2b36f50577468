// CPU reference of kernels/update.h. The arithmetic lives in kernels/update_math.h, shared with
// the CUDA kernels; this file supplies the loops in the documented order.
#include <algorithm>
#include <array>

#include "kernels/update.h"
#include "kernels/update_math.h"

namespace huddle::kernels {
namespace {

using update_math::kNormThreads;

// Σ double(v_i)² over [0, n) in update_math's order, v_i the i-th value `next` returns (called
// once per element, in increasing i). Lane t of a block takes the block's elements t,
// t + kNormThreads, ... in increasing order, so visiting the block's elements in order and
// handing element k to lane k mod kNormThreads adds to every lane what the CUDA thread adds.
template <typename Next>
double OrderedSquaredSum(int64_t n, Next next) {
  const int64_t blocks = update_math::NormBlocks(n);
  const int64_t length = update_math::ChunkLength(n, blocks);
  double total = 0;
  std::array<double, kNormThreads> lanes;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * length, end = std::min(n, begin + length);
    lanes.fill(0.0);
    int t = 0;
    for (int64_t i = begin; i < end; ++i) {
      const double v = next();
      lanes[t] = hd::Add(lanes[t], hd::Mul(v, v));
      if (++t == kNormThreads) t = 0;
    }
    for (int s = kNormThreads / 2; s >= 1; s /= 2) {
      for (int u = 0; u < s; ++u) lanes[u] = hd::Add(lanes[u], lanes[u + s]);
    }
    total = hd::Add(total, lanes[0]);
  }
  return total;
}

// The values of consecutive pieces of one vector, in order.
class PieceReader {
 public:
  explicit PieceReader(std::span<const std::span<float>> pieces) : pieces_(pieces) {}
  float Next() {
    while (at_ == pieces_[piece_].size()) {
      ++piece_;
      at_ = 0;
    }
    return pieces_[piece_][at_++];
  }

 private:
  std::span<const std::span<float>> pieces_;
  size_t piece_ = 0, at_ = 0;
};

}  // namespace

void UpdatePipeline(const UpdatePipelineParams& p, const float* local, const float* global,
                    int64_t n, float* out, double* /*scratch*/, UpdatePipelineStats* stats) {
  // Pass 1: the norm of delta, and the clip factor.
  int64_t at = 0;
  const double squared = OrderedSquaredSum(n, [&] {
    const int64_t i = at++;
    return update_math::Delta(local[i], global[i]);
  });
  double norm = 0;
  const double scale = update_math::ClipScale(squared, p.clip_norm, &norm);
  // Pass 2: scale (element i is read before it is written: out may be local).
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(hd::Mul(update_math::Delta(local[i], global[i]), scale));
  }
  stats->norm = norm;
  stats->scale = scale;
}

void ClipInPlace(const UpdatePipelineParams& p, std::span<const std::span<float>> pieces,
                 UpdatePipelineStats* stats) {
  int64_t n = 0;
  for (std::span<float> piece : pieces) n += static_cast<int64_t>(piece.size());
  PieceReader reader(pieces);
  const double squared =
      OrderedSquaredSum(n, [&] { return update_math::Delta(reader.Next(), 0.0f); });
  double norm = 0;
  const double scale = update_math::ClipScale(squared, p.clip_norm, &norm);
  if (scale != 1.0) {  // a factor of 1 leaves every value as it is
    for (std::span<float> piece : pieces) {
      for (float& v : piece) v = static_cast<float>(hd::Mul(update_math::Delta(v, 0.0f), scale));
    }
  }
  stats->norm = norm;
  stats->scale = scale;
}

}  // namespace huddle::kernels
