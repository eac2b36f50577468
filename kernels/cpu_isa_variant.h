// For kernel sources compiled once per CPU instruction set (kernels/cpu_isa.h,
// cmake/HuddleCpuIsa.cmake). Such a source is compiled in two roles:
//
//   variant pass   (once per set; HUDDLE_CPU_ISA_VARIANT is isa_baseline, isa_avx2, ...): the
//                  kernels, defined in namespace huddle::kernels::HUDDLE_CPU_ISA_VARIANT. Only
//                  that namespace's symbols leave the set's object.
//   dispatch pass  (once, with the project's flags; HUDDLE_CPU_ISA_VARIANT undefined): the public
//                  entry points, each a call of the active set's variant:
//
//     #if HUDDLE_CPU_ISA_DISPATCH
//     HUDDLE_CPU_ISA_DECLARE(DenseForward);
//     void DenseForward(const DenseShape& s, ...) { HUDDLE_CPU_ISA_CALL(DenseForward, s, ...); }
//     #else
//     namespace HUDDLE_CPU_ISA_VARIANT { void DenseForward(const DenseShape& s, ...) { ... } }
//     #endif
#pragma once

#include "kernels/cpu_isa.h"

#ifdef HUDDLE_CPU_ISA_VARIANT
#define HUDDLE_CPU_ISA_DISPATCH 0
#else
#define HUDDLE_CPU_ISA_DISPATCH 1

#if HUDDLE_CPU_ISA_BUILT_avx2
#define HUDDLE_CPU_ISA_DECLARE_AVX2_(fn)     \
  namespace isa_avx2 {                       \
  extern decltype(::huddle::kernels::fn) fn; \
  }
#define HUDDLE_CPU_ISA_CASE_AVX2_(fn, ...) \
  case ::huddle::kernels::CpuIsa::kAvx2:   \
    return isa_avx2::fn(__VA_ARGS__);
#else
#define HUDDLE_CPU_ISA_DECLARE_AVX2_(fn)
#define HUDDLE_CPU_ISA_CASE_AVX2_(fn, ...)
#endif

#if HUDDLE_CPU_ISA_BUILT_avx512
#define HUDDLE_CPU_ISA_DECLARE_AVX512_(fn)   \
  namespace isa_avx512 {                     \
  extern decltype(::huddle::kernels::fn) fn; \
  }
#define HUDDLE_CPU_ISA_CASE_AVX512_(fn, ...) \
  case ::huddle::kernels::CpuIsa::kAvx512:   \
    return isa_avx512::fn(__VA_ARGS__);
#else
#define HUDDLE_CPU_ISA_DECLARE_AVX512_(fn)
#define HUDDLE_CPU_ISA_CASE_AVX512_(fn, ...)
#endif

// Declares isa_<set>::fn for every set built, with the type of the public huddle::kernels::fn.
#define HUDDLE_CPU_ISA_DECLARE(fn)           \
  namespace isa_baseline {                   \
  extern decltype(::huddle::kernels::fn) fn; \
  }                                          \
  HUDDLE_CPU_ISA_DECLARE_AVX2_(fn)           \
  HUDDLE_CPU_ISA_DECLARE_AVX512_(fn) static_assert(true)

// Returns isa_<active set>::fn(args...).
#define HUDDLE_CPU_ISA_CALL(fn, ...)             \
  switch (::huddle::kernels::ActiveCpuIsa()) {   \
    HUDDLE_CPU_ISA_CASE_AVX2_(fn, __VA_ARGS__)   \
    HUDDLE_CPU_ISA_CASE_AVX512_(fn, __VA_ARGS__) \
    default:                                     \
      return isa_baseline::fn(__VA_ARGS__);      \
  }
#endif
