// Device parsing and the ordered backend list. HUDDLE_WITH_CUDA is defined for this file alone
// (kernels/CMakeLists.txt): this is where the CUDA backend is registered, ahead of the CPU.
#include "kernels/backend.h"

#include <absl/strings/str_cat.h>

#include <charconv>
#include <string>

#if HUDDLE_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace huddle::kernels {

std::string DeviceRequest::ToString() const {
  switch (kind) {
    case Kind::kAuto:
      return "auto";
    case Kind::kCpu:
      return "cpu";
    case Kind::kCuda:
      return absl::StrCat("cuda:", index);
  }
  return "auto";
}

StatusOr<DeviceRequest> ParseDeviceRequest(std::string_view text) {
  DeviceRequest request;
  if (text == "auto") return request;
  if (text == "cpu") {
    request.kind = DeviceRequest::Kind::kCpu;
    return request;
  }
  if (text == "cuda") {
    request.kind = DeviceRequest::Kind::kCuda;
    return request;
  }
  constexpr std::string_view kCudaPrefix = "cuda:";
  if (text.starts_with(kCudaPrefix)) {
    const std::string_view digits = text.substr(kCudaPrefix.size());
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (!digits.empty() && ec == std::errc() && end == digits.data() + digits.size() &&
        index >= 0 && index < 1024) {
      request.kind = DeviceRequest::Kind::kCuda;
      request.index = index;
      return request;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device '", std::string(text), "' is not one of: auto, cpu, cuda, cuda:N (N a GPU ordinal)"));
}

bool BuiltWithCuda() {
#if HUDDLE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() {
#if HUDDLE_WITH_CUDA
  std::string why;
  return cuda::DeviceCount(&why);
#else
  return 0;
#endif
}

StatusOr<std::unique_ptr<Backend>> OpenBackend(const DeviceRequest& request) {
  using Kind = DeviceRequest::Kind;
  if (request.kind == Kind::kCpu) return OpenCpuBackend();
#if HUDDLE_WITH_CUDA
  // The ordered list: CUDA first where a GPU is present, the CPU always last.
  std::string why;
  const int gpus = cuda::DeviceCount(&why);
  if (request.kind == Kind::kAuto) {
    if (gpus > 0) return cuda::OpenBackend(0);
    return OpenCpuBackend();
  }
  if (gpus == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", request.ToString(), " was asked for but no CUDA GPU is usable here (", why,
        "); use device: cpu or auto"));
  }
  if (request.index >= gpus) {
    return absl::FailedPreconditionError(absl::StrCat("device ", request.ToString(),
                                                      " was asked for but this machine has ", gpus,
                                                      " CUDA GPU(s): cuda:0 .. cuda:", gpus - 1));
  }
  return cuda::OpenBackend(request.index);
#else
  if (request.kind == Kind::kAuto) return OpenCpuBackend();
  return absl::FailedPreconditionError(absl::StrCat(
      "device ", request.ToString(),
      " was asked for but this build of huddle has no CUDA support (nvcc was not found when it "
      "was built); rebuild on a machine with the CUDA toolkit, or use device: cpu or auto"));
#endif
}

}  // namespace huddle::kernels
