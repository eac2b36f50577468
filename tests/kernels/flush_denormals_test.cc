#include "kernels/flush_denormals.h"

#include <gtest/gtest.h>

#include <cfloat>

namespace huddle::kernels {
namespace {

// volatile keeps the compiler from folding the arithmetic at compile time.
float Halve(float x) {
  volatile float v = x;
  volatile float half = 0.5f;
  return v * half;
}

TEST(FlushDenormalsScopeTest, FlushesInsideAndRestoresAfter) {
#if !(defined(__SSE__) || defined(__x86_64__))
  GTEST_SKIP() << "FlushDenormalsScope is a no-op on this architecture";
#else
  const float subnormal = FLT_MIN / 4.0f;
  ASSERT_GT(subnormal, 0.0f);
  EXPECT_GT(Halve(subnormal), 0.0f);  // gradual underflow by default
  {
    FlushDenormalsScope scope;
    EXPECT_EQ(Halve(subnormal), 0.0f);  // DAZ: the subnormal input reads as zero
    EXPECT_EQ(Halve(FLT_MIN), 0.0f);    // FTZ: a subnormal result is flushed
    EXPECT_EQ(Halve(2.0f), 1.0f);       // normal arithmetic is untouched
    {
      FlushDenormalsScope nested;
      EXPECT_EQ(Halve(subnormal), 0.0f);
    }
    EXPECT_EQ(Halve(subnormal), 0.0f);  // the nested scope restored the outer state
  }
  EXPECT_GT(Halve(subnormal), 0.0f);
  EXPECT_GT(Halve(FLT_MIN), 0.0f);
#endif
}

}  // namespace
}  // namespace huddle::kernels
