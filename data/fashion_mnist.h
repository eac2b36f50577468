// Loading IDX image/label pairs (MNIST, Fashion-MNIST) into a Dataset.
//
// Images become float features scaled to [0, 1] (x / 255), one row per image with the image's
// pixels in row-major order (784 for 28x28). Labels become int32 in [0, num_classes).
//
// A client that trains on one shard passes that shard's sorted row list; only those images are
// kept (the file is streamed, see data/idx.h). Labels are small and always read in full.
//
// Thread-safety: stateless functions; safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/dataset.h"

namespace huddle::data {

// Where the Debian image installs Fashion-MNIST (the four .gz files of the original release).
constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split { kTrain, kTest };

// File names of a split inside a Fashion-MNIST directory.
struct IdxFilePair {
  std::string images;  // e.g. <dir>/train-images-idx3-ubyte.gz
  std::string labels;  // e.g. <dir>/train-labels-idx1-ubyte.gz
};
IdxFilePair FashionMnistFiles(const std::string& dir, Split split);

// All labels of a rank-1 unsigned-byte IDX file (values 0..255, not range-checked here).
StatusOr<std::vector<int32_t>> LoadIdxLabels(const std::string& path);

// Images (rank >= 2) and labels (rank 1) of the same items. rows == nullptr loads every item;
// otherwise *rows (strictly increasing, in range) selects the items, in that order.
// Errors: either file's errors (data/idx.h); InvalidArgument if the files' item counts differ or a
// kept label is outside [0, num_classes).
StatusOr<Dataset> LoadIdxDataset(const std::string& images_gz, const std::string& labels_gz,
                                 const std::vector<int64_t>* rows, int64_t num_classes = 10);

// LoadIdxDataset on the split's files in `dir` (10 classes).
StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split,
                                   const std::vector<int64_t>* rows = nullptr);

}  // namespace huddle::data
