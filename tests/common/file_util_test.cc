#include "common/file_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "gtest/gtest.h"

namespace huddle {
namespace {

// A fresh directory per test under the test temp dir.
class FileUtilTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(testing::TempDir()) /
           absl::StrCat("file_util_test_", ::getpid(), "_",
                        testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    ASSERT_TRUE(MakeDirs(dir_.string()).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

TEST_F(FileUtilTest, WriteThenReadRoundTripsBinaryData) {
  std::string contents(200000, '\0');  // larger than ReadFile's 64 KiB buffer
  for (size_t i = 0; i < contents.size(); ++i) contents[i] = static_cast<char>(i * 7 + i / 300);
  ASSERT_TRUE(WriteFileAtomic(Path("ckpt.bin"), contents).ok());
  auto read = ReadFile(Path("ckpt.bin"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, contents);

  ASSERT_TRUE(WriteFileAtomic(Path("empty"), "").ok());
  EXPECT_EQ(ReadFile(Path("empty")).value(), "");
}

TEST_F(FileUtilTest, OverwriteReplacesTheWholeFileAndLeavesNoTemporary) {
  ASSERT_TRUE(WriteFileAtomic(Path("model"), std::string(5000, 'a')).ok());
  ASSERT_TRUE(WriteFileAtomic(Path("model"), "short").ok());
  EXPECT_EQ(ReadFile(Path("model")).value(), "short");
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename(), "model");
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(FileUtilTest, MissingFileIsNotFound) {
  auto read = ReadFile(Path("absent"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find(Path("absent")), std::string::npos) << read.status();
}

TEST_F(FileUtilTest, WriteIntoMissingDirectoryFailsCleanly) {
  const Status st = WriteFileAtomic(Path("no/such/dir/file"), "x");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no/such/dir"), std::string::npos) << st;
}

TEST_F(FileUtilTest, AppendLineCreatesAndAppends) {
  ASSERT_TRUE(AppendLine(Path("ledger"), "round 1 eps 0.1").ok());
  ASSERT_TRUE(AppendLine(Path("ledger"), "round 2 eps 0.2").ok());
  ASSERT_TRUE(AppendLine(Path("ledger"), "").ok());
  EXPECT_EQ(ReadFile(Path("ledger")).value(), "round 1 eps 0.1\nround 2 eps 0.2\n\n");
}

TEST_F(FileUtilTest, MakeDirsCreatesParentsAndIsIdempotent) {
  ASSERT_TRUE(MakeDirs(Path("a/b/c")).ok());
  EXPECT_TRUE(std::filesystem::is_directory(Path("a/b/c")));
  EXPECT_TRUE(MakeDirs(Path("a/b/c")).ok());
  ASSERT_TRUE(WriteFileAtomic(Path("a/b/c/f"), "x").ok());
  EXPECT_FALSE(MakeDirs(Path("a/b/c/f/g")).ok()) << "a file is in the way";
}

// ReadFile reads regular files only, and refuses the others without blocking on them (a FIFO
// with no writer) or reading them without end (/dev/zero).
TEST_F(FileUtilTest, ReadFileRefusesWhatIsNotARegularFile) {
  auto zero = ReadFile("/dev/zero");
  EXPECT_TRUE(absl::IsFailedPrecondition(zero.status())) << zero.status();
  EXPECT_NE(zero.status().message().find("'/dev/zero' is a character device"), std::string::npos)
      << zero.status();
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  auto fifo = ReadFile(Path("fifo"));
  EXPECT_TRUE(absl::IsFailedPrecondition(fifo.status())) << fifo.status();
  EXPECT_NE(fifo.status().message().find("is a FIFO"), std::string::npos) << fifo.status();
  auto dir = ReadFile(dir_.string());
  EXPECT_NE(dir.status().message().find("is a directory"), std::string::npos) << dir.status();
}

TEST_F(FileUtilTest, ReadFileRefusesAFileLargerThanItsLimit) {
  ASSERT_TRUE(WriteFileAtomic(Path("big"), std::string(1000, 'b')).ok());
  EXPECT_EQ(ReadFile(Path("big"), 1000).value(), std::string(1000, 'b'));
  auto read = ReadFile(Path("big"), 999);
  EXPECT_TRUE(absl::IsFailedPrecondition(read.status())) << read.status();
  EXPECT_NE(read.status().message().find("is 1000 bytes, more than the limit of 999"),
            std::string::npos)
      << read.status();
}

}  // namespace
}  // namespace huddle
