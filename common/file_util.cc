#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

namespace huddle {
namespace {

Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

std::string DirOf(const std::string& path) {
  std::filesystem::path p(path);
  std::string dir = p.parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

Status WriteFileAtomic(const std::string& path, std::string_view contents, unsigned mode) {
  // Unique per call (process id + counter) and created exclusively: concurrent writers of the
  // same path never share a temporary file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode & 0777);
  if (fd < 0) return ErrnoError("cannot create", tmp);
  Status st = ::fchmod(fd, mode & 0777) == 0 ? absl::OkStatus() : ErrnoError("chmod", tmp);
  if (st.ok()) st = WriteAll(fd, contents, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoError("fsync", tmp);
  if (::close(fd) != 0 && st.ok()) st = ErrnoError("close", tmp);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = ErrnoError("rename to", path);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  const std::string dir = DirOf(path);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError("cannot open directory", dir);
  const bool synced = ::fsync(dfd) == 0;
  ::close(dfd);
  if (!synced) return ErrnoError("fsync directory", dir);
  return absl::OkStatus();
}

namespace {

// What `mode` is, for the error that refuses it.
const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

}  // namespace

StatusOr<ReadableFile> ReadableFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one; the
  // flag changes nothing for the regular files that pass the check below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no such file: '", path, "'"));
    return ErrnoError("cannot open", path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status error = ErrnoError("cannot stat", path);
    ::close(fd);
    return error;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is ", FileKind(st.st_mode),
                                                      ", not a regular file; give a file's path"));
  }
  return ReadableFile(path, fd, static_cast<uint64_t>(st.st_size));
}

ReadableFile::ReadableFile(ReadableFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

ReadableFile& ReadableFile::operator=(ReadableFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

ReadableFile::~ReadableFile() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<size_t> ReadableFile::ReadSomeAt(uint64_t offset, size_t n, char* out) const {
  while (true) {
    const ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
    if (got >= 0) return static_cast<size_t>(got);
    if (errno != EINTR) return ErrnoError("read", path_);
  }
}

Status ReadableFile::ReadAt(uint64_t offset, size_t n, char* out) const {
  size_t done = 0;
  while (done < n) {
    HUDDLE_ASSIGN_OR_RETURN(size_t got, ReadSomeAt(offset + done, n - done, out + done));
    if (got == 0) {
      return absl::DataLossError(absl::StrCat("'", path_, "' ends at byte ", offset + done,
                                              ", before the ", n, " bytes at byte ", offset));
    }
    done += got;
  }
  return absl::OkStatus();
}

StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) {
  HUDDLE_ASSIGN_OR_RETURN(ReadableFile file, ReadableFile::Open(path));
  auto too_big = [&](uint64_t bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' is ", bytes, " bytes, more than the limit of ", max_bytes));
  };
  if (file.size() > max_bytes) return too_big(file.size());
  // Read to the end rather than to size(): the files of /proc say 0. Bounded by max_bytes.
  std::string out;
  char buf[1 << 16];
  while (true) {
    // One byte past the limit at most, to see that the file grew past it.
    const uint64_t left = max_bytes - out.size();
    const size_t want = left >= sizeof(buf) ? sizeof(buf) : static_cast<size_t>(left) + 1;
    HUDDLE_ASSIGN_OR_RETURN(size_t got, file.ReadSomeAt(out.size(), want, buf));
    if (got == 0) break;
    out.append(buf, got);
    if (out.size() > max_bytes) return too_big(out.size());
  }
  return out;
}

Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create directory '", dir, "': ", ec.message()));
  return absl::OkStatus();
}

Status AppendLine(const std::string& path, std::string_view line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot open", path);
  std::string data(line);
  data.push_back('\n');
  Status st = WriteAll(fd, data, path);
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoError("fsync", path);
  ::close(fd);
  return st;
}

Status KeepJsonLinesUpTo(const std::string& path, std::string_view key, uint64_t max) {
  auto text = ReadFile(path);
  if (!text.ok()) return absl::OkStatus();
  std::string kept;
  size_t pos = 0;
  while (pos < text->size()) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    const std::string line = text->substr(pos, end - pos);
    pos = end + 1;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains(key) && j[std::string(key)].is_number_unsigned() &&
        j[std::string(key)].get<uint64_t>() <= max) {
      kept += line + "\n";
    }
  }
  return WriteFileAtomic(path, kept);
}

}  // namespace huddle
