// CUDA version of kernels/grid_sum.h (CPU reference: kernels/grid_sum_cpu.cc). Grid-stride loops
// over kernels/grid_sum_math.h's element arithmetic, shared with the CPU, so both backends give
// the same bits; the rejected count is one atomic add per thread that saw a rejection.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/grid_sum_math.h"

namespace huddle::kernels::cuda {
namespace {

__global__ void AccumulateOnGridKernel(const float* __restrict__ x, int64_t n, double inverse_grid,
                                       double limit, int64_t* __restrict__ acc, int64_t* rejected) {
  unsigned long long refused = 0;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    int64_t units = 0;
    if (grid_sum_math::GridUnits(x[i], inverse_grid, limit, &units)) {
      acc[i] = grid_sum_math::WrappingAdd(acc[i], units);
    } else {
      ++refused;
    }
  }
  if (refused > 0) atomicAdd(reinterpret_cast<unsigned long long*>(rejected), refused);
}

__global__ void AddUnitsKernel(const int64_t* __restrict__ units, int64_t n,
                               int64_t* __restrict__ acc) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    acc[i] = grid_sum_math::WrappingAdd(acc[i], units[i]);
  }
}

__global__ void UnitsToFloatKernel(const int64_t* __restrict__ acc, int64_t n, double grid,
                                   double divisor, float* __restrict__ out) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    out[i] = grid_sum_math::UnitsValue(acc[i], grid, divisor);
  }
}

}  // namespace

void LaunchAccumulateOnGrid(cudaStream_t stream, const float* x, int64_t n, int exponent,
                            double limit, int64_t* acc, int64_t* rejected) {
  if (n == 0) return;
  AccumulateOnGridKernel<<<BlocksFor(n), kThreads, 0, stream>>>(
      x, n, grid_sum_math::Scale(-exponent), limit, acc, rejected);
}

void LaunchAddUnits(cudaStream_t stream, const int64_t* units, int64_t n, int64_t* acc) {
  if (n == 0) return;
  AddUnitsKernel<<<BlocksFor(n), kThreads, 0, stream>>>(units, n, acc);
}

void LaunchUnitsToFloat(cudaStream_t stream, const int64_t* acc, int64_t n, int exponent,
                        double divisor, float* out) {
  if (n == 0) return;
  UnitsToFloatKernel<<<BlocksFor(n), kThreads, 0, stream>>>(acc, n, grid_sum_math::Scale(exponent),
                                                            divisor, out);
}

}  // namespace huddle::kernels::cuda
