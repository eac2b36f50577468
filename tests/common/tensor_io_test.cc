// The model file format (documented in README.md): round trip, and corruption gives errors.
#include "common/tensor_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

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

// What is not a regular file is refused before anything is read from it: /dev/zero would be read
// until memory runs out, a FIFO with no writer would block open(2) forever.
TEST(TensorIoTest, ModelFileThatIsNotARegularFileIsRefusedWithoutReadingIt) {
  StatusOr<TensorList> zero = ReadModelFile("/dev/zero");
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(zero.status())) << zero.status();
  EXPECT_NE(zero.status().message().find("'/dev/zero' is a character device, not a regular file"),
            absl::string_view::npos)
      << zero.status();

  const std::string fifo = TempPath("fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  StatusOr<TensorList> from_fifo = ReadModelFile(fifo);  // no writer: must not block
  ::unlink(fifo.c_str());
  ASSERT_FALSE(from_fifo.ok());
  EXPECT_NE(from_fifo.status().message().find("is a FIFO, not a regular file"),
            absl::string_view::npos)
      << from_fifo.status();

  const std::string dir = TempPath("dir");
  std::filesystem::create_directories(dir);
  StatusOr<TensorList> from_dir = ReadModelFile(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(from_dir.ok());
  EXPECT_NE(from_dir.status().message().find("is a directory, not a regular file"),
            absl::string_view::npos)
      << from_dir.status();
}

// The tensor headers are checked against the file's size before any tensor data is read: a
// header that claims more than the file holds, or a file with more than its headers describe, is
// refused naming both sizes.
TEST(TensorIoTest, ModelFileSizesAreCheckedAgainstItsHeadersBeforeReading) {
  const std::string path = TempPath("lying.bin");
  // One tensor 'w' claiming 65536 x 65536 floats (16 GiB), followed by 8 bytes of data.
  std::string lying(kModelFileMagic, 8);
  AppendU32(1, &lying);
  AppendU32(1, &lying);
  lying += "w";
  AppendU32(2, &lying);
  AppendU64(65536, &lying);
  AppendU64(65536, &lying);
  lying += std::string(8, '\0');
  ASSERT_TRUE(WriteFileAtomic(path, lying).ok());
  StatusOr<TensorList> read = ReadModelFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
  EXPECT_NE(read.status().message().find(
                "tensor 0 ('w') needs 17179869184 bytes of data at byte 37, the file holds 8"),
            absl::string_view::npos)
      << read.status();

  // A truncated file: the last tensor's data is cut short.
  ASSERT_TRUE(WriteModelFile(path, Sample()).ok());
  const std::string good = *ReadFile(path);
  ASSERT_TRUE(WriteFileAtomic(path, good.substr(0, good.size() - 3)).ok());
  read = ReadModelFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("tensor 1 ('fc0.bias') needs 12 bytes of data"),
            absl::string_view::npos)
      << read.status();

  // Far more than the headers describe: refused from the headers, before the data is read.
  ASSERT_TRUE(WriteFileAtomic(path, good + std::string(1 << 20, 'x')).ok());
  read = ReadModelFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(
      read.status().message().find(absl::StrCat("its tensors end at byte ", good.size(),
                                                ", followed by ", (1 << 20), " trailing bytes")),
      absl::string_view::npos)
      << read.status();
}

// A file past the model-file size limit is refused from its size alone (a sparse file here: it
// takes no disk space), never read into memory.
TEST(TensorIoTest, ModelFileLargerThanTheLimitIsRefusedFromItsSize) {
  const std::string path = TempPath("huge.bin");
  ASSERT_TRUE(WriteModelFile(path, Sample()).ok());
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(kMaxModelFileBytes + 1)), 0);
  StatusOr<TensorList> read = ReadModelFile(path);
  ::unlink(path.c_str());
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find(absl::StrCat("is ", kMaxModelFileBytes + 1,
                                                      " bytes, more than the model-file limit of ",
                                                      kMaxModelFileBytes)),
            absl::string_view::npos)
      << read.status();
}

}  // namespace
}  // namespace huddle
