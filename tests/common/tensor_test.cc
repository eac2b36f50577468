#include "common/tensor.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace huddle {
namespace {

TEST(TensorTest, SpecsAndLayouts) {
  Tensor t("fc1.w", {128, 64});
  EXPECT_EQ(t.NumElements(), 128 * 64);
  EXPECT_EQ(t.spec.NumElements(), 128 * 64);
  EXPECT_EQ(t.spec.ByteLength(), 128 * 64 * 4);
  EXPECT_TRUE(std::all_of(t.data.begin(), t.data.end(), [](float x) { return x == 0; }));
  EXPECT_EQ(TensorSpec{}.NumElements(), 1) << "a scalar has one element";
  EXPECT_EQ(ShapeString(t.spec.shape), "[128,64]");
  EXPECT_EQ(ShapeString({}), "[]");
  EXPECT_STREQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);

  TensorList list;
  list.push_back(t);
  list.emplace_back("fc1.b", std::vector<int64_t>{64});
  const ModelLayout layout = LayoutOf(list);
  ASSERT_EQ(layout.size(), 2u);
  EXPECT_EQ(layout[1].name, "fc1.b");
  EXPECT_EQ(TotalElements(layout), 128 * 64 + 64);
}

TEST(ValidateShapeTest, AcceptsValidShapes) {
  EXPECT_TRUE(ValidateShape({}, 1, "scalar").ok());
  const std::vector<int64_t> exact = {10, 10};
  EXPECT_TRUE(ValidateShape(exact, 100, "t").ok()) << "the limit is inclusive";
  const std::vector<int64_t> rank8(8, 2);
  EXPECT_TRUE(ValidateShape(rank8, 256, "t").ok());
}

TEST(ValidateShapeTest, RejectsBadShapesNamingTheTensor) {
  const std::vector<int64_t> zero = {3, 0}, negative = {-1, 4}, too_many = {10, 11}, rank9(9, 1);
  Status st = ValidateShape(zero, 1000, "tensor 'w'");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "tensor 'w': shape [3,0] has a dimension < 1");
  EXPECT_EQ(ValidateShape(negative, 1000, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateShape(too_many, 100, "x").message(),
            "x: shape [10,11] exceeds the limit of 100 elements");
  EXPECT_EQ(ValidateShape(rank9, 1000, "x").message(), "x: rank 9 exceeds the maximum of 8");
}

TEST(ValidateShapeTest, DoesNotOverflowOnHugeDimensions) {
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  const std::vector<int64_t> huge = {big, big, big};
  EXPECT_EQ(ValidateShape(huge, std::numeric_limits<int64_t>::max(), "x").code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> wraps_to_small = {int64_t{1} << 32, int64_t{1} << 32, 4};
  EXPECT_FALSE(ValidateShape(wraps_to_small, int64_t{1} << 40, "x").ok());
}

TEST(FirstNonFiniteTest, FindsTheFirstBadValueAtAnyPosition) {
  EXPECT_EQ(FirstNonFinite({}), -1);
  std::vector<float> v(5000, 1.0f);
  v[10] = FLT_MAX;
  v[11] = -FLT_MAX;
  v[12] = FLT_MIN / 4;  // subnormal is finite
  EXPECT_EQ(FirstNonFinite(v), -1);
  for (size_t pos : {size_t{0}, size_t{1023}, size_t{1024}, size_t{1025}, size_t{4999}}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> w = v;
      w[pos] = bad;
      if (pos + 7 < w.size()) w[pos + 7] = NAN;  // only the first one counts
      EXPECT_EQ(FirstNonFinite(w), static_cast<int64_t>(pos)) << pos << " " << bad;
    }
  }
}

}  // namespace
}  // namespace huddle
