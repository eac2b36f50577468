// The CUDA plugin: the CUDA backend (kernels/cuda/) and the NCCL collective
// (datacenter/nccl_collective.cc) live in one shared object, libhuddle_cuda.so, built wherever
// nvcc is found and placed next to the `huddle` binary. Nothing else links a CUDA library: the
// plugin, and with it cudart, cuBLAS, cuBLASLt and NCCL, is mapped only when a CUDA device is asked
// for, so the same binary runs on a host without the CUDA toolkit and a coordinator or a CPU client
// never pays for the GPU libraries (docs/deployment.md, "Memory").
//
// Where it is looked for (CudaPluginCandidates; a file that exists but does not load is an error):
//   1. $HUDDLE_CUDA_PLUGIN, when set and not empty: that file alone;
//   2. otherwise libhuddle_cuda.so in the directory of the running executable (/proc/self/exe),
//      where the build puts it (build/cli/), then in EXE_DIR/../LIBDIR/huddle/, where
//      `cmake --install` and the huddle-cuda package put it (/usr/lib/x86_64-linux-gnu/huddle/
//      for /usr/bin/huddle; CudaPluginInstallDir(), relative to the binary's directory).
// Never at an absolute path compiled into the binary: a `huddle` copied to another machine or
// directory must not map a plugin left in the build tree it came from. The tests and benches, which
// run from their own directories, are given the build's plugin through $HUDDLE_CUDA_PLUGIN (CTest
// sets it, tests/CMakeLists.txt).
//
// The plugin exports one C symbol per module that puts code in it, each returning that module's
// table: huddle_cuda_plugin_v2 (a CudaPlugin, below: the backend, this module's part) and the
// datacenter's NCCL entry (datacenter/nccl_plugin.h), which the datacenter looks up by name
// (CudaPluginSymbol), so that this floor names nothing above it. C++ objects (Backend, Collective,
// Status) cross the boundary, so the plugin must come from the same source and compiler as the
// binary that loads it: `build_id` (a hash of the interface headers and the compiler, the
// top-level CMakeLists.txt) must match, or the plugin is refused with both ids named. Bump
// kCudaPluginAbiVersion when the struct below changes.
//
// Thread-safety: LoadCudaPlugin may be called from any thread; the plugin is loaded at most once
// per process and never unloaded (objects it made may live until exit).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace huddle::kernels {

class Backend;

inline constexpr uint32_t kCudaPluginAbiVersion = 2;
inline constexpr const char* kCudaPluginFile = "libhuddle_cuda.so";
inline constexpr const char* kCudaPluginEntry = "huddle_cuda_plugin_v2";

struct CudaPlugin {
  uint32_t abi_version;  // kCudaPluginAbiVersion
  const char* build_id;  // HUDDLE_CUDA_PLUGIN_BUILD_ID of the plugin's build
  // GPUs the CUDA runtime sees; 0 with *why set (the runtime's message) when it sees none.
  int (*device_count)(std::string* why);
  // kernels/cuda/cuda_backend.h: GPU `ordinal` with its own stream and cuBLAS handle.
  StatusOr<std::unique_ptr<Backend>> (*open_backend)(int ordinal);
};

// The places to look for the plugin, in order, given $HUDDLE_CUDA_PLUGIN (`override_path`, ""
// when unset) and the running executable's path (`exe`, "" when unknown). Pure: it touches no
// file.
std::vector<std::string> CudaPluginCandidates(std::string_view override_path, std::string_view exe);
// The installed plugin's directory relative to the installed binary's ("../lib/x86_64-linux-gnu/
// huddle" for the usual GNU install directories; kernels/CMakeLists.txt computes it).
const char* CudaPluginInstallDir();

// The plugin, loaded on the first call (the later ones return the same plugin or the same error).
// FailedPrecondition says what is missing: this build made no plugin, no file at the places
// above (named), the dynamic loader's message for a file that does not load (a missing
// libcublas.so / libnccl.so names itself there), or an id that does not match this binary's.
StatusOr<const CudaPlugin*> LoadCudaPlugin();

// Another module's entry in the loaded plugin (its exported C symbol `name`), for that module to
// call and cast to its own table's type; LoadCudaPlugin's error when the plugin does not load,
// FailedPrecondition naming the symbol when the plugin lacks it.
StatusOr<void*> CudaPluginSymbol(const char* name);

// Whether this host shows signs of an NVIDIA driver (/dev/nvidiactl, /proc/driver/nvidia or WSL's
// /dev/dxg): a check that maps nothing, so that `device: auto` on a host without a GPU never loads
// the plugin.
bool NvidiaDriverPresent();

}  // namespace huddle::kernels
