// The model file format (documented in README.md): round trip, and corruption gives errors.
#include "common/tensor_io.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/file_util.h"

namespace huddle {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("huddle_tensor_io_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TensorList Sample() {
  Tensor w("fc0.weight", {3, 2});
  for (size_t i = 0; i < w.data.size(); ++i) w.data[i] = 0.25f * static_cast<float>(i) - 1.0f;
  Tensor b("fc0.bias", {3});
  b.data = {1.5f, -2.0f, 3.25f};
  return {w, b};
}

TEST(TensorIoTest, ModelFileRoundTripsExactly) {
  const std::string path = TempPath("ok.bin");
  ASSERT_TRUE(WriteModelFile(path, Sample()).ok());
  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->substr(0, 8), "HUDDLEM1");
  auto back = ReadModelFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  const TensorList want = Sample();
  ASSERT_EQ(back->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*back)[i].spec, want[i].spec);
    EXPECT_EQ((*back)[i].data, want[i].data);
  }
}

TEST(TensorIoTest, CorruptFilesAreErrorsNamingTheProblem) {
  const std::string path = TempPath("bad.bin");
  ASSERT_TRUE(WriteModelFile(path, Sample()).ok());
  const std::string good = *ReadFile(path);

  ASSERT_TRUE(WriteFileAtomic(path, "NOTMODEL" + good.substr(8)).ok());
  EXPECT_NE(ReadModelFile(path).status().message().find("bad magic"), absl::string_view::npos);

  ASSERT_TRUE(WriteFileAtomic(path, good.substr(0, good.size() - 3)).ok());
  EXPECT_NE(ReadModelFile(path).status().message().find("truncated"), absl::string_view::npos);

  ASSERT_TRUE(WriteFileAtomic(path, good + "xx").ok());
  EXPECT_NE(ReadModelFile(path).status().message().find("2 trailing bytes"),
            absl::string_view::npos);

  std::string huge_rank = good;
  // Rank of the first tensor: after magic (8), count (4), name length (4) and the name (10).
  huge_rank[8 + 4 + 4 + 10] = 99;
  ASSERT_TRUE(WriteFileAtomic(path, huge_rank).ok());
  EXPECT_NE(ReadModelFile(path).status().message().find("rank 99"), absl::string_view::npos);

  EXPECT_TRUE(absl::IsNotFound(ReadModelFile(TempPath("missing.bin")).status()));
}

}  // namespace
}  // namespace huddle
