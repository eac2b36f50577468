// L2 clipping of updates and gradients: the sensitivity bound every DP guarantee rests on.
//
// Norms are computed in double over all tensors of an update taken together (the whole update is
// one vector). ClipToNorm guarantees that the clipped update's L2Norm, as computed here, is
// <= clip_norm, float rounding included, so a receiver that recomputes the norm with L2Norm can
// verify the bound exactly.
//
// Thread-safety: stateless functions.
#pragma once

#include <span>

#include "common/tensor.h"

namespace huddle::privacy {

// sqrt(sum of squares) over every value of every span, accumulated in double in the client update
// pipeline's order (kernels::SquaredNorm): the one norm an update's bound is stated in, which the
// client's clip (models::ClipUpdate), its privacy guard and every receiver compute. NaN if any
// value is NaN, inf if any is inf. Deterministic, and the bits depend only on the sequence of
// values, not on how it is split into spans or tensors (a receiver holding frames gets the
// sender's norm).
double L2Norm(std::span<const std::span<const float>> tensors);
double L2Norm(const TensorList& tensors);

struct ClipResult {
  double norm_before = 0;  // L2 norm of the input
  double norm_after = 0;   // L2 norm of the output, <= clip_norm
  bool clipped = false;    // norm_before > clip_norm (the update was scaled down)
};

// Scales *tensors by min(1, clip_norm / norm) (then nudges by ulps until the norm is
// <= clip_norm). clip_norm must be finite and > 0; a non-finite value in *tensors is left to the
// caller's validation (the result is then unspecified but the call returns).
ClipResult ClipToNorm(TensorList* tensors, double clip_norm);

}  // namespace huddle::privacy
