// CUDA versions of the training kernels: bias, ReLU, softmax cross-entropy, SGD (the GEMMs of
// kernels/dense.h run in cuBLAS, called by cuda_backend.cc). Each matches its CPU reference in
// kernels/<op>_cpu.cc up to float rounding (tests/kernels/backend_parity_test.cc).
#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace huddle::kernels::cuda {
namespace {

__global__ void AddBiasKernel(const float* __restrict__ bias, int64_t rows, int64_t cols,
                              float* __restrict__ y) {
  const int64_t n = rows * cols;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) y[i] += bias[i % cols];
}

// sums[c] = Σ_r m[r, c]: one thread per column, rows in order (deterministic; adjacent threads
// read adjacent columns).
__global__ void ColumnSumsKernel(const float* __restrict__ m, int64_t rows, int64_t cols,
                                 float* __restrict__ sums) {
  for (int64_t c = GlobalThread(); c < cols; c += GridThreads()) {
    float s = 0.0f;
    for (int64_t r = 0; r < rows; ++r) s += m[r * cols + c];
    sums[c] = s;
  }
}

__global__ void ReluForwardKernel(float* y, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

__global__ void ReluBackwardKernel(const float* __restrict__ y, float* __restrict__ dy, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// One warp per row. Lane l handles columns l, l + 32, ...; all reads of a row happen before any
// write, so dlogits may alias logits.
__global__ void SoftmaxCrossEntropyKernel(const float* logits, const int32_t* __restrict__ labels,
                                          int64_t batch, int64_t classes, float* dlogits,
                                          LossAccumulator* totals) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = GridThreads() / 32;
  const float inv_batch = 1.0f / static_cast<float>(batch);
  for (int64_t r = GlobalThread() / 32; r < batch; r += warps) {
    const float* row = logits + r * classes;
    const int32_t label = labels[r];
    // Max and first argmax.
    float best = -FLT_MAX;
    int64_t best_index = classes;
    for (int64_t c = lane; c < classes; c += 32) {
      if (row[c] > best || best_index == classes) {
        best = row[c];
        best_index = c;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_down_sync(0xffffffffu, best, offset);
      const int64_t other_index = __shfl_down_sync(0xffffffffu, best_index, offset);
      if (other_index < classes &&
          (best_index == classes || other > best || (other == best && other_index < best_index))) {
        best = other;
        best_index = other_index;
      }
    }
    best = __shfl_sync(0xffffffffu, best, 0);
    best_index = __shfl_sync(0xffffffffu, best_index, 0);
    float sum = 0.0f;
    for (int64_t c = lane; c < classes; c += 32) sum += expf(row[c] - best);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float label_logit = row[label];
    __syncwarp();
    if (lane == 0) {
      atomicAdd(&totals->loss_sum, static_cast<double>(logf(sum) - (label_logit - best)));
      if (best_index == label) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&totals->correct), 1ull);
      }
    }
    if (dlogits != nullptr) {
      float* grad = dlogits + r * classes;
      const float scale = inv_batch / sum;
      for (int64_t c = lane; c < classes; c += 32) {
        const float g = expf(row[c] - best) * scale;
        grad[c] = c == label ? g - inv_batch : g;
      }
    }
    __syncwarp();
  }
}

__global__ void SgdKernel(float lr, float wd, float mu, const float* __restrict__ grad,
                          float* __restrict__ param, float* __restrict__ velocity, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float g = grad[i] + wd * param[i];
    if (mu == 0.0f) {
      param[i] -= lr * g;
    } else {
      const float v = mu * velocity[i] + g;
      velocity[i] = v;
      param[i] -= lr * v;
    }
  }
}

}  // namespace

void LaunchAddBias(cudaStream_t stream, const float* bias, int64_t rows, int64_t cols, float* y) {
  AddBiasKernel<<<BlocksFor(rows * cols), kThreads, 0, stream>>>(bias, rows, cols, y);
}

void LaunchColumnSums(cudaStream_t stream, const float* m, int64_t rows, int64_t cols,
                      float* sums) {
  ColumnSumsKernel<<<BlocksFor(cols), kThreads, 0, stream>>>(m, rows, cols, sums);
}

void LaunchReluForward(cudaStream_t stream, float* y, int64_t n) {
  ReluForwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(y, n);
}

void LaunchReluBackward(cudaStream_t stream, const float* y, float* dy, int64_t n) {
  ReluBackwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(y, dy, n);
}

void LaunchSoftmaxCrossEntropy(cudaStream_t stream, const float* logits, const int32_t* labels,
                               int64_t batch, int64_t classes, float* dlogits,
                               LossAccumulator* totals) {
  SoftmaxCrossEntropyKernel<<<BlocksFor(batch * 32), kThreads, 0, stream>>>(
      logits, labels, batch, classes, dlogits, totals);
}

void LaunchSgdStep(cudaStream_t stream, const SgdHyper& hyper, const float* grad, float* param,
                   float* velocity, int64_t n) {
  SgdKernel<<<BlocksFor(n), kThreads, 0, stream>>>(hyper.learning_rate, hyper.weight_decay,
                                                   hyper.momentum, grad, param, velocity, n);
}

bool KernelImageLoadable(std::string* why) {
  cudaFuncAttributes attributes;
  const cudaError_t err = cudaFuncGetAttributes(&attributes, ReluForwardKernel);
  if (err == cudaSuccess) return true;
  *why = cudaGetErrorString(err);
  return false;
}

}  // namespace huddle::kernels::cuda
