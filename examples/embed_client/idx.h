// A contiguous shard of an IDX data set (the MNIST file format: big-endian header, then raw
// unsigned bytes), as Debian's dataset-fashion-mnist ships it: gzip'd files under
// /usr/share/datasets/fashion-mnist. Plain (not gzip'd) files are read as well.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace embed {

// Examples as rows of `features` floats in [0, 1] (pixel / 255, as Huddle's own loader scales
// them) and labels in [0, num_classes).
struct Dataset {
  int64_t rows = 0;
  int64_t features = 0;
  std::vector<float> x;    // rows * features, row-major
  std::vector<int32_t> y;  // rows
};

// Rows [shard * n / num_shards, (shard + 1) * n / num_shards) of the images file (ubyte, rank
// >= 2: each item is flattened) and its labels file (ubyte, rank 1, the same item count).
// Throws std::runtime_error naming the file and what is wrong with it.
Dataset LoadIdxShard(const std::string& images_path, const std::string& labels_path, int64_t shard,
                     int64_t num_shards);

}  // namespace embed
