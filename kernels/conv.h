// 2-D convolution kernels (PyTorch nn.Conv2d semantics, groups = dilation = 1, zero padding) and
// DP-SGD's per-example gradient norms of a convolution.
//
// Layout: NCHW, row-major float32. x [batch, in_channels, height, width]; w [out_channels,
// in_channels, kernel_h, kernel_w]; bias [out_channels]; y [batch, out_channels, out_height(),
// out_width()]. The kernels/dense.h contract applies: the caller validates shapes (every dimension
// >= 1, strides >= 1, pads >= 0, kernel no larger than the padded input), nothing here checks,
// allocates or fails. Outputs and scratch must not alias inputs or each other. Thread-safety:
// stateless; concurrent calls with disjoint outputs and scratch are safe.
//
// Method: example by example, the input is unfolded (im2col) into a [K, P] matrix, K =
// in_channels*kernel_h*kernel_w rows, one column per output position (P = out_height*out_width),
// so the convolution is the GEMM y_i [out, P] = w [out, K] · unfold(x_i). The unfolded matrices
// live in caller-provided scratch memory of Conv2dScratchFloats(shape) floats, so a training step
// allocates nothing. The CPU reference (conv_cpu.cc) runs Eigen GEMMs, single-threaded; the CUDA
// version (kernels/cuda/conv.cu) unfolds several examples at once and runs cuBLAS GEMMs.
#pragma once

#include <cstdint>

namespace huddle::kernels {

// Dimensions of one convolution applied to a minibatch.
struct Conv2dShape {
  int64_t batch = 0, in_channels = 0, height = 0, width = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;  // zero padding
  int64_t out_height() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_width() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
};

// Whether AddConv2dSquaredNorms takes the ghost norm for `shape`: its cost P² (K + out) is below
// the direct method's P K out, i.e. P (K + out) < K out (P = OH*OW, K = in*kh*kw).
inline bool Conv2dUsesGhostNorm(const Conv2dShape& s) {
  const int64_t p = s.out_height() * s.out_width(), k = s.in_channels * s.kernel_h * s.kernel_w;
  return p * (k + s.out_channels) < k * s.out_channels;
}

// Scratch floats one example needs: its unfolded input [K, P], then the larger of an output-sized
// [out, P] block (the CUDA GEMMs' transposed dy / y) and AddConv2dSquaredNorms's per-example block
// (two [P, P] Gram matrices for the ghost norm, or dW_i [out, K]).
inline int64_t Conv2dScratchFloatsPerExample(const Conv2dShape& s) {
  const int64_t p = s.out_height() * s.out_width(), k = s.in_channels * s.kernel_h * s.kernel_w;
  const int64_t norms = Conv2dUsesGhostNorm(s) ? 2 * p * p : s.out_channels * k;
  const int64_t outputs = s.out_channels * p;
  return k * p + (norms > outputs ? norms : outputs);
}

// How many examples the CUDA version processes at once, in [1, batch]: as many as fit in 16 MiB
// of scratch (the CPU reference goes one example at a time and uses the first example's share).
inline int64_t Conv2dScratchExamples(const Conv2dShape& s) {
  constexpr int64_t kTargetFloats = int64_t{1} << 22;
  const int64_t fit = kTargetFloats / Conv2dScratchFloatsPerExample(s);
  return fit < 1 ? 1 : (fit > s.batch ? s.batch : fit);
}

// Floats of scratch memory that Conv2dForward, Conv2dBackward and AddConv2dSquaredNorms need for
// `shape` (the caller allocates the maximum over its layers once): the same value on every
// backend, at most max(16 MiB, one example's share) of floats.
inline int64_t Conv2dScratchFloats(const Conv2dShape& s) {
  return Conv2dScratchExamples(s) * Conv2dScratchFloatsPerExample(s);
}

// y = conv(x, w) + bias (bias broadcast over positions); y is overwritten.
void Conv2dForward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                   float* y, float* scratch);

// Gradients of Conv2dForward given dy [batch, out_channels, OH, OW] = dLoss/dy:
//   dw [out, in, kh, kw] = Σ_i dy_i · unfold(x_i)ᵀ   (overwritten: the sum over the batch)
//   dbias [out]          = Σ_i Σ_p dy_i[:, p]        (overwritten)
//   dx [batch, in, H, W] = fold(wᵀ · dy_i)            (overwritten; skipped when dx is nullptr)
void Conv2dBackward(const Conv2dShape& s, const float* x, const float* w, const float* dy,
                    float* dw, float* dbias, float* dx, float* scratch);

// DP-SGD: squared_norms[i] += ||dW_i||_F² + ||dbias_i||² for i in [0, batch), example i's own
// weight gradient dW_i = dy_i · unfold(x_i)ᵀ and bias gradient dbias_i = Σ_p dy_i[:, p], without
// materialising every example's gradient at once. Per shape the cheaper exact method runs (the
// mixed ghost clipping rule of Bu et al. 2022): the ghost norm
//   Σ_{p,q} (<a_p, a_q> + 1) <d_p, d_q>   (a_p: column p of unfold(x_i), d_p = dy_i[:, p]),
// costing ~P² (K + out), or instantiating dW_i and dbias_i, costing ~P K out (Conv2dUsesGhostNorm).
// The GEMMs run in float; the final sums of squares and products are taken in double.
void AddConv2dSquaredNorms(const Conv2dShape& s, const float* x, const float* dy,
                           double* squared_norms, float* scratch);

}  // namespace huddle::kernels
