// Host-side launchers of the batch-normalization kernels (kernels/cuda/batch_norm.cu). Internal to
// kernels/: for the CUDA backend, like kernels/cuda/launch.h (kept apart from it so that adding
// these does not rebuild every user of launch.h). Each launcher enqueues its kernels on `stream`
// and returns at once; pointers are device pointers; the semantics, aliasing rules and results
// (the same bits) are those of the CPU function of the same name in kernels/batch_norm.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/batch_norm.h"

namespace huddle::kernels::cuda {

void LaunchBatchNormSums(cudaStream_t stream, const float* x, int64_t batch, int64_t features,
                         int64_t spatial, double* sums);
void LaunchBatchNormMoments(cudaStream_t stream, const double* sums, int64_t count,
                            int64_t features, double eps, float* mean, float* invstd);
void LaunchBatchNormUpdateRunning(cudaStream_t stream, const double* sums, int64_t count,
                                  int64_t features, double momentum, float* running_mean,
                                  float* running_var);
void LaunchBatchNormInvStd(cudaStream_t stream, const float* var, int64_t features, double eps,
                           float* invstd);
void LaunchBatchNormForward(cudaStream_t stream, const float* x, int64_t batch, int64_t features,
                            int64_t spatial, const float* mean, const float* invstd,
                            const float* gamma, const float* beta, float* y);
void LaunchBatchNormBackwardSums(cudaStream_t stream, const float* dy, const float* x,
                                 const float* mean, const float* invstd, int64_t batch,
                                 int64_t features, int64_t spatial, double* sums);
void LaunchBatchNormParamGrads(cudaStream_t stream, const double* sums, int64_t features,
                               float* dgamma, float* dbeta);
void LaunchBatchNormBackwardInput(cudaStream_t stream, const float* dy, const float* x,
                                  const float* mean, const float* invstd, const float* gamma,
                                  const double* sums, int64_t count, int64_t batch,
                                  int64_t features, int64_t spatial, float* dx);

}  // namespace huddle::kernels::cuda
