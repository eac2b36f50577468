#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_join.h"

namespace huddle::data {
namespace {

constexpr uint8_t kTypeUbyte = 0x08;
constexpr int64_t kChunkBytes = int64_t{1} << 20;        // decompressed bytes per read
constexpr int64_t kMaxReserveBytes = int64_t{64} << 20;  // larger outputs grow as data arrives

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

const char* IdxTypeName(uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
  }
  return "unknown";
}

// Reads up to n bytes; fewer only at end of file. Errors only for corrupt or unreadable data.
StatusOr<int64_t> ReadUpTo(gzFile file, uint8_t* buf, int64_t n, const std::string& path) {
  int64_t got = 0;
  while (got < n) {
    const auto want = static_cast<unsigned>(std::min<int64_t>(n - got, int64_t{1} << 30));
    const int r = gzread(file, buf + got, want);
    if (r < 0) {
      int errnum = 0;
      const char* message = gzerror(file, &errnum);
      return absl::DataLossError(absl::StrCat(path, ": corrupt or unreadable data: ",
                                              errnum == Z_ERRNO ? std::strerror(errno) : message));
    }
    if (r == 0) break;
    got += r;
  }
  return got;
}

Status CheckRows(const std::string& path, const std::vector<int64_t>& rows, int64_t num_items) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= num_items) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": requested row ", rows[i], " is outside the file's ", num_items, " items"));
    }
    if (i > 0 && rows[i] <= rows[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": requested rows must be strictly increasing, but entry ", i, " (",
                       rows[i], ") follows ", rows[i - 1]));
    }
  }
  return absl::OkStatus();
}

// Reads and validates the magic number and dimensions.
StatusOr<std::vector<int64_t>> ReadHeader(gzFile file, const std::string& path,
                                          const IdxLimits& limits) {
  uint8_t magic[4];
  HUDDLE_ASSIGN_OR_RETURN(const int64_t got, ReadUpTo(file, magic, 4, path));
  if (got < 4) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: ", got, " bytes is too short for an IDX header"));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    const uint32_t value = (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) |
                           (uint32_t{magic[2]} << 8) | magic[3];
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an IDX file: magic number 0x",
                                                   absl::Hex(value, absl::kZeroPad8),
                                                   " does not start with 0x0000"));
  }
  if (magic[2] != kTypeUbyte) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": element type 0x", absl::Hex(magic[2], absl::kZeroPad2), " (",
                     IdxTypeName(magic[2]), ") is not supported; only 0x08 (unsigned byte) is"));
  }
  const int64_t rank = magic[3];
  if (rank < 1 || rank > limits.max_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": rank ", rank, " is outside [1, ", limits.max_rank, "]"));
  }
  uint8_t raw[4 * 255];
  HUDDLE_ASSIGN_OR_RETURN(const int64_t dims_got, ReadUpTo(file, raw, 4 * rank, path));
  if (dims_got < 4 * rank) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: the header ends inside its ", rank, " dimensions"));
  }
  std::vector<int64_t> dims(static_cast<size_t>(rank));
  int64_t total = 1;
  for (int64_t i = 0; i < rank; ++i) {
    const uint8_t* p = raw + 4 * i;
    dims[i] = (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | p[3];
    if (dims[i] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": dimension ", i, " is 0"));
    }
    if (total > limits.max_total_bytes / dims[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": dimensions [", absl::StrJoin(dims.begin(), dims.begin() + i + 1, ","),
          "...] exceed the limit of ", limits.max_total_bytes, " bytes"));
    }
    total *= dims[i];
  }
  return dims;
}

}  // namespace

StatusOr<IdxArray> ReadIdxUbyte(const std::string& path, const std::vector<int64_t>* rows,
                                const IdxLimits& limits) {
  errno = 0;
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open: ", err != 0 ? std::strerror(err) : "out of memory"));
  }
  gzbuffer(file.get(), 256 * 1024);

  IdxArray out;
  HUDDLE_ASSIGN_OR_RETURN(out.dims, ReadHeader(file.get(), path, limits));
  const int64_t num_items = out.dims[0];
  out.item_size = 1;
  for (size_t i = 1; i < out.dims.size(); ++i) out.item_size *= out.dims[i];
  if (rows != nullptr) HUDDLE_RETURN_IF_ERROR(CheckRows(path, *rows, num_items));

  const int64_t kept = rows != nullptr ? static_cast<int64_t>(rows->size()) : num_items;
  out.values.reserve(static_cast<size_t>(std::min(kept * out.item_size, kMaxReserveBytes)));
  const int64_t chunk_items = std::max<int64_t>(1, kChunkBytes / out.item_size);
  std::vector<uint8_t> chunk(static_cast<size_t>(std::min(chunk_items, num_items) * out.item_size));
  size_t next_row = 0;  // next entry of *rows to keep
  for (int64_t start = 0; start < num_items; start += chunk_items) {
    const int64_t count = std::min(chunk_items, num_items - start);
    const int64_t bytes = count * out.item_size;
    HUDDLE_ASSIGN_OR_RETURN(const int64_t got, ReadUpTo(file.get(), chunk.data(), bytes, path));
    if (got < bytes) {
      return absl::DataLossError(absl::StrCat(
          path, ": truncated: the header promises ", num_items, " items of ", out.item_size,
          " bytes, but the data ends inside item ", start + got / out.item_size));
    }
    if (rows == nullptr) {
      out.values.insert(out.values.end(), chunk.begin(), chunk.begin() + bytes);
      continue;
    }
    for (; next_row < rows->size() && (*rows)[next_row] < start + count; ++next_row) {
      const auto first = chunk.begin() + ((*rows)[next_row] - start) * out.item_size;
      out.values.insert(out.values.end(), first, first + out.item_size);
    }
  }
  uint8_t extra = 0;
  HUDDLE_ASSIGN_OR_RETURN(const int64_t extra_got, ReadUpTo(file.get(), &extra, 1, path));
  if (extra_got > 0) {
    return absl::DataLossError(absl::StrCat(path, ": trailing data after the last of ", num_items,
                                            " items (the file is longer than its header says)"));
  }
  return out;
}

}  // namespace huddle::data
