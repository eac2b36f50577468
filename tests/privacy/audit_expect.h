// The verdicts every DP audit test asks of its two mechanisms (tests/privacy/audit_stats.h): the
// real one keeps its claim, and the same one with half the noise std is refuted by it.
#pragma once

#include <gtest/gtest.h>

#include "tests/privacy/audit_stats.h"

namespace huddle::testing::audit {

// The mechanism as built, against its stated epsilon: no check refutes it and its noise's
// variance is the stated one (within `variance_tolerance`, relative).
inline void ExpectKeepsItsClaim(const Audit& a, double stated, double variance_tolerance) {
  EXPECT_LE(a.attack.epsilon_lower_bound, stated);
  EXPECT_FALSE(a.scale.too_little_noise);
  EXPECT_NEAR(a.scale.variance_ratio, 1.0, variance_tolerance);
  EXPECT_LE(a.gaussian.epsilon_lower_bound, stated);
  EXPECT_FALSE(a.Refutes(stated));
}

// The mechanism with half the std, against the same claim: the scale test and the Gaussian loss
// both refute it.
inline void ExpectRefutedAtHalfTheNoise(const Audit& a, double stated) {
  EXPECT_TRUE(a.scale.too_little_noise);
  EXPECT_NEAR(a.scale.variance_ratio, 0.25, 0.01);
  EXPECT_GT(a.gaussian.epsilon_lower_bound, stated);
  EXPECT_TRUE(a.Refutes(stated));
}

}  // namespace huddle::testing::audit
