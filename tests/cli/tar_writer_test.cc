// The ustar writer (cli/tar_writer.h) read by the system's GNU tar: the listing (names, modes,
// owners), the extracted bytes and modes, long names split into ustar's prefix, determinism, and
// the paths it refuses.
#include "cli/tar_writer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace huddle::cli {
namespace {

namespace fs = std::filesystem;

class TarWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / "huddle-tar-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir_.data()), nullptr);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `command`'s stdout, and its exit status in *status.
std::string Shell(const std::string& command, int* status) {
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  *status = ::pclose(pipe);
  return out;
}

unsigned ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

const std::string kLongDir = std::string(60, 'd') + "/" + std::string(70, 'e');
const std::string kLongName = kLongDir + "/" + std::string(90, 'f') + ".txt";  // 222 bytes

std::string SampleArchive() {
  TarWriter tar;
  EXPECT_TRUE(tar.AddDirectory("keys", 0755, 1700000000).ok());
  EXPECT_TRUE(tar.AddDirectory("keys/private", 0700, 1700000000).ok());
  EXPECT_TRUE(tar.AddFile("keys/private/site.key", "secret\n", 0600, 1700000001).ok());
  EXPECT_TRUE(tar.AddFile("keys/site.pub", "public\n", 0644, 1700000002).ok());
  EXPECT_TRUE(tar.AddFile("empty", "", 0644, 1700000003).ok());
  EXPECT_TRUE(tar.AddFile("block", std::string(512, 'x'), 0644, 1700000004).ok());
  EXPECT_TRUE(tar.AddDirectory(std::string(60, 'd'), 0755, 0).ok());
  EXPECT_TRUE(tar.AddDirectory(kLongDir, 0755, 0).ok());
  EXPECT_TRUE(tar.AddFile(kLongName, "long\n", 0640, 0).ok());
  auto gz = Gzip(tar.Finish());
  EXPECT_TRUE(gz.ok());
  return *gz;
}

TEST_F(TarWriterTest, GnuTarListsTheEntriesInOrderWithModesAndRootOwner) {
  const std::string& dir = dir_;
  WriteBytes(dir + "/a.tar.gz", SampleArchive());
  int status = 0;
  const std::string listing = Shell("tar -tvzf " + dir + "/a.tar.gz --numeric-owner", &status);
  ASSERT_EQ(status, 0) << listing;
  std::vector<std::string> lines;
  std::istringstream in(listing);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 9u) << listing;
  EXPECT_EQ(lines[0].substr(0, 10), "drwxr-xr-x");
  EXPECT_NE(lines[0].find(" 0/0 "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(" keys/"), std::string::npos);
  EXPECT_EQ(lines[1].substr(0, 10), "drwx------");
  EXPECT_EQ(lines[2].substr(0, 10), "-rw-------");
  EXPECT_NE(lines[2].find("keys/private/site.key"), std::string::npos);
  EXPECT_EQ(lines[3].substr(0, 10), "-rw-r--r--");
  EXPECT_EQ(lines[8].substr(0, 10), "-rw-r-----");
  EXPECT_NE(lines[8].find(kLongName), std::string::npos) << "ustar's prefix + name: " << lines[8];
  const std::string names = Shell("tar -tvzf " + dir + "/a.tar.gz", &status);
  EXPECT_NE(names.find("root/root"), std::string::npos) << names;
}

TEST_F(TarWriterTest, ExtractedFilesHaveTheirBytesModesAndTimes) {
  const std::string& dir = dir_;
  WriteBytes(dir + "/a.tar.gz", SampleArchive());
  fs::create_directories(dir + "/x");
  int status = 0;
  const std::string out =
      Shell("tar -xzf " + dir + "/a.tar.gz -C " + dir + "/x --no-same-owner 2>&1", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(ReadBytes(dir + "/x/keys/private/site.key"), "secret\n");
  EXPECT_EQ(ReadBytes(dir + "/x/keys/site.pub"), "public\n");
  EXPECT_EQ(ReadBytes(dir + "/x/empty"), "");
  EXPECT_EQ(ReadBytes(dir + "/x/block"), std::string(512, 'x'));
  EXPECT_EQ(ReadBytes(dir + "/x/" + kLongName), "long\n");
  EXPECT_EQ(ModeOf(dir + "/x/keys/private/site.key"), 0600u);
  EXPECT_EQ(ModeOf(dir + "/x/keys/private"), 0700u);
  EXPECT_EQ(ModeOf(dir + "/x/keys/site.pub"), 0644u);
  EXPECT_EQ(ModeOf(dir + "/x/" + kLongName), 0640u);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/x/keys/site.pub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mtime, 1700000002);
}

TEST_F(TarWriterTest, TheSameEntriesGiveTheSameBytes) {
  EXPECT_EQ(SampleArchive(), SampleArchive());
  TarWriter a, b;
  ASSERT_TRUE(a.AddFile("f", "1", 0644, 5).ok());
  ASSERT_TRUE(b.AddFile("f", "1", 0644, 6).ok());
  EXPECT_NE(a.Finish(), b.Finish()) << "the time is in the header";
}

TEST_F(TarWriterTest, RefusesPathsThatWouldLeaveTheDirectoryOrNotFit) {
  TarWriter tar;
  for (const std::string& bad :
       {std::string(""), std::string("/etc/passwd"), std::string("../x"), std::string("a/../b"),
        std::string("a//b"), std::string("./a"), std::string("a/"), std::string(101, 'n'),
        std::string(156, 'p') + "/n", std::string(300, 'a')}) {
    const Status st = tar.AddFile(bad, "x", 0644, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  EXPECT_EQ(tar.AddFile("a", "x", 010000, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tar.AddFile("a", "x", 0644, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tar.Finish().size(), 1024u) << "nothing refused was written";
}

}  // namespace
}  // namespace huddle::cli
