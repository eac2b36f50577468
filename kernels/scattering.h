// The 2-D scattering transform (Mallat 2012; Bruna & Mallat 2013): a fixed wavelet feature
// extractor with no trained parameters, the `scattering2d` layer of models/model.h. On
// DP-SGD's small budgets a classifier trained on these features beats one trained end to end
// (Tramer & Boneh, "Differentially private learning needs better features", ICLR 2021).
//
// Definition, the one kymatio's Scattering2D computes (Andreux et al. 2020), so its published
// results carry over: per input channel, the image is reflect-padded to P = (side / 2^J + 2) * 2^J
// (integer division) on each axis and transformed with the unnormalised DFT. Filters are defined
// in the Fourier domain on the padded grid: the Morlet wavelets psi_{j,t} (j < J scales, t < L
// angles; sigma 0.8 * 2^j, centre frequency 3 pi / 4 / 2^j, angle (floor(L - L / 2 - 1) - t) pi /
// L, slant 4 / L, the real part of the DFT of their 5x5-periodised spatial Gabor kernels minus the
// envelope that makes them zero-mean) and the Gaussian low-pass phi (sigma 0.8 * 2^(J-1)). A
// filter applied at resolution r (the grid subsampled by 2^r) is the low-frequency crop of its
// full-size DFT. Subsampling by k in space is the mean over the k x k aliases in the Fourier
// domain. The outputs, each low-passed by phi, subsampled to resolution J, inverse-transformed
// (real part) and cropped by one sample on each side:
//   order 0:  x * phi                                                      1 channel
//   order 1:  |x * psi_{j1,t1}| * phi                    for every (j1, t1), J L channels
//   order 2:  ||x * psi_{j1,t1}| * psi_{j2,t2}| * phi    for j1 < j2, every angle pair,
//                                                        L^2 J (J - 1) / 2 channels
// in that order ((j, t) pairs with j outer, t inner; order 2 by the first pair, then the second),
// each subsampled as early as its scale allows (|x * psi_{j1}| at resolution j1). An image of
// C channels gives C * paths output channels, input channel major. Output side:
// floor(side / 2^J). J = 2, L = 8 on a 1x28x28 image gives 81x7x7.
//
// Host only, on every backend: the layer has no parameters and no gradient flows through it, so
// a workspace transforms its data once when it loads them (models/internal/net_workspace.h), not
// once a step. The cost is about 25 MFLOP per 28x28 image (J 2, L 8) in GEMM-shaped DFTs.
// Determinism: the same inputs give the same bits on the same instruction set (Eigen GEMMs; the
// filters are built in double precision and rounded once).
#pragma once

#include <complex>
#include <cstdint>
#include <vector>

namespace huddle::kernels {

struct ScatteringShape {
  int64_t channels = 1;
  int64_t height = 0;
  int64_t width = 0;
  int64_t scales = 2;  // J, >= 1
  int64_t angles = 8;  // L, >= 1
};

// Output channels per input channel: 1 + J L + L^2 J (J - 1) / 2.
int64_t ScatteringPaths(int64_t scales, int64_t angles);

// The filters and DFT matrices of one shape, built once. Fourier-domain arrays at resolution r
// (rows h_r = padded_h / 2^r, columns w_r = padded_w / 2^r) are stored transposed, [w_r][h_r]
// row-major, as the DFT leaves them.
struct ScatteringPlan {
  ScatteringShape shape;
  int64_t paths = 0;
  int64_t padded_h = 0, padded_w = 0, pad_top = 0, pad_left = 0;
  int64_t out_h = 0, out_w = 0;
  // Per resolution r = 0..J and axis, the DFT matrices as real GEMM operands over interleaved
  // complex values (re, im): the forward DFT of a real signal ([size][2 size]), and the forward
  // and inverse (conjugate / size) DFTs of a complex one ([2 size][2 size], each complex entry
  // f as the block [[re f, im f], [-im f, re f]]). Real products run about twice as fast as
  // Eigen's complex ones.
  std::vector<std::vector<float>> dft_w_real, dft_h, idft_h, idft_w;
  // psi[j * L + t][r] for r = 0..J - 1 and phi[r] for r = 0..J - 1 (real, transposed).
  std::vector<std::vector<std::vector<float>>> psi;
  std::vector<std::vector<float>> phi;
};

// Precondition: 1 <= scales <= 4, 1 <= angles <= 16, channels >= 1, and height and width in
// [2^(J+1), 256] (models::ValidateModelSpec checks these for the layer).
ScatteringPlan MakeScatteringPlan(const ScatteringShape& shape);

// out[count, channels * paths, out_h, out_w] = the transform of in[count, channels, height,
// width]; host memory, single-threaded. Scratch allocated per call: at most 32 MiB (13.6 MiB for
// 1x28x28, J 2, L 8), or one signal's worth when that is more (45 MiB at 256x256, J 4, L 16).
void ScatteringForward(const ScatteringPlan& plan, const float* in, int64_t count, float* out);

}  // namespace huddle::kernels
