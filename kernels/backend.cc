// Device parsing and the ordered backend list: the CUDA backend, from the CUDA plugin
// (kernels/cuda_plugin.h), ahead of the CPU. HUDDLE_BUILT_CUDA_PLUGIN (kernels/CMakeLists.txt)
// says whether this build made the plugin; nothing here links CUDA.
#include "kernels/backend.h"

#include <absl/strings/str_cat.h>

#include <charconv>
#include <string>

#include "kernels/cuda_plugin.h"

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

bool BuiltWithCuda() { return HUDDLE_BUILT_CUDA_PLUGIN != 0; }

StatusOr<int> CountCudaDevices() {
  HUDDLE_ASSIGN_OR_RETURN(const CudaPlugin* plugin, LoadCudaPlugin());
  std::string why;
  const int gpus = plugin->device_count(&why);
  if (gpus == 0) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA GPU is usable here (", why, ")"));
  }
  return gpus;
}

int CudaDeviceCount() {
  if (!NvidiaDriverPresent()) return 0;
  return CountCudaDevices().value_or(0);
}

StatusOr<std::unique_ptr<Backend>> OpenBackend(const DeviceRequest& request) {
  using Kind = DeviceRequest::Kind;
  if (request.kind == Kind::kCpu) return OpenCpuBackend();
  // The ordered list: CUDA first where a GPU is present, the CPU always last. `auto` looks for a
  // GPU only where a driver is installed, so a CPU host never maps the CUDA libraries.
  if (request.kind == Kind::kAuto) {
    if (CudaDeviceCount() > 0) {
      HUDDLE_ASSIGN_OR_RETURN(const CudaPlugin* plugin, LoadCudaPlugin());
      return plugin->open_backend(0);
    }
    return OpenCpuBackend();
  }
  StatusOr<int> gpus = CountCudaDevices();
  if (!gpus.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", request.ToString(), " was asked for but ", gpus.status().message(),
                     "; use device: cpu or auto"));
  }
  if (request.index >= *gpus) {
    return absl::FailedPreconditionError(absl::StrCat("device ", request.ToString(),
                                                      " was asked for but this machine has ", *gpus,
                                                      " CUDA GPU(s): cuda:0 .. cuda:", *gpus - 1));
  }
  return (*LoadCudaPlugin())->open_backend(request.index);
}

}  // namespace huddle::kernels
