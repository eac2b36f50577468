// Reader for IDX files (the format of MNIST and Fashion-MNIST), raw or gzip-compressed.
//
// Format (big-endian): bytes 0-1 are 0x0000, byte 2 is the element type, byte 3 the rank R, then R
// uint32 dimensions, then the elements in row-major order and nothing after them. Only element
// type 0x08 (unsigned byte) is supported. Dimension 0 counts the file's items (images, labels).
//
// The file is streamed through zlib in chunks, so its decompressed contents are never held in
// memory at once, and a client can keep only its shard's items (`rows`). Compression is detected
// from the gzip magic number, so an uncompressed file reads the same way.
//
// Every header field is checked against the data actually present: a bad magic number, an
// unsupported type or rank, a zero dimension, a size beyond `IdxLimits`, a truncated or corrupt
// file, and bytes after the last item are errors (never crashes) whose message names the file.
//
// Thread-safety: stateless functions; safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace huddle::data {

// Bounds on what a header may claim, so a hostile or corrupt file cannot force a huge allocation.
struct IdxLimits {
  int64_t max_rank = 4;                        // MNIST images have rank 3, labels rank 1
  int64_t max_total_bytes = int64_t{4} << 30;  // product of all dimensions
};

// An IDX file's header and the items kept from it.
struct IdxArray {
  std::vector<int64_t> dims;    // as stored in the file; dims[0] counts the file's items
  int64_t item_size = 0;        // bytes per item: product of dims[1..] (1 for a rank-1 file)
  std::vector<uint8_t> values;  // kept items in file order, num_kept() * item_size bytes

  int64_t num_kept() const {
    return item_size == 0 ? 0 : static_cast<int64_t>(values.size()) / item_size;
  }
};

// Reads the unsigned-byte IDX file at `path` (gzip or raw).
// rows == nullptr keeps every item; otherwise `*rows` must be strictly increasing indices in
// [0, dims[0]) and only those items are kept (the rest of the file is still read and validated).
// Errors: NotFound (no such file), InvalidArgument (bad header, bad rows), DataLoss (truncated,
// corrupt or trailing data), each message starting with the path.
StatusOr<IdxArray> ReadIdxUbyte(const std::string& path, const std::vector<int64_t>* rows = nullptr,
                                const IdxLimits& limits = {});

}  // namespace huddle::data
