#include "data/dataset.h"

namespace huddle::data {

Status ValidateDataset(const Dataset& dataset) {
  if (dataset.feature_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset: feature_dim is ", dataset.feature_dim, "; it must be >= 1"));
  }
  if (dataset.num_classes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset: num_classes is ", dataset.num_classes, "; it must be >= 1"));
  }
  const auto expected =
      static_cast<uint64_t>(dataset.size()) * static_cast<uint64_t>(dataset.feature_dim);
  if (dataset.features.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset: ", dataset.size(), " rows of ", dataset.feature_dim, " features need ", expected,
        " values, but there are ", dataset.features.size()));
  }
  for (int64_t r = 0; r < dataset.size(); ++r) {
    const int32_t label = dataset.labels[static_cast<size_t>(r)];
    if (label < 0 || label >= dataset.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat("dataset: row ", r, " has label ", label,
                                                     ", outside [0, ", dataset.num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

Status ValidateView(const DatasetView& view) {
  if (view.base == nullptr) {
    return absl::InvalidArgumentError("dataset view has no base dataset");
  }
  const int64_t n = view.base->size();
  for (size_t i = 0; i < view.indices.size(); ++i) {
    if (view.indices[i] < 0 || view.indices[i] >= n) {
      return absl::InvalidArgumentError(absl::StrCat("dataset view: index ", i, " is row ",
                                                     view.indices[i], ", outside [0, ", n, ")"));
    }
  }
  return absl::OkStatus();
}

StatusOr<Dataset> SelectRows(const Dataset& dataset, std::span<const int64_t> rows) {
  if (dataset.feature_dim < 1 ||
      dataset.features.size() != static_cast<size_t>(dataset.size() * dataset.feature_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("select rows: dataset has ", dataset.features.size(), " feature values for ",
                     dataset.size(), " rows of ", dataset.feature_dim));
  }
  Dataset out;
  out.feature_dim = dataset.feature_dim;
  out.num_classes = dataset.num_classes;
  out.labels.reserve(rows.size());
  out.features.reserve(rows.size() * static_cast<size_t>(dataset.feature_dim));
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    if (r < 0 || r >= dataset.size()) {
      return absl::InvalidArgumentError(absl::StrCat("select rows: entry ", i, " is row ", r,
                                                     ", outside [0, ", dataset.size(), ")"));
    }
    out.labels.push_back(dataset.labels[static_cast<size_t>(r)]);
    const float* src = dataset.row_features(r);
    out.features.insert(out.features.end(), src, src + dataset.feature_dim);
  }
  return out;
}

}  // namespace huddle::data
