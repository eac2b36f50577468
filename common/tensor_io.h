// Binary encoding of tensor lists, used by model files and checkpoints (docs/architecture.md has
// the byte layout). All integers little-endian.
//
//   tensor list := u32 count, then per tensor:
//                  u32 name_len, name bytes, u32 rank, i64 dims[rank], f32 data[prod(dims)]
//   model file  := "HUDDLEM1" (8 bytes) + tensor list
//
// Readers validate every length against the remaining bytes and the limits, so a truncated or
// corrupted file is an error naming what is wrong, never a crash.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "common/tensor.h"

namespace huddle {

// Appends the encoding of `tensors` to `out`.
void AppendTensorList(const TensorList& tensors, std::string* out);
void AppendU32(uint32_t v, std::string* out);
void AppendU64(uint64_t v, std::string* out);

// Reads from `in` at *offset, advancing it. `what` names the source in errors.
class ByteReader {
 public:
  ByteReader(std::string_view in, std::string what) : in_(in), what_(std::move(what)) {}
  StatusOr<uint32_t> U32();
  StatusOr<uint64_t> U64();
  StatusOr<std::string> Bytes(size_t n);
  StatusOr<TensorList> TensorListValue();
  size_t remaining() const { return in_.size() - offset_; }

 private:
  Status Need(size_t n) const;
  std::string_view in_;
  std::string what_;
  size_t offset_ = 0;
};

inline constexpr char kModelFileMagic[] = "HUDDLEM1";

// The largest model file ReadModelFile reads: the values of the largest model (2^31 float
// parameters, models/model.h) and 1 MiB for the tensors' headers, so that a file is never read
// into more memory than a model could use.
inline constexpr uint64_t kMaxModelFileBytes = (uint64_t{1} << 31) * sizeof(float) + (1 << 20);

// Writes a model file atomically; reads one back. ReadModelFile reads regular files only
// (ReadableFile: a FIFO, a device such as /dev/zero or a directory is FailedPrecondition, refused
// before anything is read), of at most kMaxModelFileBytes, and checks the tensor headers against
// the file's size before it reads any tensor data: a header that claims more bytes than the file
// holds, or a file with bytes after its last tensor, is DataLoss naming both sizes.
Status WriteModelFile(const std::string& path, const TensorList& tensors);
StatusOr<TensorList> ReadModelFile(const std::string& path);
// The tensors of a model file, by name and shape, from its headers alone (small reads, no tensor
// data read, whatever the file's size), with ReadModelFile's checks of the headers against the
// file: a summary of a model too large to read (huddle report).
StatusOr<std::vector<TensorSpec>> ReadModelFileLayout(const std::string& path);

}  // namespace huddle
