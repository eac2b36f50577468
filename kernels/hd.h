// HUDDLE_HD marks a function compiled for both the host and the device: the one definition the CPU
// reference and the CUDA kernel share (kernels/update_math.h, kernels/grid_sum_math.h), so both
// compute the same bits. Outside nvcc it expands to nothing.
//
// Bit-identical results need more than one definition: floating-point expressions must not be
// contracted into fused multiply-adds on one side only. Device code in such headers uses the
// non-contracting intrinsics through HdAdd/HdSub/HdMul/HdDiv below; host code is compiled with
// -ffp-contract=off (huddle_kernels' flags), so x86-64 and aarch64 round every step alike.
#pragma once

#if defined(__CUDACC__)
#define HUDDLE_HD __host__ __device__
#else
#define HUDDLE_HD
#endif

#include <cstdint>
#include <cstring>

namespace huddle::kernels::hd {

// Bit patterns of IEEE values (std::bit_cast is not available in device code).
HUDDLE_HD inline uint64_t DoubleBits(double v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(v));
#else
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
#endif
}
HUDDLE_HD inline double BitsToDouble(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
#endif
}
HUDDLE_HD inline uint32_t FloatBits(float v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__float_as_uint(v));
#else
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
#endif
}

// IEEE double operations, each rounded to nearest once, never fused with a neighbour.
HUDDLE_HD inline double Add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
HUDDLE_HD inline double Sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
HUDDLE_HD inline double Mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
HUDDLE_HD inline double Div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
HUDDLE_HD inline double Sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);
#endif
}

}  // namespace huddle::kernels::hd
