// The client's update pipeline as one kernel. See kernels/dense.h for the contract shared by all
// kernels.
//
// UpdatePipeline turns a locally trained model into what the client sends:
//   delta_i = local_i - global_i                        (float, as the CPU client computes it)
//   norm    = sqrt(Σ double(delta_i)²)                  (one pass over memory)
//   scale   = norm > C ? (C / norm) * (1 - 2^-20) : 1   (C = clip_norm; no clipping when C = 0)
//   v_i     = double(delta_i) * scale
//   quantum == 0: out_values[i] = float(v_i)
//   quantum  > 0: out_units[i] = stochastic_round(v_i / quantum) saturated to int32, and
//                 out_values[i] (if not null) = float(out_units[i] * quantum)
// (second pass over memory). The factor (1 - 2^-20) absorbs the float rounding of v_i, so
// privacy::L2Norm of the float output never exceeds C. Stochastic rounding rounds u up with
// probability frac(u), drawing 32 bits per element from the key's rounding stream
// (kernels/noise_stream.h), so the rounding is unbiased and reproducible. A non-finite delta makes
// norm NaN and scale 0 (the caller must refuse the update). The pipeline
// adds no noise: privacy noise is the exact discrete Gaussian of privacy/noise.h, added on the
// host.
#pragma once

#include <cstdint>

#include "kernels/noise_stream.h"

namespace huddle::kernels {

struct UpdatePipelineParams {
  double clip_norm = 0;          // C >= 0; 0 disables clipping
  NoiseKey key;                  // the rounding stream's (quantum > 0)
  uint64_t rounding_offset = 0;  // first index of the rounding stream this update uses
  double quantum = 0;            // >= 0; 0 writes floats only
};

// Written by the pipeline in device memory (read back with the outputs).
struct UpdatePipelineStats {
  double norm = 0;        // L2 norm of delta before clipping (NaN if any element is non-finite)
  double scale = 1;       // the clip factor applied
  int64_t saturated = 0;  // elements whose quantized value was clamped to the int32 range
};

// Scratch doubles UpdatePipeline needs for its norm reduction (any backend).
inline constexpr int64_t kUpdatePipelineScratch = 1024;

// CPU reference. out_values may be null when quantum > 0; out_units may be null when quantum == 0.
// scratch: kUpdatePipelineScratch doubles (unused on the CPU).
void UpdatePipeline(const UpdatePipelineParams& p, const float* local, const float* global,
                    int64_t n, float* out_values, int32_t* out_units, double* scratch,
                    UpdatePipelineStats* stats);

// The squared L2 norm Σ double(x_i)² in a fixed summation order (kernels/update_math.h), the
// order the pipeline's first pass uses on every backend.
double SquaredNorm(const float* x, int64_t n);

}  // namespace huddle::kernels
