// Where the CUDA plugin is looked for (kernels/cuda_plugin.h): $HUDDLE_CUDA_PLUGIN alone when set,
// else beside the running binary; never a path compiled into the binary.
#include "kernels/cuda_plugin.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace huddle::kernels {
namespace {

using Paths = std::vector<std::string>;

TEST(CudaPluginCandidates, TheEnvironmentVariableAloneWhenSet) {
  EXPECT_EQ(CudaPluginCandidates("/opt/gpu/libhuddle_cuda.so", "/usr/local/bin/huddle"),
            Paths{"/opt/gpu/libhuddle_cuda.so"});
}

TEST(CudaPluginCandidates, BesideTheRunningBinaryThenInItsInstalledPlace) {
  // LIBDIR/huddle relative to BINDIR: "../lib/x86_64-linux-gnu/huddle" on Debian.
  const std::string installed = CudaPluginInstallDir();
  ASSERT_EQ(installed.rfind("../lib", 0), 0u) << installed;
  ASSERT_EQ(installed.substr(installed.size() - 7), "/huddle") << installed;
  const std::string lib = installed.substr(3);  // "lib/.../huddle"
  EXPECT_EQ(CudaPluginCandidates("", "/usr/bin/huddle"),
            (Paths{"/usr/bin/libhuddle_cuda.so", "/usr/" + lib + "/libhuddle_cuda.so"}));
  // A binary copied elsewhere looks beside its copy and relative to it, and only there.
  EXPECT_EQ(CudaPluginCandidates("", "/home/me/tools/bin/huddle"),
            (Paths{"/home/me/tools/bin/libhuddle_cuda.so",
                   "/home/me/tools/" + lib + "/libhuddle_cuda.so"}));
}

TEST(CudaPluginCandidates, NothingWhenTheBinaryIsUnknownAndNoVariableIsSet) {
  EXPECT_EQ(CudaPluginCandidates("", ""), Paths{});
}

TEST(CudaPluginCandidates, ARelativePluginPathIsKeptAsGiven) {
  EXPECT_EQ(CudaPluginCandidates("build/cli/libhuddle_cuda.so", "/usr/bin/huddle"),
            Paths{"build/cli/libhuddle_cuda.so"});
}

// On a host without a GPU (or without the plugin where the loader looks) the loader answers with
// an error, never a crash: the CPU is used instead (kernels/backend.h).
TEST(CudaPluginCandidates, LoadingWithoutAGpuIsAnErrorOrAPlugin) {
  if (NvidiaDriverPresent()) GTEST_SKIP() << "this host has an NVIDIA driver";
  StatusOr<const CudaPlugin*> plugin = LoadCudaPlugin();
  if (plugin.ok()) {
    std::string why;
    EXPECT_EQ((*plugin)->device_count(&why), 0) << why;
  } else {
    EXPECT_TRUE(absl::IsFailedPrecondition(plugin.status())) << plugin.status();
  }
}

// Another module's entry is found by name in the loaded plugin; a name it lacks is an error
// naming it, never a null pointer to call.
TEST(CudaPluginCandidates, EntriesAreLookedUpByName) {
  StatusOr<const CudaPlugin*> plugin = LoadCudaPlugin();
  if (!plugin.ok()) GTEST_SKIP() << "no plugin loads here: " << plugin.status();
  StatusOr<void*> entry = CudaPluginSymbol(kCudaPluginEntry);
  ASSERT_TRUE(entry.ok()) << entry.status();
  EXPECT_NE(*entry, nullptr);
  StatusOr<void*> missing = CudaPluginSymbol("huddle_no_such_entry_v1");
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("huddle_no_such_entry_v1"), std::string::npos);
}

}  // namespace
}  // namespace huddle::kernels
