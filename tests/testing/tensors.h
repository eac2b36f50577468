// Shared test helper: tensors compared bit for bit. Header-only; any test target may include it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/tensor.h"

namespace huddle::testing {

// Whether `a` and `b` hold the same tensors (names, shapes) with the same bits (so -0.0 differs
// from 0.0, and two NaNs with one payload are equal).
inline bool BitwiseEqual(const TensorList& a, const TensorList& b) {
  if (a.size() != b.size()) return false;
  for (size_t t = 0; t < a.size(); ++t) {
    if (a[t].spec != b[t].spec || a[t].data.size() != b[t].data.size()) return false;
    if (std::memcmp(a[t].data.data(), b[t].data.data(), a[t].data.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

inline bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The largest |a - b| over every element, in double. `b` must hold at least `a`'s tensors and
// elements (the tests compare models of one spec).
inline double MaxAbsDiff(const TensorList& a, const TensorList& b) {
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    for (size_t i = 0; i < a[t].data.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(a[t].data[i]) - b[t].data[i]));
    }
  }
  return worst;
}

}  // namespace huddle::testing
