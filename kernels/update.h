// The client's update pipeline as one kernel. See kernels/dense.h for the contract shared by all
// kernels.
//
// UpdatePipeline turns a locally trained model into what the client sends:
//   delta_i = local_i - global_i                        (float, as the CPU client computes it)
//   norm    = sqrt(Σ double(delta_i)²)                  (one pass over memory)
//   scale   = norm > C ? (C / norm) * (1 - 2^-20) : 1   (C = clip_norm; no clipping when C = 0)
//   out[i]  = float(double(delta_i) * scale)             (second pass over memory)
// The factor (1 - 2^-20) absorbs the float rounding of the output, so the norm of the output, in
// the same order (SquaredNorm below, which privacy::L2Norm, the norm every receiver checks, is),
// stays below C.
// A non-finite delta makes norm NaN and scale 0 (the caller must refuse the update). The pipeline
// adds no noise: privacy noise is the exact discrete Gaussian of privacy/noise.h, added on the
// host.
//
// The sum's order is kernels/update_math.h's, a function of the position of each element in the
// n-element vector alone: the same vector gives the same bits on every backend and whether it is
// held in one buffer (UpdatePipeline) or as a model's tensors on the host (ClipInPlace).
#pragma once

#include <cstdint>
#include <span>

namespace huddle::kernels {

struct UpdatePipelineParams {
  double clip_norm = 0;  // C >= 0; 0 disables clipping
};

// Written by the pipeline in device memory (read back with the output).
struct UpdatePipelineStats {
  double norm = 0;   // L2 norm of delta before clipping (NaN if any element is non-finite)
  double scale = 1;  // the clip factor applied
};

// Scratch doubles UpdatePipeline needs for its norm reduction (any backend).
inline constexpr int64_t kUpdatePipelineScratch = 1024;

// CPU reference. out: n floats, which may be `local` itself (the pipeline then runs in place);
// scratch: kUpdatePipelineScratch doubles (unused on the CPU).
void UpdatePipeline(const UpdatePipelineParams& p, const float* local, const float* global,
                    int64_t n, float* out, double* scratch, UpdatePipelineStats* stats);

// The pipeline on a delta already taken, held on the host as consecutive pieces of one vector (a
// model's tensors, in order), in place: exactly UpdatePipeline(p, x, zeros, n, x) on their
// concatenation x, bit for bit, without concatenating.
void ClipInPlace(const UpdatePipelineParams& p, std::span<const std::span<float>> pieces,
                 UpdatePipelineStats* stats);

// Σ double(x_i)² over the concatenation x of `pieces`, in the pipeline's order: the squared norm
// UpdatePipeline and ClipInPlace compute, bit for bit, however the vector is split into pieces.
// privacy::L2Norm is its square root: the one norm an update's bound is stated and checked in.
double SquaredNorm(std::span<const std::span<const float>> pieces);

}  // namespace huddle::kernels
