// The active CPU instruction set (see cpu_isa.h).
#include "kernels/cpu_isa.h"

#include <absl/strings/str_cat.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace huddle::kernels {
namespace {

#if HUDDLE_CPU_ISA_BUILT_avx2
constexpr bool kAvx2Built = true;
#else
constexpr bool kAvx2Built = false;
#endif

// Why `isa` cannot run here (CpuIsaSupported(isa) is false).
const char* Unsupported(CpuIsa isa) {
  return isa == CpuIsa::kAvx2 && !kAvx2Built ? "this build has no such kernels"
                                             : "this CPU lacks it";
}

// The best set this build and CPU support.
CpuIsa BestCpuIsa() { return CpuIsaSupported(CpuIsa::kAvx2) ? CpuIsa::kAvx2 : CpuIsa::kBaseline; }

const CpuIsaChoice& Startup() {
  static const auto* choice = new CpuIsaChoice(ChooseCpuIsa(std::getenv("HUDDLE_CPU_ISA")));
  return *choice;
}

// The active set, as an int (atomic); starts as the start-up choice.
std::atomic<int>& Active() {
  static std::atomic<int> active{static_cast<int>(Startup().isa)};
  return active;
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "baseline"; }

StatusOr<CpuIsa> ParseCpuIsa(std::string_view text) {
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2}) {
    if (text == CpuIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("CPU instruction set '", std::string(text), "' is not one of baseline, avx2"));
}

bool CpuIsaSupported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      return true;
    case CpuIsa::kAvx2:
#if HUDDLE_CPU_ISA_BUILT_avx2
      // libgcc's checks include the OS's saving of the YMM registers (XGETBV).
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;  // this build has no AVX2 kernels
#endif
  }
  return false;
}

CpuIsaChoice ChooseCpuIsa(const char* requested) {
  const CpuIsa best = BestCpuIsa();
  if (requested == nullptr || *requested == '\0') return {best, "best this CPU supports"};
  const StatusOr<CpuIsa> asked = ParseCpuIsa(requested);
  if (!asked.ok()) {
    return {best, absl::StrCat("HUDDLE_CPU_ISA ignored: ", asked.status().message())};
  }
  if (!CpuIsaSupported(*asked)) {
    return {best, absl::StrCat("HUDDLE_CPU_ISA=", requested, " ignored: ", Unsupported(*asked))};
  }
  return {*asked, absl::StrCat("HUDDLE_CPU_ISA=", requested)};
}

CpuIsa ActiveCpuIsa() { return static_cast<CpuIsa>(Active().load(std::memory_order_relaxed)); }

std::string CpuIsaDescription() {
  const CpuIsa active = ActiveCpuIsa();
  if (active != Startup().isa) return absl::StrCat(CpuIsaName(active), " (set by the program)");
  return absl::StrCat(CpuIsaName(active), " (", Startup().reason, ")");
}

Status SetCpuIsa(CpuIsa isa) {
  if (!CpuIsaSupported(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("CPU instruction set ", CpuIsaName(isa), " cannot run: ", Unsupported(isa)));
  }
  Active().store(static_cast<int>(isa), std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace huddle::kernels
