// CPU backend of kernels/loss.h: one pass per row for max/argmax, one for the exponentials.
#include <cmath>

#include "kernels/loss.h"

namespace huddle::kernels {

LossTotals SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                               int64_t classes, float* dlogits) {
  LossTotals totals;
  const float inv_batch = 1.0f / static_cast<float>(batch);
  for (int64_t r = 0; r < batch; ++r) {
    const float* row = logits + r * classes;  // [classes]
    const int32_t label = labels[r];
    int64_t argmax = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (row[c] > row[argmax]) argmax = c;
    }
    const float max = row[argmax];
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(row[c] - max);
    // -log softmax[label] = log Σ exp(l - max) - (l[label] - max).
    totals.loss_sum += static_cast<double>(std::log(sum) - (row[label] - max));
    if (argmax == label) ++totals.correct;
    if (dlogits != nullptr) {
      float* grad = dlogits + r * classes;  // [classes]; may alias row
      const float scale = inv_batch / sum;
      for (int64_t c = 0; c < classes; ++c) grad[c] = std::exp(row[c] - max) * scale;
      grad[label] -= inv_batch;
    }
  }
  return totals;
}

}  // namespace huddle::kernels
