// Durable file helpers. Checkpoints and outputs are written atomically: a temporary file beside
// the target, fsync'd, renamed over the target, and the directory fsync'd, so a crash at any point
// leaves either the old file or the new one, never a torn one.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "common/status.h"

namespace huddle {

// Atomically replaces `path` with `contents` (temp file + fsync + rename + directory fsync). The
// file gets exactly `mode` (e.g. 0600 for a secret), whatever the umask.
Status WriteFileAtomic(const std::string& path, std::string_view contents, unsigned mode = 0644);

// A regular file open for reading: the one way files are opened for reading here, so that what
// is not a regular file (a FIFO, a device such as /dev/zero, a socket, a directory) is refused
// naming what it is, before a byte is read and without blocking (a FIFO with no writer would
// block open(2) forever). Move-only; closes its descriptor when destroyed.
class ReadableFile {
 public:
  // NotFound if `path` does not exist; FailedPrecondition naming the path and what it is when it
  // is not a regular file.
  static StatusOr<ReadableFile> Open(const std::string& path);

  ReadableFile(ReadableFile&& other) noexcept;
  ReadableFile& operator=(ReadableFile&& other) noexcept;
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;
  ~ReadableFile();

  // The size when opened (0 for the virtual files of /proc, which are read to their end).
  uint64_t size() const { return size_; }
  // Reads exactly `n` bytes at `offset` into `out`; DataLoss naming the path if the file ends
  // first.
  Status ReadAt(uint64_t offset, size_t n, char* out) const;
  // Reads up to `n` bytes at `offset` into `out`: how many, 0 at the end of the file.
  StatusOr<size_t> ReadSomeAt(uint64_t offset, size_t n, char* out) const;

 private:
  ReadableFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

inline constexpr uint64_t kNoFileSizeLimit = std::numeric_limits<uint64_t>::max();

// Reads the whole of the regular file `path` (ReadableFile::Open's errors), at most `max_bytes`
// of it: a larger file is FailedPrecondition naming both sizes, before anything is read (or when
// it grows past the limit while being read).
StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes = kNoFileSizeLimit);

// Creates `dir` and its parents if missing.
Status MakeDirs(const std::string& dir);

// Appends `line` plus '\n' to `path` (created if missing) and fsyncs it.
Status AppendLine(const std::string& path, std::string_view line);

// Rewrites a JSON-lines file (atomically) keeping only the objects whose `key` is an unsigned
// integer <= max: a resume drops the lines of rounds or epochs after its checkpoint. A missing
// file is fine.
Status KeepJsonLinesUpTo(const std::string& path, std::string_view key, uint64_t max);

}  // namespace huddle
