// Durable file helpers. Checkpoints and outputs are written atomically: a temporary file beside
// the target, fsync'd, renamed over the target, and the directory fsync'd, so a crash at any point
// leaves either the old file or the new one, never a torn one.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace huddle {

// Atomically replaces `path` with `contents` (temp file + fsync + rename + directory fsync). The
// file gets exactly `mode` (e.g. 0600 for a secret), whatever the umask.
Status WriteFileAtomic(const std::string& path, std::string_view contents, unsigned mode = 0644);

// Reads the whole file. NotFound if it does not exist.
StatusOr<std::string> ReadFile(const std::string& path);

// Creates `dir` and its parents if missing.
Status MakeDirs(const std::string& dir);

// Appends `line` plus '\n' to `path` (created if missing) and fsyncs it.
Status AppendLine(const std::string& path, std::string_view line);

// Rewrites a JSON-lines file (atomically) keeping only the objects whose `key` is an unsigned
// integer <= max: a resume drops the lines of rounds or epochs after its checkpoint. A missing
// file is fine.
Status KeepJsonLinesUpTo(const std::string& path, std::string_view key, uint64_t max);

}  // namespace huddle
