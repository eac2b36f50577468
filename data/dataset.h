// In-memory classification datasets and cheap views of them.
//
// A `Dataset` owns a dense float32 feature matrix and one int32 label per row. A `DatasetView`
// names a subset of a dataset's rows without copying, so a simulation of 1000 clients can share one
// copy of the training set.
//
// Ownership: a view holds a non-owning pointer; the Dataset must outlive every view of it.
// Thread-safety: plain values. Concurrent reads are safe; nothing synchronises writes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace huddle::data {

struct Dataset {
  int64_t feature_dim = 0;      // features per row
  int64_t num_classes = 10;     // labels lie in [0, num_classes)
  std::vector<float> features;  // [size(), feature_dim] row-major
  std::vector<int32_t> labels;  // [size()]

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  // Pointer to row r's feature_dim features; r must be in [0, size()).
  const float* row_features(int64_t r) const { return features.data() + r * feature_dim; }
};

// Rows of `base` selected by `indices` (in that order; empty => every row of base, in order).
struct DatasetView {
  const Dataset* base = nullptr;  // not owned
  std::vector<int64_t> indices;   // rows of *base; empty => all rows

  // Number of rows in the view (0 when base is null).
  int64_t size() const {
    if (base == nullptr) return 0;
    return indices.empty() ? base->size() : static_cast<int64_t>(indices.size());
  }
  // Row of *base behind the view's i-th row, i in [0, size()).
  int64_t row(int64_t i) const { return indices.empty() ? i : indices[static_cast<size_t>(i)]; }
};

// Checks a dataset's invariants: feature_dim >= 1, num_classes >= 1, features.size() ==
// size() * feature_dim, and every label in [0, num_classes). Errors name the first bad row.
Status ValidateDataset(const Dataset& dataset);

// Checks that the view has a base and that every index lies in [0, base->size()).
Status ValidateView(const DatasetView& view);

// A new dataset holding rows[i] of `dataset` as its row i. InvalidArgument if a row is out of
// range.
StatusOr<Dataset> SelectRows(const Dataset& dataset, std::span<const int64_t> rows);

}  // namespace huddle::data
