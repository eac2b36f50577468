#include "data/fashion_mnist.h"

#include "data/idx.h"

namespace huddle::data {

IdxFilePair FashionMnistFiles(const std::string& dir, Split split) {
  const std::string prefix = absl::StrCat(dir, "/", split == Split::kTrain ? "train" : "t10k");
  return {absl::StrCat(prefix, "-images-idx3-ubyte.gz"),
          absl::StrCat(prefix, "-labels-idx1-ubyte.gz")};
}

StatusOr<std::vector<int32_t>> LoadIdxLabels(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(const IdxArray array, ReadIdxUbyte(path));
  if (array.dims.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a label file has rank 1, this one has rank ", array.dims.size()));
  }
  return std::vector<int32_t>(array.values.begin(), array.values.end());
}

StatusOr<Dataset> LoadIdxDataset(const std::string& images_gz, const std::string& labels_gz,
                                 const std::vector<int64_t>* rows, int64_t num_classes) {
  if (num_classes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes is ", num_classes, "; it must be >= 1"));
  }
  HUDDLE_ASSIGN_OR_RETURN(const std::vector<int32_t> all_labels, LoadIdxLabels(labels_gz));
  HUDDLE_ASSIGN_OR_RETURN(const IdxArray images, ReadIdxUbyte(images_gz, rows));
  if (images.dims.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        images_gz, ": an image file has rank >= 2, this one has rank ", images.dims.size()));
  }
  if (images.dims[0] != static_cast<int64_t>(all_labels.size())) {
    return absl::InvalidArgumentError(absl::StrCat(images_gz, " holds ", images.dims[0],
                                                   " images but ", labels_gz, " holds ",
                                                   all_labels.size(), " labels"));
  }

  Dataset dataset;
  dataset.feature_dim = images.item_size;
  dataset.num_classes = num_classes;
  const int64_t n = images.num_kept();
  dataset.labels.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows != nullptr ? (*rows)[static_cast<size_t>(i)] : i;
    const int32_t label = all_labels[static_cast<size_t>(row)];
    if (label >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(labels_gz, ": item ", row, " has label ",
                                                     label, ", outside [0, ", num_classes, ")"));
    }
    dataset.labels[static_cast<size_t>(i)] = label;
  }
  dataset.features.resize(images.values.size());
  for (size_t i = 0; i < images.values.size(); ++i) {
    dataset.features[i] = static_cast<float>(images.values[i]) / 255.0f;
  }
  return dataset;
}

StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split,
                                   const std::vector<int64_t>* rows) {
  const IdxFilePair files = FashionMnistFiles(dir, split);
  return LoadIdxDataset(files.images, files.labels, rows, /*num_classes=*/10);
}

}  // namespace huddle::data
