// Kernels of DP-SGD's per-example clipping (ghost norms) and of gathering a minibatch. See
// kernels/dense.h for the contract shared by all kernels.
//
// Per-example clipping without per-example gradients: for a dense layer with input row a_i and
// output-gradient row d_i, example i's weight gradient d_i a_iᵀ has squared Frobenius norm
// ||d_i||² ||a_i||² and its bias gradient ||d_i||². Summing that over layers gives each example's
// squared gradient norm; scaling every layer's output-gradient row i by the example's clip factor
// and running the ordinary batched weight-gradient GEMM then yields the sum of clipped gradients.
#pragma once

#include <cstdint>

namespace huddle::kernels {

// x[r, :] = features[rows[r], :] (cols floats per row) and y[r] = labels[rows[r]] for r in
// [0, count). Every rows[r] must index a row of features/labels.
void GatherRows(const float* features, const int32_t* labels, int64_t cols, const int64_t* rows,
                int64_t count, float* x, int32_t* y);

// squared_norms[i] += (Σ_k d[i, k]²) * (Σ_j a[i, j]² + 1) for i in [0, batch): one dense layer's
// contribution (weight and bias) to each example's squared gradient norm, in double.
// a: [batch, in] (the layer's input), d: [batch, out] (dLoss/d the layer's output).
void AddGhostSquaredNorms(const float* a, int64_t in, const float* d, int64_t out, int64_t batch,
                          double* squared_norms);

// How ClipFactors turns squared norms into row scale factors.
struct ClipFactorParams {
  double norm_scale = 1.0;  // norm_i = norm_scale * sqrt(squared_norms[i]) (undoes a 1/batch)
  double clip_norm = 1.0;   // C > 0
  double multiplier = 1.0;  // applied to every factor (re-applies the batch for a mean loss)
};

// factors[i] = float(multiplier * (norm_i > C ? C / norm_i : 1)) for i in [0, batch).
void ClipFactors(const double* squared_norms, int64_t batch, const ClipFactorParams& params,
                 float* factors);

// m[r, :] *= factors[r] for r in [0, rows), cols floats per row.
void ScaleRows(float* m, int64_t rows, int64_t cols, const float* factors);

}  // namespace huddle::kernels
