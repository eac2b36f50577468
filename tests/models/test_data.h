// Synthetic data sets shared by the models tests.
#pragma once

#include <cstdint>

#include "common/rng.h"
#include "data/dataset.h"

namespace huddle::models {

// num_classes Gaussian blobs in `dim` dimensions: class c is centred on 2 * e_c, noise sd 0.5.
inline data::Dataset Blobs(int64_t n, int64_t dim, int64_t num_classes, uint64_t seed) {
  data::Dataset d;
  d.feature_dim = dim;
  d.num_classes = num_classes;
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<int32_t>(i % num_classes);
    d.labels.push_back(label);
    for (int64_t j = 0; j < dim; ++j) {
      d.features.push_back(static_cast<float>((j == label ? 2.0 : 0.0) + 0.5 * rng.Normal()));
    }
  }
  return d;
}

}  // namespace huddle::models
