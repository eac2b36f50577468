// Finding and loading the CUDA plugin (kernels/cuda_plugin.h). HUDDLE_CUDA_PLUGIN_BUILD_ID,
// HUDDLE_BUILT_CUDA_PLUGIN (0 where this build made no plugin) and HUDDLE_CUDA_PLUGIN_INSTALL_DIR
// come from kernels/CMakeLists.txt.
#include "kernels/cuda_plugin.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <vector>

namespace huddle::kernels {
namespace {

namespace fs = std::filesystem;

bool Exists(const fs::path& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// The places of kernels/cuda_plugin.h for this process. The environment is read here, once per
// process: the plugin is process-wide by nature (like LD_LIBRARY_PATH for the dynamic loader), and
// the callers that open backends (trainers, silos, tests) have no config of their own to carry it.
std::vector<std::string> Candidates() {
  const char* override_path = std::getenv("HUDDLE_CUDA_PLUGIN");
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return CudaPluginCandidates(override_path != nullptr ? override_path : "",
                              ec ? std::string() : exe.string());
}

struct Loaded {
  void* handle = nullptr;
  const CudaPlugin* plugin = nullptr;
  std::string path;
};

StatusOr<Loaded> Load() {
  const std::vector<std::string> candidates = Candidates();
  const std::string* found = nullptr;
  for (const std::string& path : candidates) {
    if (Exists(path)) {
      found = &path;
      break;
    }
  }
  if (found == nullptr) {
    std::string looked;
    for (const std::string& path : candidates)
      absl::StrAppend(&looked, looked.empty() ? "" : ", ", path);
    if (looked.empty()) looked = "nowhere (the running binary's path is unknown)";
    if (HUDDLE_BUILT_CUDA_PLUGIN == 0 && std::getenv("HUDDLE_CUDA_PLUGIN") == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this build of huddle has no CUDA plugin (", kCudaPluginFile,
          ": nvcc was not found when it was built, or -DHUDDLE_ENABLE_CUDA=OFF); looked in ",
          looked));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA plugin ", kCudaPluginFile, " is not installed: no file at ", looked,
                     " (put it next to the huddle binary or set HUDDLE_CUDA_PLUGIN to its path)"));
  }
  const std::string path = *found;
  // RTLD_LOCAL: the plugin's own copies of huddle code stay private to it.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load the CUDA plugin ", path, ": ", why != nullptr ? why : "unknown error",
        " (it needs the CUDA 13 libraries libcublas, libcublasLt and libnccl on the loader's "
        "path)"));
  }
  using Entry = const CudaPlugin* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, kCudaPluginEntry));
  const CudaPlugin* plugin = entry != nullptr ? entry() : nullptr;
  if (plugin == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a huddle CUDA plugin (no ", kCudaPluginEntry, ")"));
  }
  if (plugin->abi_version != kCudaPluginAbiVersion ||
      std::strcmp(plugin->build_id, HUDDLE_CUDA_PLUGIN_BUILD_ID) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA plugin ", path, " was built from other sources or by another compiler (ABI ",
        plugin->abi_version, ", build ", plugin->build_id, ") than this huddle (ABI ",
        kCudaPluginAbiVersion, ", build ", HUDDLE_CUDA_PLUGIN_BUILD_ID,
        "): use the plugin of the same build"));
  }
  // Never dlclose'd: backends and collectives it made may live until exit.
  return Loaded{handle, plugin, path};
}

const StatusOr<Loaded>& LoadOnce() {
  static const StatusOr<Loaded> loaded = Load();
  return loaded;
}

}  // namespace

std::vector<std::string> CudaPluginCandidates(std::string_view override_path,
                                              std::string_view exe) {
  if (!override_path.empty()) return {std::string(override_path)};
  if (exe.empty()) return {};
  const fs::path dir = fs::path(exe).parent_path();
  return {(dir / kCudaPluginFile).string(),
          (dir / CudaPluginInstallDir() / kCudaPluginFile).lexically_normal().string()};
}

const char* CudaPluginInstallDir() { return HUDDLE_CUDA_PLUGIN_INSTALL_DIR; }

StatusOr<const CudaPlugin*> LoadCudaPlugin() {
  const StatusOr<Loaded>& loaded = LoadOnce();
  if (!loaded.ok()) return loaded.status();
  return loaded->plugin;
}

StatusOr<void*> CudaPluginSymbol(const char* name) {
  const StatusOr<Loaded>& loaded = LoadOnce();
  if (!loaded.ok()) return loaded.status();
  void* symbol = dlsym(loaded->handle, name);
  if (symbol == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA plugin ", loaded->path, " has no ", name));
  }
  return symbol;
}

bool NvidiaDriverPresent() {
  return Exists("/dev/nvidiactl") || Exists("/proc/driver/nvidia/version") || Exists("/dev/dxg");
}

}  // namespace huddle::kernels
