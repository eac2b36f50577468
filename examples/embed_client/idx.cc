#include "idx.h"

#include <zlib.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

namespace embed {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

[[noreturn]] void Fail(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": " + why);
}

// Reads exactly n bytes (gzread transparently reads plain files too).
void ReadExactly(gzFile file, const std::string& path, void* out, int64_t n) {
  auto* bytes = static_cast<unsigned char*>(out);
  while (n > 0) {
    const unsigned want = static_cast<unsigned>(std::min<int64_t>(n, 1 << 30));
    const int got = gzread(file, bytes, want);
    if (got <= 0) {
      int errnum = 0;
      const char* message = gzerror(file, &errnum);
      Fail(path, got == 0 ? "ends early" : std::string("read error: ") + message);
    }
    bytes += got;
    n -= got;
  }
}

struct IdxFile {
  GzFile file;
  std::vector<int64_t> dims;  // dims[0]: the item count
  int64_t item_size = 1;      // bytes per item
};

// Opens an IDX file of unsigned bytes and reads its header: 0, 0, type 0x08, rank, then rank
// big-endian uint32 dimensions.
IdxFile OpenIdx(const std::string& path) {
  IdxFile idx;
  idx.file.reset(gzopen(path.c_str(), "rb"));
  if (!idx.file) Fail(path, "cannot open");
  unsigned char magic[4];
  ReadExactly(idx.file.get(), path, magic, 4);
  if (magic[0] != 0 || magic[1] != 0) Fail(path, "not an IDX file (bad magic)");
  if (magic[2] != 0x08) Fail(path, "IDX element type is not unsigned byte (0x08)");
  if (magic[3] < 1) Fail(path, "IDX rank is 0");
  for (int d = 0; d < magic[3]; ++d) {
    unsigned char b[4];
    ReadExactly(idx.file.get(), path, b, 4);
    const int64_t dim = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
    if (dim < 1 || dim > (int64_t{1} << 28))
      Fail(path, "implausible dimension " + std::to_string(dim));
    idx.dims.push_back(dim);
    if (d > 0) idx.item_size *= dim;
  }
  return idx;
}

// Skips `items` items (gzseek on a file opened for reading decompresses up to the offset).
void SkipItems(IdxFile& idx, const std::string& path, int64_t items) {
  const z_off_t at = gztell(idx.file.get());
  if (gzseek(idx.file.get(), at + static_cast<z_off_t>(items * idx.item_size), SEEK_SET) < 0) {
    Fail(path, "cannot skip to the shard");
  }
}

}  // namespace

Dataset LoadIdxShard(const std::string& images_path, const std::string& labels_path, int64_t shard,
                     int64_t num_shards) {
  if (num_shards < 1 || shard < 0 || shard >= num_shards) {
    throw std::runtime_error("shard " + std::to_string(shard) + " is outside [0, " +
                             std::to_string(num_shards) + ")");
  }
  IdxFile images = OpenIdx(images_path);
  IdxFile labels = OpenIdx(labels_path);
  if (images.dims.size() < 2) Fail(images_path, "images must have rank >= 2");
  if (labels.dims.size() != 1) Fail(labels_path, "labels must have rank 1");
  const int64_t n = images.dims[0];
  if (labels.dims[0] != n) {
    Fail(labels_path, std::to_string(labels.dims[0]) + " labels for " + std::to_string(n) +
                          " images in " + images_path);
  }
  const int64_t begin = shard * n / num_shards;
  const int64_t end = (shard + 1) * n / num_shards;
  if (end <= begin) Fail(images_path, "shard " + std::to_string(shard) + " is empty");

  Dataset data;
  data.rows = end - begin;
  data.features = images.item_size;
  SkipItems(images, images_path, begin);
  SkipItems(labels, labels_path, begin);
  std::vector<unsigned char> pixels(static_cast<size_t>(data.rows * data.features));
  ReadExactly(images.file.get(), images_path, pixels.data(), static_cast<int64_t>(pixels.size()));
  std::vector<unsigned char> classes(static_cast<size_t>(data.rows));
  ReadExactly(labels.file.get(), labels_path, classes.data(), data.rows);
  data.x.resize(pixels.size());
  for (size_t i = 0; i < pixels.size(); ++i) data.x[i] = static_cast<float>(pixels[i]) / 255.0f;
  data.y.assign(classes.begin(), classes.end());
  return data;
}

}  // namespace embed
