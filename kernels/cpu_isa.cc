// The active CPU instruction set (see cpu_isa.h).
#include "kernels/cpu_isa.h"

#include <absl/strings/str_cat.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace huddle::kernels {
namespace {

constexpr CpuIsa kAll[] = {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512};

bool Built(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      return true;
    case CpuIsa::kAvx2:
#if HUDDLE_CPU_ISA_BUILT_avx2
      return true;
#else
      return false;
#endif
    case CpuIsa::kAvx512:
#if HUDDLE_CPU_ISA_BUILT_avx512
      return true;
#else
      return false;
#endif
  }
  return false;
}

// Why `isa` cannot run here (CpuIsaSupported(isa) is false).
const char* Unsupported(CpuIsa isa) {
  return Built(isa) ? "this CPU lacks it" : "this build has no such kernels";
}

// The best set this build and CPU support.
CpuIsa BestCpuIsa() {
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    if (CpuIsaSupported(isa)) return isa;
  }
  return CpuIsa::kBaseline;
}

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

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      break;
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "baseline";
}

StatusOr<CpuIsa> ParseCpuIsa(std::string_view text) {
  for (CpuIsa isa : kAll) {
    if (text == CpuIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(absl::StrCat("CPU instruction set '", std::string(text),
                                                 "' is not one of baseline, avx2, avx512"));
}

bool CpuIsaSupported(CpuIsa isa) {
  if (!Built(isa)) return false;
#if defined(__x86_64__)
  switch (isa) {
    case CpuIsa::kBaseline:
      return true;
    case CpuIsa::kAvx2:
      // libgcc's checks include the OS's saving of the YMM (and ZMM) registers (XGETBV).
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma");
  }
#endif
  return isa == CpuIsa::kBaseline;  // elsewhere only the baseline is built
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
