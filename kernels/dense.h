// Fully connected (dense) layer kernels: y = x · Wᵀ + b and its gradients.
//
// Layout: every matrix is row-major float32. `batch` rows of examples, `in` input features,
// `out` output units. The weight matrix is [out, in] (PyTorch's nn.Linear convention), so one
// output unit's weights are contiguous.
//
// Contract shared by all kernels in kernels/: pointers are non-owning and must point at buffers of
// at least the documented number of elements; dimensions are >= 1. The caller validates shapes and
// labels before calling (these functions do not check or fail). They take no buffers of the
// caller's; the CPU GEMMs of large products allocate Eigen's blocking workspace (and DenseForward
// a [batch, out] product for weights of 2^20 floats or more), as any Eigen product of that size
// does. Outputs must not alias inputs unless stated. Thread-safety: stateless; concurrent calls on
// disjoint outputs are safe.
//
// Backends: this header is host-only and holds the one signature of each op. The CPU reference
// lives in dense_cpu.cc (Eigen GEMMs, single-threaded, built per instruction set: cpu_isa.h); the
// CUDA version (cuda/dense.cu, cuBLAS) sits behind the same Backend call.
#pragma once

#include <cstdint>

namespace huddle::kernels {

// Dimensions of one dense layer applied to a minibatch.
struct DenseShape {
  int64_t batch = 0;  // rows of x and y
  int64_t in = 0;     // features per input row
  int64_t out = 0;    // units per output row
};

// y[batch, out] = x[batch, in] · w[out, in]ᵀ + bias[out] (bias broadcast over rows).
// y is overwritten.
void DenseForward(const DenseShape& shape, const float* x, const float* w, const float* bias,
                  float* y);

// Gradients of DenseForward given dy[batch, out] = dLoss/dy:
//   dw[out, in]   = dyᵀ · x           (overwritten, not accumulated)
//   dbias[out]    = Σ_rows dy          (overwritten)
//   dx[batch, in] = dy · w             (overwritten; skipped when dx is nullptr, e.g. for the
//                                        first layer whose input needs no gradient)
void DenseBackward(const DenseShape& shape, const float* x, const float* w, const float* dy,
                   float* dw, float* dbias, float* dx);

}  // namespace huddle::kernels
