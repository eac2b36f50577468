#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

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

StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no such file: '", path, "'"));
    return ErrnoError("cannot open", path);
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      Status st = ErrnoError("read", path);
      ::close(fd);
      return st;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
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
