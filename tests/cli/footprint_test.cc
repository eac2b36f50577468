// The `huddle` binary on a host without CUDA (issue 18, item 17): it links no CUDA library, runs
// with the CUDA plugin missing (`--help`, and a small CPU job with `device: auto`), and a client
// that asks for `device: cuda` without the plugin, or without a GPU, fails saying what is missing.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda_plugin.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

constexpr const char* kMissingPlugin = "/nonexistent/huddle/libhuddle_cuda.so";

class FootprintTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir("footprint"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs huddle with `args`, HUDDLE_CUDA_PLUGIN set to `plugin` (through env(1), so the test's
  // own environment stays as it is); returns the exit code, *log gets stdout and stderr.
  int Huddle(const std::vector<std::string>& args, const std::string& plugin, std::string* log) {
    std::vector<std::string> argv = {"/usr/bin/env", "HUDDLE_CUDA_PLUGIN=" + plugin, HuddleBin()};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string path = dir_ + "/huddle" + std::to_string(runs_++) + ".log";
    Process p(argv, path);
    const int code = p.Wait(std::chrono::milliseconds(seconds(60)));
    *log = ReadAll(path);
    return code;
  }

  // 40 rows of label + 784 features (two shards of 20 rows for `huddle run`).
  std::string WriteShard() {
    std::string csv;
    for (int row = 0; row < 40; ++row) {
      csv += std::to_string(row % 10);
      for (int j = 0; j < 784; ++j) csv += (j + row) % 5 == 0 ? ",0.25" : ",0";
      csv += "\n";
    }
    const std::string path = dir_ + "/shard.csv";
    WriteText(path, csv);
    return path;
  }

  // A client that asks for `device`, pointed at a port nobody listens on: it opens its backend
  // before it connects, so the backend's error ends it.
  int Client(const std::string& device, const std::string& plugin, std::string* log) {
    return Huddle(
        {"client", "--coordinator", "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort()),
         "--client-id", "edge", "--data", WriteShard(), "--format", "csv", "--device", device,
         "--insecure", "--give-up-after", "1"},
        plugin, log);
  }

  std::string dir_;
  int runs_ = 0;
};

TEST_F(FootprintTest, BinaryNeedsNoCudaLibrary) {
  if (!std::filesystem::exists("/usr/bin/readelf")) {
    GTEST_SKIP() << "readelf (binutils) is not installed";
  }
  const std::string log = dir_ + "/readelf.log";
  Process p({"/usr/bin/readelf", "-d", HuddleBin()}, log);
  ASSERT_EQ(p.Wait(std::chrono::milliseconds(seconds(30))), 0) << ReadAll(log);
  const std::string dynamic = ReadAll(log);
  ASSERT_NE(dynamic.find("(NEEDED)"), std::string::npos) << dynamic;
  for (const char* library : {"libcudart", "libcublas", "libnccl", "libcuda.so"}) {
    EXPECT_EQ(dynamic.find(library), std::string::npos)
        << HuddleBin() << " names " << library << " as NEEDED:\n"
        << dynamic;
  }
}

// Linked eagerly, cuBLAS, cuBLASLt and NCCL put `huddle --help` at 223 MiB; without them it
// takes 11-16 MiB (docs/deployment.md), and 100 MiB is the bound. Under AddressSanitizer it grows
// with the binary (ASan adds a redzone and metadata to every global, and the instrumented binary
// carries 64 MB of data against 30 KB without it, at issue 36): with its shadow memory and
// allocator, `--help` peaks at 165-169 MiB (RelWithDebInfo at -O1; 101-104 MiB when the bound was
// set). The bound there is 220 MiB: what the CUDA libraries would
// add to it (some 210 MiB) still fails it.
#if defined(__SANITIZE_ADDRESS__)
constexpr long kHelpPeakBoundKiB = 220 * 1024;
#else
constexpr long kHelpPeakBoundKiB = 100 * 1024;
#endif

TEST_F(FootprintTest, HelpDoesNotMapTheCudaLibraries) {
  std::string log;
  ASSERT_EQ(Huddle({"--help"}, kMissingPlugin, &log), 0) << log;
  rusage children{};
  ASSERT_EQ(::getrusage(RUSAGE_CHILDREN, &children), 0);
  // ru_maxrss (KiB) of the largest child reaped so far: this test's only one unless the whole
  // binary runs in one process, where the CPU job below peaks far under the bound too.
  EXPECT_LT(children.ru_maxrss, kHelpPeakBoundKiB)
      << "huddle --help peaked at " << children.ru_maxrss / 1024 << " MiB";
}

TEST_F(FootprintTest, RunsWithoutThePlugin) {
  std::string log;
  ASSERT_EQ(Huddle({"--help"}, kMissingPlugin, &log), 0) << log;
  EXPECT_NE(log.find("coordinator"), std::string::npos) << log;

  // A whole federation on the CPU (`device: auto`): a coordinator and two client processes.
  const std::string shard = WriteShard();
  WriteText(dir_ + "/job.yaml",
            "name: edge\nseed: 1\nrounds: 2\nclients: 2\nmodel: {hidden: [8]}\n"
            "train: {epochs: 1, batch_size: 4, learning_rate: 0.1}\ncohort: {size: 2}\n"
            "round: {deadline_s: 30, quorum: 2}\nevaluation: {every: 0}\n"
            "coordinator: {min_clients: 2, wait_for_clients_s: 30}\nclient: {device: auto}\n"
            "data: {path: " +
                shard + ", format: csv, partition: iid}\n");
  ASSERT_EQ(Huddle({"run", dir_ + "/job.yaml", "--out", dir_ + "/run", "--insecure"},
                   kMissingPlugin, &log),
            0)
      << log;
  const std::string client_log = ReadAll(dir_ + "/run/logs/client-000.log");
  EXPECT_NE(client_log.find("training on cpu"), std::string::npos) << client_log;
}

TEST_F(FootprintTest, CudaWithoutThePluginNamesIt) {
  std::string log;
  EXPECT_NE(Client("cuda", kMissingPlugin, &log), 0) << log;
  EXPECT_NE(log.find("device cuda:0 was asked for but"), std::string::npos) << log;
  EXPECT_NE(log.find(kMissingPlugin), std::string::npos) << log;
  EXPECT_NE(log.find("libhuddle_cuda.so is not installed"), std::string::npos) << log;
}

TEST_F(FootprintTest, CudaWithThePluginButNoGpuNamesTheGpu) {
  if (!kernels::BuiltWithCuda()) GTEST_SKIP() << "this build made no CUDA plugin";
  if (kernels::NvidiaDriverPresent()) GTEST_SKIP() << "this host has an NVIDIA driver";
  // The plugin this build made, next to the binary; loading it needs the CUDA libraries.
  const std::string plugin =
      (std::filesystem::path(HuddleBin()).parent_path() / kernels::kCudaPluginFile).string();
  std::string log;
  EXPECT_NE(Client("cuda:1", plugin, &log), 0) << log;
  EXPECT_NE(log.find("device cuda:1 was asked for but"), std::string::npos) << log;
  const bool no_gpu = log.find("no CUDA GPU is usable here") != std::string::npos;
  const bool no_library = log.find("cannot load the CUDA plugin") != std::string::npos;
  EXPECT_TRUE(no_gpu || no_library) << log;
}

}  // namespace
}  // namespace huddle::testing
