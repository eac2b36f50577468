// A gzipped tar archive written in memory: the POSIX ustar format (POSIX.1-1988 as GNU tar and
// bsdtar read it), for the kits of `huddle provision` (cli/provision.h).
//
// What an archive holds is exactly what the caller added, in the order added: regular files and
// directories, each with the mode and modification time given, owned by uid 0 / gid 0 with the
// owner names "root"/"root" set explicitly (so that `tar -x --no-same-owner` as root, or any
// extraction by another user, gives the extracting user's ownership, and nothing depends on the
// writing machine's accounts). Nothing else enters the header: no device numbers, no links, no
// extended (pax) records. Two archives of the same entries are the same bytes, and so are their
// gzip streams (Gzip writes no time or file name into its header).
//
// Paths are relative, '/'-separated, without "." or ".." components, an empty component or a
// trailing '/': 1-255 bytes that ustar can split into a prefix of at most 155 bytes and a name
// of at most 100. Anything else is refused with InvalidArgument naming the path, so an archive
// never extracts outside the directory it is extracted into.
//
// Thread-safety: a TarWriter is a plain value; use one per thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace huddle::cli {

class TarWriter {
 public:
  // A directory entry ("keys" is written as "keys/"). `mode`: permission bits only (0-07777).
  Status AddDirectory(std::string_view path, unsigned mode, int64_t mtime_s);
  // A regular file of `contents`.
  Status AddFile(std::string_view path, std::string_view contents, unsigned mode, int64_t mtime_s);

  // The archive: the entries, then the two zero blocks that end it. The writer is left empty.
  std::string Finish();

 private:
  Status AddEntry(std::string_view path, char type, std::string_view contents, unsigned mode,
                  int64_t mtime_s);
  std::string data_;
};

// `data` as one gzip member (RFC 1952, zlib at its best compression): no name, time 0, OS Unix,
// so the same input gives the same bytes.
StatusOr<std::string> Gzip(std::string_view data);

}  // namespace huddle::cli
