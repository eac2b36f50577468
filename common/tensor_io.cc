#include "common/tensor_io.h"

#include <bit>
#include <cstring>
#include <vector>

#include "common/file_util.h"

namespace huddle {
namespace {

template <typename T>
void AppendRaw(const T& v, std::string* out) {
  static_assert(std::endian::native == std::endian::little, "little-endian hosts only");
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

constexpr uint32_t kMaxTensors = 1 << 16;
constexpr uint32_t kMaxName = 1024;
constexpr int64_t kMaxElements = int64_t{1} << 32;

}  // namespace

void AppendU32(uint32_t v, std::string* out) { AppendRaw(v, out); }
void AppendU64(uint64_t v, std::string* out) { AppendRaw(v, out); }

void AppendTensorList(const TensorList& tensors, std::string* out) {
  AppendU32(static_cast<uint32_t>(tensors.size()), out);
  for (const Tensor& t : tensors) {
    AppendU32(static_cast<uint32_t>(t.name().size()), out);
    out->append(t.name());
    AppendU32(static_cast<uint32_t>(t.spec.shape.size()), out);
    for (int64_t d : t.spec.shape) AppendRaw(d, out);
    out->append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(float));
  }
}

Status ByteReader::Need(size_t n) const {
  if (n > remaining()) {
    return absl::DataLossError(absl::StrCat(what_, ": truncated at byte ", offset_, " (needs ", n,
                                            " more bytes, ", remaining(), " left)"));
  }
  return absl::OkStatus();
}

StatusOr<uint32_t> ByteReader::U32() {
  HUDDLE_RETURN_IF_ERROR(Need(4));
  uint32_t v;
  std::memcpy(&v, in_.data() + offset_, 4);
  offset_ += 4;
  return v;
}

StatusOr<uint64_t> ByteReader::U64() {
  HUDDLE_RETURN_IF_ERROR(Need(8));
  uint64_t v;
  std::memcpy(&v, in_.data() + offset_, 8);
  offset_ += 8;
  return v;
}

StatusOr<std::string> ByteReader::Bytes(size_t n) {
  HUDDLE_RETURN_IF_ERROR(Need(n));
  std::string s(in_.substr(offset_, n));
  offset_ += n;
  return s;
}

StatusOr<TensorList> ByteReader::TensorListValue() {
  HUDDLE_ASSIGN_OR_RETURN(uint32_t count, U32());
  if (count > kMaxTensors) {
    return absl::DataLossError(absl::StrCat(what_, ": ", count, " tensors exceeds the limit"));
  }
  TensorList out;
  for (uint32_t i = 0; i < count; ++i) {
    Tensor t;
    HUDDLE_ASSIGN_OR_RETURN(uint32_t name_len, U32());
    if (name_len > kMaxName) {
      return absl::DataLossError(absl::StrCat(what_, ": tensor ", i, " name too long"));
    }
    HUDDLE_ASSIGN_OR_RETURN(t.spec.name, Bytes(name_len));
    HUDDLE_ASSIGN_OR_RETURN(uint32_t rank, U32());
    if (rank > 8) return absl::DataLossError(absl::StrCat(what_, ": tensor ", i, " rank ", rank));
    for (uint32_t r = 0; r < rank; ++r) {
      HUDDLE_ASSIGN_OR_RETURN(uint64_t d, U64());
      t.spec.shape.push_back(static_cast<int64_t>(d));
    }
    Status shape_ok =
        ValidateShape(t.spec.shape, kMaxElements, absl::StrCat(what_, ": ", t.name()));
    if (!shape_ok.ok()) return absl::DataLossError(shape_ok.message());
    const size_t bytes = static_cast<size_t>(t.spec.NumElements()) * sizeof(float);
    HUDDLE_RETURN_IF_ERROR(Need(bytes));
    t.data.resize(static_cast<size_t>(t.spec.NumElements()));
    std::memcpy(t.data.data(), in_.data() + offset_, bytes);
    offset_ += bytes;
    out.push_back(std::move(t));
  }
  return out;
}

Status WriteModelFile(const std::string& path, const TensorList& tensors) {
  std::string out(kModelFileMagic, 8);
  AppendTensorList(tensors, &out);
  return WriteFileAtomic(path, out);
}

namespace {

// Walks the headers of the model file `file` (its magic, then each tensor's name, rank and dims)
// with small reads, checking each tensor's data against the file's size: the file is read whole
// only once its headers account for every one of its bytes. The limits are ByteReader's.
StatusOr<std::vector<TensorSpec>> CheckModelFileLayout(const ReadableFile& file,
                                                       const std::string& path) {
  const uint64_t size = file.size();
  uint64_t offset = 0;
  std::string header;
  // The next `n` header bytes, into `header`.
  auto read = [&](size_t n, const std::string& what) -> Status {
    if (n > size - offset) {
      return absl::DataLossError(absl::StrCat(path, ": truncated at byte ", offset, " in ", what,
                                              " (needs ", n, " bytes, the file holds ",
                                              size - offset, " more)"));
    }
    header.resize(n);
    HUDDLE_RETURN_IF_ERROR(file.ReadAt(offset, n, header.data()));
    offset += n;
    return absl::OkStatus();
  };
  auto u32 = [&](const std::string& what) -> StatusOr<uint32_t> {
    HUDDLE_RETURN_IF_ERROR(read(4, what));
    uint32_t v;
    std::memcpy(&v, header.data(), 4);
    return v;
  };
  HUDDLE_RETURN_IF_ERROR(read(8, "the magic"));
  if (header != std::string(kModelFileMagic, 8)) {
    return absl::DataLossError(absl::StrCat(path, ": not a Huddle model file (bad magic)"));
  }
  HUDDLE_ASSIGN_OR_RETURN(uint32_t count, u32("the tensor count"));
  if (count > kMaxTensors) {
    return absl::DataLossError(absl::StrCat(path, ": ", count, " tensors exceeds the limit"));
  }
  std::vector<TensorSpec> layout;
  layout.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const std::string where = absl::StrCat("the header of tensor ", i);
    HUDDLE_ASSIGN_OR_RETURN(uint32_t name_len, u32(where));
    if (name_len > kMaxName) {
      return absl::DataLossError(absl::StrCat(path, ": tensor ", i, " name too long"));
    }
    HUDDLE_RETURN_IF_ERROR(read(name_len, where));
    const std::string name = header;
    HUDDLE_ASSIGN_OR_RETURN(uint32_t rank, u32(where));
    if (rank > 8) return absl::DataLossError(absl::StrCat(path, ": tensor ", i, " rank ", rank));
    HUDDLE_RETURN_IF_ERROR(read(size_t{8} * rank, where));
    std::vector<int64_t> shape(rank);
    if (rank > 0) std::memcpy(shape.data(), header.data(), header.size());
    Status shape_ok = ValidateShape(shape, kMaxElements, absl::StrCat(path, ": ", name));
    if (!shape_ok.ok()) return absl::DataLossError(shape_ok.message());
    uint64_t elements = 1;
    for (int64_t d : shape) elements *= static_cast<uint64_t>(d);
    const uint64_t bytes = elements * sizeof(float);
    if (bytes > size - offset) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated, or a header claiming more than the file holds: tensor ",
                       i, " ('", name, "') needs ", bytes, " bytes of data at byte ", offset,
                       ", the file holds ", size - offset));
    }
    offset += bytes;
    layout.push_back(TensorSpec{name, DType::kFloat32, std::move(shape)});
  }
  if (offset != size) {
    return absl::DataLossError(absl::StrCat(path, ": its tensors end at byte ", offset,
                                            ", followed by ", size - offset, " trailing bytes"));
  }
  return layout;
}

}  // namespace

StatusOr<std::vector<TensorSpec>> ReadModelFileLayout(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(ReadableFile file, ReadableFile::Open(path));
  return CheckModelFileLayout(file, path);
}

StatusOr<TensorList> ReadModelFile(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(ReadableFile file, ReadableFile::Open(path));
  if (file.size() > kMaxModelFileBytes) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is ", file.size(),
                                                      " bytes, more than the model-file limit of ",
                                                      kMaxModelFileBytes, " bytes"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckModelFileLayout(file, path).status());
  // The headers account for every byte: read them all, and decode (checked again, as any input).
  std::string bytes(static_cast<size_t>(file.size()), '\0');
  HUDDLE_RETURN_IF_ERROR(file.ReadAt(0, bytes.size(), bytes.data()));
  ByteReader reader(bytes, path);
  HUDDLE_ASSIGN_OR_RETURN(std::string magic, reader.Bytes(8));
  if (magic != std::string(kModelFileMagic, 8)) {
    return absl::DataLossError(absl::StrCat(path, ": not a Huddle model file (bad magic)"));
  }
  HUDDLE_ASSIGN_OR_RETURN(TensorList tensors, reader.TensorListValue());
  if (reader.remaining() != 0) {
    return absl::DataLossError(absl::StrCat(path, ": ", reader.remaining(), " trailing bytes"));
  }
  return tensors;
}

}  // namespace huddle
