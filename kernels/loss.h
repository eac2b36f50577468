// Classification loss kernels. See kernels/dense.h for the contract shared by all kernels
// (non-owning pointers, caller-validated sizes, no failure, stateless and thread-safe).
#pragma once

#include <cstdint>

namespace huddle::kernels {

// Totals over one minibatch, so callers can average over any number of batches.
struct LossTotals {
  double loss_sum = 0.0;  // Σ_rows -log softmax(logits)[label]
  int64_t correct = 0;    // rows whose argmax (first maximum on ties) equals the label
};

// The same totals kept in device memory by Backend::SoftmaxCrossEntropy, which adds into them so
// that no batch waits for the host (kernels/backend.h).
struct LossAccumulator {
  double loss_sum = 0;  // Σ over rows of -log softmax(logits)[label]
  int64_t correct = 0;  // rows whose argmax equals the label
};

// Softmax cross-entropy of logits[batch, classes] against labels[batch].
//
// Precondition (checked by the caller): 0 <= labels[r] < classes for every row.
// Numerically stable: each row's maximum is subtracted before exponentiating.
// If dlogits is not nullptr, writes dlogits[batch, classes] = (softmax(logits) - onehot(labels)) /
// batch, the gradient of the mean loss. dlogits may be the same buffer as logits (in place);
// otherwise the two must not overlap.
LossTotals SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                               int64_t classes, float* dlogits);

}  // namespace huddle::kernels
