// Helpers shared by the kernel tests: seeded random buffers and an atol + rtol*|ref| comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/rng.h"

namespace huddle::kernels::test_util {

// n values uniform in [lo, hi), from `rng`.
inline std::vector<float> RandomVector(Rng& rng, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * rng.Uniform());
  return v;
}

// Every |actual[i] - ref[i]| <= atol + rtol * |ref[i]|; reports the first few mismatches.
inline void ExpectAllNear(std::span<const float> actual, std::span<const double> ref, double atol,
                          double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), ref.size()) << what;
  int mismatches = 0;
  for (size_t i = 0; i < ref.size() && mismatches < 5; ++i) {
    const double tol = atol + rtol * std::abs(ref[i]);
    if (!(std::abs(static_cast<double>(actual[i]) - ref[i]) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << ", reference " << ref[i]
                    << " (tolerance " << tol << ")";
      ++mismatches;
    }
  }
}

}  // namespace huddle::kernels::test_util
