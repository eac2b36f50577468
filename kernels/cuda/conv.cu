// CUDA version of kernels/conv.h. Examples go in chunks of n = Conv2dScratchExamples(s): the
// chunk's inputs are unfolded into col [K, n*P] (row k, column j*P + p for example j, position p),
// so each product over the chunk is one cuBLAS GEMM:
//   forward   yt [out, n*P] = w [out, K] · col, then y_j [out, P] = yt[:, j*P...] + bias;
//   backward  dyt [out, n*P] = dy of the chunk, transposed; dw (+)= dyt · colᵀ;
//             dcol [K, n*P] = wᵀ · dyt (over col), folded back into dx by a gather (no atomics);
//   norms     per example, strided-batched GEMMs of dW_j (direct) or of the Gram matrices
//             unfold(x_j)ᵀ unfold(x_j) and dy_jᵀ dy_j (ghost), reduced in double by one block per
//             example with a fixed tree.
// Scratch: col at scratch[0, n*K*P), the per-example blocks (yt, dyt, dW_j, Gram matrices) after
// it. Every reduction has a fixed order, so results are deterministic run to run.
#include <cublas_v2.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"

namespace huddle::kernels::cuda {
namespace {

constexpr int kReduceThreads = 256;

// Sizes of one chunk's unfolding.
struct ConvGeometry {
  int64_t out_h, out_w, positions, rows, plane, examples;
};

ConvGeometry Geometry(const Conv2dShape& s) {
  ConvGeometry g;
  g.out_h = s.out_height();
  g.out_w = s.out_width();
  g.positions = g.out_h * g.out_w;
  g.rows = s.in_channels * s.kernel_h * s.kernel_w;
  g.plane = s.height * s.width;
  g.examples = Conv2dScratchExamples(s);
  return g;
}

// col[k, j*P + p] = x[first + j] unfolded, for j in [0, n).
__global__ void UnfoldKernel(Conv2dShape s, ConvGeometry g, const float* __restrict__ x,
                             int64_t first, int64_t n, float* __restrict__ col) {
  const int64_t columns = n * g.positions, total = g.rows * columns;
  for (int64_t t = GlobalThread(); t < total; t += GridThreads()) {
    const int64_t k = t / columns, column = t % columns;
    const int64_t j = column / g.positions, p = column % g.positions;
    const int64_t c = k / (s.kernel_h * s.kernel_w), kk = k % (s.kernel_h * s.kernel_w);
    const int64_t ih = (p / g.out_w) * s.stride_h - s.pad_h + kk / s.kernel_w;
    const int64_t iw = (p % g.out_w) * s.stride_w - s.pad_w + kk % s.kernel_w;
    float v = 0.0f;
    if (ih >= 0 && ih < s.height && iw >= 0 && iw < s.width) {
      v = x[((first + j) * s.in_channels + c) * g.plane + ih * s.width + iw];
    }
    col[t] = v;
  }
}

// dx[first + j] = fold(dcol) for j in [0, n): each input element gathers, in (ki, kj) order, the
// column entries that were read from it.
__global__ void FoldKernel(Conv2dShape s, ConvGeometry g, const float* __restrict__ dcol,
                           int64_t first, int64_t n, float* __restrict__ dx) {
  const int64_t columns = n * g.positions, total = n * s.in_channels * g.plane;
  for (int64_t t = GlobalThread(); t < total; t += GridThreads()) {
    const int64_t j = t / (s.in_channels * g.plane), rest = t % (s.in_channels * g.plane);
    const int64_t c = rest / g.plane, h = (rest % g.plane) / s.width, w = rest % s.width;
    float sum = 0.0f;
    for (int64_t ki = 0; ki < s.kernel_h; ++ki) {
      const int64_t oh_scaled = h + s.pad_h - ki;
      if (oh_scaled < 0 || oh_scaled % s.stride_h != 0) continue;
      const int64_t oh = oh_scaled / s.stride_h;
      if (oh >= g.out_h) continue;
      for (int64_t kj = 0; kj < s.kernel_w; ++kj) {
        const int64_t ow_scaled = w + s.pad_w - kj;
        if (ow_scaled < 0 || ow_scaled % s.stride_w != 0) continue;
        const int64_t ow = ow_scaled / s.stride_w;
        if (ow >= g.out_w) continue;
        const int64_t k = (c * s.kernel_h + ki) * s.kernel_w + kj;
        sum += dcol[k * columns + j * g.positions + oh * g.out_w + ow];
      }
    }
    dx[first * s.in_channels * g.plane + t] = sum;
  }
}

// y[first + j, o, p] = yt[o, j*P + p] + bias[o].
__global__ void UntransposeAddBiasKernel(const float* __restrict__ yt,
                                         const float* __restrict__ bias, int64_t out,
                                         int64_t positions, int64_t first, int64_t n,
                                         float* __restrict__ y) {
  const int64_t total = n * out * positions;
  for (int64_t t = GlobalThread(); t < total; t += GridThreads()) {
    const int64_t j = t / (out * positions), o = (t / positions) % out, p = t % positions;
    y[first * out * positions + t] = yt[o * n * positions + j * positions + p] + bias[o];
  }
}

// dyt[o, j*P + p] = dy[first + j, o, p].
__global__ void TransposeKernel(const float* __restrict__ dy, int64_t out, int64_t positions,
                                int64_t first, int64_t n, float* __restrict__ dyt) {
  const int64_t total = n * out * positions;
  for (int64_t t = GlobalThread(); t < total; t += GridThreads()) {
    const int64_t j = t / (out * positions), o = (t / positions) % out, p = t % positions;
    dyt[o * n * positions + j * positions + p] = dy[first * out * positions + t];
  }
}

// Fixed-tree sum of each thread's `value` over the block; thread 0 gets the total.
template <typename T>
__device__ T BlockSum(T value, T* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = kReduceThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const T total = shared[0];
  __syncthreads();
  return total;
}

// dbias[o] = Σ_i Σ_p dy[i, o, p]: one block per output channel.
__global__ void BiasGradKernel(const float* __restrict__ dy, int64_t batch, int64_t out,
                               int64_t positions, float* __restrict__ dbias) {
  __shared__ float shared[kReduceThreads];
  for (int64_t o = blockIdx.x; o < out; o += gridDim.x) {
    float sum = 0.0f;
    for (int64_t t = threadIdx.x; t < batch * positions; t += kReduceThreads) {
      const int64_t i = t / positions, p = t % positions;
      sum += dy[(i * out + o) * positions + p];
    }
    const float total = BlockSum(sum, shared);
    if (threadIdx.x == 0) dbias[o] = total;
  }
}

// squared_norms[first + j] += ||dW_j||² + Σ_o (Σ_p dy_j[o, p])²: one block per example.
__global__ void DirectNormsKernel(const float* __restrict__ dw_blocks, const float* __restrict__ dy,
                                  int64_t out, int64_t rows, int64_t positions, int64_t first,
                                  int64_t n, double* __restrict__ squared_norms) {
  __shared__ double shared[kReduceThreads];
  for (int64_t j = blockIdx.x; j < n; j += gridDim.x) {
    const float* dw_j = dw_blocks + j * out * rows;
    const float* dy_j = dy + (first + j) * out * positions;
    double sum = 0.0;
    for (int64_t t = threadIdx.x; t < out * rows; t += kReduceThreads) {
      sum += static_cast<double>(dw_j[t]) * dw_j[t];
    }
    for (int64_t o = threadIdx.x; o < out; o += kReduceThreads) {
      double bias = 0.0;
      for (int64_t p = 0; p < positions; ++p) bias += dy_j[o * positions + p];
      sum += bias * bias;
    }
    const double total = BlockSum(sum, shared);
    if (threadIdx.x == 0) squared_norms[first + j] += total;
  }
}

// squared_norms[first + j] += Σ_{p,q} (gram_a[p,q] + 1) gram_d[p,q]: one block per example; the
// two [P, P] Gram matrices of example j sit at grams + j * 2P².
__global__ void GhostNormsKernel(const float* __restrict__ grams, int64_t positions, int64_t first,
                                 int64_t n, double* __restrict__ squared_norms) {
  __shared__ double shared[kReduceThreads];
  const int64_t pp = positions * positions;
  for (int64_t j = blockIdx.x; j < n; j += gridDim.x) {
    const float* gram_a = grams + j * 2 * pp;
    const float* gram_d = gram_a + pp;
    double sum = 0.0;
    for (int64_t t = threadIdx.x; t < pp; t += kReduceThreads) {
      sum += (static_cast<double>(gram_a[t]) + 1.0) * gram_d[t];
    }
    const double total = BlockSum(sum, shared);
    if (threadIdx.x == 0) squared_norms[first + j] += total;
  }
}

// cuBLAS takes int dimensions; the trainers' shapes are validated far below 2^31.
int Int(int64_t v) { return static_cast<int>(v); }

// The first failure of a sequence of cuBLAS calls.
void Keep(cublasStatus_t status, cublasStatus_t* first) {
  if (status != CUBLAS_STATUS_SUCCESS && *first == CUBLAS_STATUS_SUCCESS) *first = status;
}

void Unfold(cudaStream_t stream, const Conv2dShape& s, const ConvGeometry& g, const float* x,
            int64_t first, int64_t n, float* col) {
  UnfoldKernel<<<BlocksFor(g.rows * n * g.positions), kThreads, 0, stream>>>(s, g, x, first, n,
                                                                             col);
}

}  // namespace

// Row-major col [K, nP] is, column-major, colᵀ [nP, K] with ld nP; likewise yt/dyt [out, nP] and
// w [out, K] (column-major wᵀ [K, out]).
cublasStatus_t LaunchConv2dForward(cudaStream_t stream, cublasHandle_t blas, const Conv2dShape& s,
                                   const float* x, const float* w, const float* bias, float* y,
                                   float* scratch) {
  const ConvGeometry g = Geometry(s);
  float* col = scratch;
  float* yt = scratch + g.examples * g.rows * g.positions;
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  for (int64_t first = 0; first < s.batch; first += g.examples) {
    const int64_t n = s.batch - first < g.examples ? s.batch - first : g.examples;
    const int64_t columns = n * g.positions;
    Unfold(stream, s, g, x, first, n, col);
    // ytᵀ [nP, out] = colᵀ [nP, K] · wᵀ [K, out]
    Keep(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, Int(columns), Int(s.out_channels), Int(g.rows),
                     &one, col, Int(columns), w, Int(g.rows), &zero, yt, Int(columns)),
         &status);
    UntransposeAddBiasKernel<<<BlocksFor(n * s.out_channels * g.positions), kThreads, 0, stream>>>(
        yt, bias, s.out_channels, g.positions, first, n, y);
  }
  return status;
}

cublasStatus_t LaunchConv2dBackward(cudaStream_t stream, cublasHandle_t blas, const Conv2dShape& s,
                                    const float* x, const float* w, const float* dy, float* dw,
                                    float* dbias, float* dx, float* scratch) {
  const ConvGeometry g = Geometry(s);
  float* col = scratch;
  float* dyt = scratch + g.examples * g.rows * g.positions;
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  BiasGradKernel<<<BlocksFor(s.out_channels, 1), kReduceThreads, 0, stream>>>(
      dy, s.batch, s.out_channels, g.positions, dbias);
  for (int64_t first = 0; first < s.batch; first += g.examples) {
    const int64_t n = s.batch - first < g.examples ? s.batch - first : g.examples;
    const int64_t columns = n * g.positions;
    Unfold(stream, s, g, x, first, n, col);
    TransposeKernel<<<BlocksFor(n * s.out_channels * g.positions), kThreads, 0, stream>>>(
        dy, s.out_channels, g.positions, first, n, dyt);
    // dwᵀ [K, out] (+)= col [K, nP] · dytᵀ [nP, out]
    const float* beta = first == 0 ? &zero : &one;
    Keep(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, Int(g.rows), Int(s.out_channels), Int(columns),
                     &one, col, Int(columns), dyt, Int(columns), beta, dw, Int(g.rows)),
         &status);
    if (dx == nullptr) continue;
    // dcolᵀ [nP, K] = dytᵀ [nP, out] · w [out, K], over col.
    Keep(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, Int(columns), Int(g.rows), Int(s.out_channels),
                     &one, dyt, Int(columns), w, Int(g.rows), &zero, col, Int(columns)),
         &status);
    FoldKernel<<<BlocksFor(n * s.in_channels * g.plane), kThreads, 0, stream>>>(s, g, col, first, n,
                                                                                dx);
  }
  return status;
}

cublasStatus_t LaunchAddConv2dSquaredNorms(cudaStream_t stream, cublasHandle_t blas,
                                           const Conv2dShape& s, const float* x, const float* dy,
                                           double* squared_norms, float* scratch) {
  const ConvGeometry g = Geometry(s);
  const bool ghost = Conv2dUsesGhostNorm(s);
  float* col = scratch;
  float* blocks = scratch + g.examples * g.rows * g.positions;
  const int64_t P = g.positions, K = g.rows, O = s.out_channels;
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  for (int64_t first = 0; first < s.batch; first += g.examples) {
    const int64_t n = s.batch - first < g.examples ? s.batch - first : g.examples;
    const int64_t columns = n * P;
    Unfold(stream, s, g, x, first, n, col);
    // Example j: unfold(x_j) is column-major Aⱼ [P, K] at col + j*P (ld nP), dy_j column-major
    // Dⱼ [P, out] at dy + (first + j)*out*P (ld P).
    const float* dy_chunk = dy + first * O * P;
    if (ghost) {
      // gram_a = Aⱼ Aⱼᵀ, gram_d = Dⱼ Dⱼᵀ, [P, P] each, at blocks + j*2P² and + P².
      Keep(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, Int(P), Int(P), Int(K), &one,
                                     col, Int(columns), P, col, Int(columns), P, &zero, blocks,
                                     Int(P), 2 * P * P, Int(n)),
           &status);
      Keep(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, Int(P), Int(P), Int(O), &one,
                                     dy_chunk, Int(P), O * P, dy_chunk, Int(P), O * P, &zero,
                                     blocks + P * P, Int(P), 2 * P * P, Int(n)),
           &status);
      GhostNormsKernel<<<BlocksFor(n, 1), kReduceThreads, 0, stream>>>(blocks, P, first, n,
                                                                       squared_norms);
    } else {
      // dW_jᵀ [K, out] = Aⱼᵀ [K, P] · Dⱼ [P, out], at blocks + j*out*K.
      Keep(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, Int(K), Int(O), Int(P), &one,
                                     col, Int(columns), P, dy_chunk, Int(P), O * P, &zero, blocks,
                                     Int(K), O * K, Int(n)),
           &status);
      DirectNormsKernel<<<BlocksFor(n, 1), kReduceThreads, 0, stream>>>(blocks, dy, O, K, P, first,
                                                                        n, squared_norms);
    }
  }
  return status;
}

}  // namespace huddle::kernels::cuda
