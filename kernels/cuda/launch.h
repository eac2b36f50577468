// Host-side launchers of the CUDA kernels (kernels/cuda/*.cu). Internal to kernels/: only the
// CUDA backend (kernels/cuda/cuda_backend.cc) includes this header. Each launcher enqueues its
// kernels on `stream` and returns at once; the semantics are those of the CPU reference named in
// the comment (kernels/<op>.h). Pointers are device pointers. Only plain kernel headers are
// included here: nvcc compiles the .cu files, which stay clear of absl and fmt.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/conv.h"
#include "kernels/dense.h"
#include "kernels/dp.h"
#include "kernels/group_norm.h"
#include "kernels/loss.h"
#include "kernels/optimizer.h"
#include "kernels/pool.h"
#include "kernels/update.h"

namespace huddle::kernels::cuda {

// ---- Normalisation, activations, dropout (kernels/cuda/group_norm.cu, activation.cu) ----
// kernels/group_norm.h
void LaunchGroupNormForward(cudaStream_t stream, const GroupNormShape& s, const float* x,
                            const float* gamma, const float* beta, double eps, float* y,
                            float* mean, float* invstd);
void LaunchGroupNormBackward(cudaStream_t stream, const GroupNormShape& s, const float* x,
                             const float* dy, const float* gamma, const float* mean,
                             const float* invstd, float* dgamma, float* dbeta, float* dx);
void LaunchAddGroupNormSquaredNorms(cudaStream_t stream, const GroupNormShape& s, const float* x,
                                    const float* dy, const float* mean, const float* invstd,
                                    double* squared_norms);
// kernels/activation.h's tanh
void LaunchTanhForward(cudaStream_t stream, float* y, int64_t n);
void LaunchTanhBackward(cudaStream_t stream, const float* y, float* dy, int64_t n);
// kernels/dropout.h: forward and backward are the same in-place masking
void LaunchDropout(cudaStream_t stream, float* v, int64_t n, float p, uint64_t seed,
                   uint64_t offset);
// ---- end normalisation, activations, dropout ----

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
// ---- Convolution and pooling (kernels/conv.h, kernels/pool.h) ----
// The convolutions also run cuBLAS GEMMs on `blas` (bound to `stream`) and return the first
// failing cuBLAS status (CUBLAS_STATUS_SUCCESS when every call was accepted); `scratch` holds
// Conv2dScratchFloats(s) floats.
cublasStatus_t LaunchConv2dForward(cudaStream_t stream, cublasHandle_t blas, const Conv2dShape& s,
                                   const float* x, const float* w, const float* bias, float* y,
                                   float* scratch);
cublasStatus_t LaunchConv2dBackward(cudaStream_t stream, cublasHandle_t blas, const Conv2dShape& s,
                                    const float* x, const float* w, const float* dy, float* dw,
                                    float* dbias, float* dx, float* scratch);
cublasStatus_t LaunchAddConv2dSquaredNorms(cudaStream_t stream, cublasHandle_t blas,
                                           const Conv2dShape& s, const float* x, const float* dy,
                                           double* squared_norms, float* scratch);
void LaunchMaxPool2dForward(cudaStream_t stream, const Pool2dShape& s, const float* x, float* y,
                            int32_t* argmax);
void LaunchMaxPool2dBackward(cudaStream_t stream, const Pool2dShape& s, const float* dy,
                             const int32_t* argmax, float* dx);
void LaunchAvgPool2dForward(cudaStream_t stream, const Pool2dShape& s, const float* x, float* y);
void LaunchAvgPool2dBackward(cudaStream_t stream, const Pool2dShape& s, const float* dy, float* dx);
// ---- end convolution and pooling ----
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
                          const float* global, int64_t n, float* out, double* scratch,
                          UpdatePipelineStats* stats);

}  // namespace huddle::kernels::cuda
