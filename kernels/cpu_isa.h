// The CPU instruction set the CPU kernels run on, chosen once per process at start-up.
//
// The shipped binary targets baseline x86-64. The kernels whose hot loops are Eigen GEMMs (the
// sources passed to huddle_add_cpu_isa_variants in kernels/CMakeLists.txt) are also compiled for
// AVX2 + FMA and for AVX-512, and every call runs the variant of the active set
// (kernels/cpu_isa_variant.h):
//
//   kBaseline  x86-64 as shipped (SSE2); the only set on other architectures
//   kAvx2      AVX2 + FMA (x86-64-v3's vector units), where __builtin_cpu_supports reports both
//   kAvx512    AVX-512 F, CD, BW, DQ and VL (x86-64-v4), 512-bit vectors, where it reports all
//
// The first use picks the best set this CPU supports, unless the environment variable
// HUDDLE_CPU_ISA names one (`baseline`, `avx2` or `avx512`), the one process-wide setting read from
// the environment, for reproducing a run elsewhere (or for a CPU whose clock drops under 512-bit
// code). Results are bitwise reproducible per set, not across sets: the AVX2 and AVX-512 GEMMs
// fuse multiply-adds and block differently. The code of kernels/hd.h
// keeps -ffp-contract=off in every set.
//
// Thread-safety: all functions may be called from any thread. SetCpuIsa takes effect for kernel
// calls that start after it returns.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace huddle::kernels {

enum class CpuIsa { kBaseline, kAvx2, kAvx512 };

// "baseline", "avx2" or "avx512".
const char* CpuIsaName(CpuIsa isa);

// Parses a name of CpuIsaName; the error quotes the text and lists the names.
StatusOr<CpuIsa> ParseCpuIsa(std::string_view text);

// Whether this build holds kernels for `isa` and this CPU can run them.
bool CpuIsaSupported(CpuIsa isa);

// The start-up choice, given the value of HUDDLE_CPU_ISA (nullptr when unset): the set it names
// when this CPU supports it, else the best supported set, with the reason for the log.
struct CpuIsaChoice {
  CpuIsa isa = CpuIsa::kBaseline;
  std::string reason;  // e.g. "best this CPU supports", "HUDDLE_CPU_ISA=baseline"
};
CpuIsaChoice ChooseCpuIsa(const char* requested);

// The set the CPU kernels run on now.
CpuIsa ActiveCpuIsa();

// One line for logs: the active set and why it was chosen, e.g. "avx2 (best this CPU supports)"
// or "baseline (HUDDLE_CPU_ISA=baseline)", or why HUDDLE_CPU_ISA was not followed.
std::string CpuIsaDescription();

// Makes `isa` the active set (tests and benchmarks compare sets in one process). Fails, changing
// nothing, when CpuIsaSupported(isa) is false.
Status SetCpuIsa(CpuIsa isa);

}  // namespace huddle::kernels
