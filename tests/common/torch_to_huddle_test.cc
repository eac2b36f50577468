// scripts/torch_to_huddle.py: a PyTorch state_dict converted to a HUDDLEM1 file is read by the C++
// reader (common/tensor_io.h) with the state_dict's names, order, shapes and float32 values, and
// skips non-float buffers; --reverse gives the state_dict back. Skipped, with the reason, where no
// Python with torch is found (python3, then /usr/bin/python3, or $HUDDLE_PYTHON).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/tensor_io.h"

namespace huddle {
namespace {

// A Python interpreter that imports torch, or "".
std::string PythonWithTorch() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("HUDDLE_PYTHON")) candidates.push_back(env);
  candidates.insert(candidates.end(), {"python3", "/usr/bin/python3"});
  for (const std::string& python : candidates) {
    const std::string probe = python + " -c 'import torch' > /dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return python;
  }
  return "";
}

class TorchToHuddleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = PythonWithTorch();
    if (python_.empty()) {
      GTEST_SKIP() << "no Python with torch (tried $HUDDLE_PYTHON, python3, /usr/bin/python3; "
                      "Debian: apt install python3-torch)";
    }
    dir_ = std::filesystem::temp_directory_path() / ("huddle_torch_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // Runs `code` with the interpreter; its exit status.
  int RunPython(const std::string& code) const {
    const std::string file = Path("snippet.py");
    std::ofstream(file) << code;
    return std::system((python_ + " " + file).c_str());
  }
  int Convert(const std::string& args) const {
    const std::string script = std::string(HUDDLE_SOURCE_DIR) + "/scripts/torch_to_huddle.py";
    return std::system((python_ + " " + script + " " + args + " 2> " + Path("stderr.txt")).c_str());
  }

  std::string python_;
  std::filesystem::path dir_;
};

TEST_F(TorchToHuddleTest, AStateDictBecomesAModelFileTheReaderLoads) {
  // A CNN with batch norm: its num_batches_tracked (int64) is skipped; a double bias is converted.
  // Every value is known: parameter k element i = k + i / 1024 (exact in float32).
  ASSERT_EQ(RunPython(R"(
import torch
m = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                        torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))
state = m.state_dict()
for k, (name, t) in enumerate(state.items()):
    if t.is_floating_point():
        t.copy_(k + torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape) / 1024)
state['4.bias'] = state['4.bias'].double()
torch.save(state, ')" +
                      Path("model.pt") + R"(')
)"),
            0);
  ASSERT_EQ(Convert(Path("model.pt") + " " + Path("model.bin")), 0)
      << ReadFile(Path("stderr.txt")).value_or("");
  EXPECT_NE(ReadFile(Path("stderr.txt"))->find("skipping '1.num_batches_tracked'"),
            std::string::npos);

  StatusOr<TensorList> model = ReadModelFile(Path("model.bin"));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<std::string> names = {"0.weight",       "0.bias",        "1.weight", "1.bias",
                                          "1.running_mean", "1.running_var", "4.weight", "4.bias"};
  const std::vector<std::vector<int64_t>> shapes = {{4, 1, 3, 3}, {4}, {4},       {4},
                                                    {4},          {4}, {10, 144}, {10}};
  // The state_dict's index of each (num_batches_tracked, index 6, is not in the file).
  const std::vector<int> index = {0, 1, 2, 3, 4, 5, 7, 8};
  ASSERT_EQ(model->size(), names.size());
  for (size_t t = 0; t < names.size(); ++t) {
    SCOPED_TRACE(names[t]);
    EXPECT_EQ((*model)[t].name(), names[t]);
    EXPECT_EQ((*model)[t].spec.shape, shapes[t]);
    for (size_t i = 0; i < (*model)[t].data.size(); ++i) {
      ASSERT_EQ((*model)[t].data[i], static_cast<float>(index[t]) + static_cast<float>(i) / 1024)
          << i;
    }
  }

  // And back: the same names and values, as float32.
  ASSERT_EQ(Convert("--reverse " + Path("model.bin") + " " + Path("back.pt")), 0);
  ASSERT_EQ(RunPython(R"(
import sys, torch
a = torch.load(')" + Path("model.pt") +
                      R"(')
b = torch.load(')" + Path("back.pt") +
                      R"(')
assert list(b) == [k for k in a if k != '1.num_batches_tracked'], list(b)
assert all(b[k].dtype == torch.float32 and torch.equal(a[k].float(), b[k]) for k in b)
)"),
            0);
}

TEST_F(TorchToHuddleTest, ItRefusesWhatAHuddleJobWouldRefuse) {
  ASSERT_EQ(RunPython(R"(
import torch
torch.save({'bad name': torch.zeros(2)}, ')" +
                      Path("name.pt") + R"(')
torch.save({'w': torch.tensor([1.0, float('nan')])}, ')" +
                      Path("nan.pt") + R"(')
torch.save({'steps': torch.tensor(3)}, ')" +
                      Path("ints.pt") + R"(')
)"),
            0);
  EXPECT_NE(Convert(Path("name.pt") + " " + Path("x.bin")), 0);
  EXPECT_NE(ReadFile(Path("stderr.txt"))->find("tensor 0 ('bad name'): names must be"),
            std::string::npos);
  EXPECT_NE(Convert(Path("nan.pt") + " " + Path("x.bin")), 0);
  EXPECT_NE(ReadFile(Path("stderr.txt"))->find("tensor 0 ('w'): element 1 is nan"),
            std::string::npos);
  EXPECT_NE(Convert(Path("ints.pt") + " " + Path("x.bin")), 0);
  EXPECT_NE(ReadFile(Path("stderr.txt"))->find("no floating-point tensors"), std::string::npos);
  EXPECT_NE(Convert(Path("missing.pt") + " " + Path("x.bin")), 0);
  EXPECT_FALSE(std::filesystem::exists(Path("x.bin")));
}

// A hostile .pt: its pickle calls os.system to leave a marker. Converting it must refuse the file
// without running the payload, with or without --key; the payload is live (it runs under the
// loudly named opt-in), so the test can fail.
TEST_F(TorchToHuddleTest, AFileThatHoldsCodeIsRefusedAndItsCodeNeverRuns) {
  const std::string marker = Path("payload_ran");
  ASSERT_EQ(RunPython(R"(
import os, torch
class Payload:
    def __reduce__(self):
        return (os.system, ('touch )" +
                      marker + R"(',))
torch.save({'w': torch.zeros(2), 'evil': Payload()}, ')" +
                      Path("hostile.pt") + R"(')
torch.save({'state_dict': {'w': torch.zeros(2)}, 'evil': Payload()}, ')" +
                      Path("hostile_ckpt.pt") + R"(')
)"),
            0);
  ASSERT_FALSE(std::filesystem::exists(marker));
  EXPECT_NE(Convert(Path("hostile.pt") + " " + Path("x.bin")), 0);
  EXPECT_NE(ReadFile(Path("stderr.txt"))->find("--unsafe-run-code-in-input"), std::string::npos);
  EXPECT_NE(Convert("--key state_dict " + Path("hostile_ckpt.pt") + " " + Path("x.bin")), 0);
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the file's code ran";
  EXPECT_FALSE(std::filesystem::exists(Path("x.bin")));
  // The opt-in runs it (which is why it is named so): the payload above is a real one.
  EXPECT_EQ(Convert("--unsafe-run-code-in-input " + Path("hostile.pt") + " " + Path("x.bin")), 0);
  EXPECT_TRUE(std::filesystem::exists(marker));
}

}  // namespace
}  // namespace huddle
