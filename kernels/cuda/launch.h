// Host-side launchers of the CUDA kernels (kernels/cuda/*.cu). Internal to kernels/: only the
// CUDA backend (kernels/cuda/cuda_backend.cc) includes this header. Each launcher enqueues its
// kernels on `stream` and returns at once; the semantics are those of the CPU reference named in
// the comment (kernels/<op>.h). Pointers are device pointers. Only plain kernel headers are
// included here: nvcc compiles the .cu files, which stay clear of absl and fmt.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/dense.h"
#include "kernels/dp.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "kernels/update.h"

namespace huddle::kernels::cuda {

// Whether this binary holds code the current GPU can run (a GPU older than the architectures it
// was built for has none); *why gets the runtime's message when not.
bool KernelImageLoadable(std::string* why);

// kernels/dense.h's bias broadcast and column sums (the GEMMs themselves go through cuBLAS).
void LaunchAddBias(cudaStream_t stream, const float* bias, int64_t rows, int64_t cols, float* y);
void LaunchColumnSums(cudaStream_t stream, const float* m, int64_t rows, int64_t cols, float* sums);
// kernels/activation.h
void LaunchReluForward(cudaStream_t stream, float* y, int64_t n);
void LaunchReluBackward(cudaStream_t stream, const float* y, float* dy, int64_t n);
// kernels/loss.h (totals added into *totals)
void LaunchSoftmaxCrossEntropy(cudaStream_t stream, const float* logits, const int32_t* labels,
                               int64_t batch, int64_t classes, float* dlogits,
                               LossAccumulator* totals);
// kernels/optimizer.h
void LaunchSgdStep(cudaStream_t stream, const SgdHyper& hyper, const float* grad, float* param,
                   float* velocity, int64_t n);
// kernels/dp.h
void LaunchGatherRows(cudaStream_t stream, const float* features, const int32_t* labels,
                      int64_t cols, const int64_t* rows, int64_t count, float* x, int32_t* y);
void LaunchAddGhostSquaredNorms(cudaStream_t stream, const float* a, int64_t in, const float* d,
                                int64_t out, int64_t batch, double* squared_norms);
void LaunchClipFactors(cudaStream_t stream, const double* squared_norms, int64_t batch,
                       const ClipFactorParams& params, float* factors);
void LaunchScaleRows(cudaStream_t stream, float* m, int64_t rows, int64_t cols,
                     const float* factors);
// kernels/grid_sum.h
void LaunchAccumulateOnGrid(cudaStream_t stream, const float* x, int64_t n, int exponent,
                            double limit, int64_t* acc, int64_t* rejected);
void LaunchAddUnits(cudaStream_t stream, const int64_t* units, int64_t n, int64_t* acc);
void LaunchUnitsToFloat(cudaStream_t stream, const int64_t* acc, int64_t n, int exponent,
                        double divisor, float* out);
// kernels/update.h
void LaunchUpdatePipeline(cudaStream_t stream, const UpdatePipelineParams& p, const float* local,
                          const float* global, int64_t n, float* out_values, int32_t* out_units,
                          double* scratch, UpdatePipelineStats* stats);
void LaunchAccumulateFixedPoint(cudaStream_t stream, const float* x, int64_t n, double scale,
                                uint32_t abs_bits_limit, uint64_t* acc, uint32_t* rejected);

}  // namespace huddle::kernels::cuda
