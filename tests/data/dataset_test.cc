#include "data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace huddle::data {
namespace {

using ::testing::HasSubstr;

// 3 rows of 2 features: row r is {r, 10 + r}, label r.
Dataset ThreeRows() {
  Dataset d;
  d.feature_dim = 2;
  d.num_classes = 3;
  d.features = {0, 10, 1, 11, 2, 12};
  d.labels = {0, 1, 2};
  return d;
}

TEST(DatasetViewTest, EmptyIndicesMeanAllRows) {
  const Dataset d = ThreeRows();
  DatasetView all{&d, {}};
  EXPECT_EQ(all.size(), 3);
  EXPECT_EQ(all.row(2), 2);
  DatasetView some{&d, {2, 0}};
  EXPECT_EQ(some.size(), 2);
  EXPECT_EQ(some.row(0), 2);
  EXPECT_EQ(some.row(1), 0);
  EXPECT_EQ(DatasetView{}.size(), 0);
}

TEST(DatasetTest, ValidateAcceptsConsistentDataset) {
  EXPECT_TRUE(ValidateDataset(ThreeRows()).ok());
}

TEST(DatasetTest, ValidateNamesTheProblem) {
  Dataset d = ThreeRows();
  d.labels[1] = 3;
  EXPECT_THAT(ValidateDataset(d).message(), HasSubstr("row 1 has label 3, outside [0, 3)"));
  d = ThreeRows();
  d.features.pop_back();
  EXPECT_THAT(ValidateDataset(d).message(), HasSubstr("need 6 values, but there are 5"));
  d = ThreeRows();
  d.feature_dim = 0;
  EXPECT_FALSE(ValidateDataset(d).ok());
}

TEST(DatasetTest, ValidateView) {
  const Dataset d = ThreeRows();
  EXPECT_TRUE(ValidateView({&d, {0, 2}}).ok());
  EXPECT_THAT(ValidateView({&d, {0, 3}}).message(), HasSubstr("row 3, outside [0, 3)"));
  EXPECT_FALSE(ValidateView({&d, {-1}}).ok());
  EXPECT_FALSE(ValidateView({nullptr, {}}).ok());
}

TEST(DatasetTest, SelectRowsCopiesInOrder) {
  const Dataset d = ThreeRows();
  const std::vector<int64_t> rows = {2, 0};
  auto selected = SelectRows(d, rows);
  ASSERT_TRUE(selected.ok()) << selected.status();
  EXPECT_EQ(selected->labels, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(selected->features, (std::vector<float>{2, 12, 0, 10}));
  EXPECT_EQ(selected->num_classes, 3);
  const std::vector<int64_t> bad = {5};
  EXPECT_FALSE(SelectRows(d, bad).ok());
}

}  // namespace
}  // namespace huddle::data
