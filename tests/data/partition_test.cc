// Partition: determinism, disjoint cover, IID balance, Dirichlet skew, and its errors.
#include "data/partition.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace huddle::data {
namespace {

using ::testing::HasSubstr;
using Shards = std::vector<std::vector<int64_t>>;

// n rows with labels 0..num_classes-1 cycling (balanced classes).
std::vector<int32_t> CyclicLabels(int64_t n, int32_t num_classes) {
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>(i % num_classes);
  return labels;
}

PartitionOptions Options(PartitionOptions::Kind kind, int64_t shards, uint64_t seed,
                         double alpha = 0.5) {
  PartitionOptions options;
  options.kind = kind;
  options.num_shards = shards;
  options.seed = seed;
  options.alpha = alpha;
  return options;
}

Shards MustPartition(const std::vector<int32_t>& labels, const PartitionOptions& options) {
  auto shards = Partition(labels, 10, options);
  EXPECT_TRUE(shards.ok()) << shards.status();
  return shards.ok() ? *std::move(shards) : Shards{};
}

void ExpectDisjointSortedCover(const Shards& shards, int64_t n) {
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (const auto& shard : shards) {
    EXPECT_TRUE(std::is_sorted(shard.begin(), shard.end()));
    for (int64_t r : shard) {
      ASSERT_GE(r, 0);
      ASSERT_LT(r, n);
      ++seen[static_cast<size_t>(r)];
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

// Mean over shards of the largest class's share of the shard: 0.1 for perfectly mixed shards of
// 10 classes, 1.0 when every shard holds a single class.
double MeanDominantShare(const Shards& shards, const std::vector<int32_t>& labels) {
  double total = 0.0;
  for (const auto& shard : shards) {
    std::vector<int64_t> counts(10, 0);
    for (int64_t r : shard) ++counts[static_cast<size_t>(labels[r])];
    total += static_cast<double>(*std::max_element(counts.begin(), counts.end())) /
             static_cast<double>(shard.size());
  }
  return total / static_cast<double>(shards.size());
}

class PartitionKindTest : public ::testing::TestWithParam<PartitionOptions::Kind> {};

TEST_P(PartitionKindTest, DeterministicDisjointAndCovering) {
  const auto labels = CyclicLabels(5000, 10);
  const Shards a = MustPartition(labels, Options(GetParam(), 7, 42));
  const Shards b = MustPartition(labels, Options(GetParam(), 7, 42));
  const Shards c = MustPartition(labels, Options(GetParam(), 7, 43));
  ASSERT_EQ(a.size(), 7u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  ExpectDisjointSortedCover(a, 5000);
  ExpectDisjointSortedCover(c, 5000);
}

TEST_P(PartitionKindTest, SingleShardTakesEverything) {
  const auto labels = CyclicLabels(100, 10);
  const Shards shards = MustPartition(labels, Options(GetParam(), 1, 3));
  ASSERT_EQ(shards.size(), 1u);
  EXPECT_EQ(shards[0].size(), 100u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, PartitionKindTest,
                         ::testing::Values(PartitionOptions::Kind::kIid,
                                           PartitionOptions::Kind::kDirichlet));

TEST(PartitionTest, IidDealsEvenly) {
  const auto labels = CyclicLabels(1003, 10);
  const Shards shards = MustPartition(labels, Options(PartitionOptions::Kind::kIid, 10, 1));
  for (const auto& shard : shards) {
    EXPECT_GE(shard.size(), 100u);
    EXPECT_LE(shard.size(), 101u);
  }
  EXPECT_LT(MeanDominantShare(shards, labels), 0.2);
}

TEST(PartitionTest, DirichletSmallAlphaIsSkewed) {
  const auto labels = CyclicLabels(60000, 10);
  const Shards shards =
      MustPartition(labels, Options(PartitionOptions::Kind::kDirichlet, 20, 7, /*alpha=*/0.1));
  ExpectDisjointSortedCover(shards, 60000);
  EXPECT_GT(MeanDominantShare(shards, labels), 0.5);
  for (const auto& shard : shards) EXPECT_GE(shard.size(), 10u);
}

TEST(PartitionTest, DirichletLargeAlphaIsNearUniform) {
  const auto labels = CyclicLabels(60000, 10);
  const Shards shards =
      MustPartition(labels, Options(PartitionOptions::Kind::kDirichlet, 10, 7, /*alpha=*/1000));
  EXPECT_LT(MeanDominantShare(shards, labels), 0.12);
  for (const auto& shard : shards) EXPECT_NEAR(static_cast<double>(shard.size()), 6000, 300);
}

TEST(PartitionTest, DirichletTinyAlphaStillCovers) {
  // Every Gamma draw may underflow; the partition must still be a valid cover.
  const auto labels = CyclicLabels(2000, 10);
  PartitionOptions options = Options(PartitionOptions::Kind::kDirichlet, 4, 5, /*alpha=*/1e-4);
  options.min_shard_size = 0;
  ExpectDisjointSortedCover(MustPartition(labels, options), 2000);
}

TEST(PartitionTest, MinShardSizeErrors) {
  const auto labels = CyclicLabels(100, 10);
  PartitionOptions iid = Options(PartitionOptions::Kind::kIid, 20, 1);
  EXPECT_THAT(Partition(labels, 10, iid).status().message(),
              HasSubstr("give 5 rows to the smallest, below min_shard_size 10"));
  PartitionOptions dirichlet = Options(PartitionOptions::Kind::kDirichlet, 10, 1, 0.05);
  dirichlet.min_shard_size = 10;  // needs an exactly even split: essentially impossible
  auto result = Partition(labels, 10, dirichlet);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("100 attempts"));
}

TEST(PartitionTest, RejectsBadInputs) {
  const auto labels = CyclicLabels(100, 10);
  EXPECT_FALSE(Partition(labels, 10, Options(PartitionOptions::Kind::kIid, 0, 1)).ok());
  EXPECT_FALSE(Partition(labels, 10, Options(PartitionOptions::Kind::kIid, 101, 1)).ok());
  EXPECT_FALSE(Partition({}, 10, Options(PartitionOptions::Kind::kIid, 1, 1)).ok());
  EXPECT_FALSE(Partition(labels, 10, Options(PartitionOptions::Kind::kDirichlet, 2, 1, 0)).ok());
  EXPECT_FALSE(Partition(labels, 10, Options(PartitionOptions::Kind::kDirichlet, 2, 1, NAN)).ok());
  EXPECT_THAT(Partition(labels, 5, Options(PartitionOptions::Kind::kIid, 2, 1)).status().message(),
              HasSubstr("row 5 has label 5, outside [0, 5)"));
  PartitionOptions negative_min = Options(PartitionOptions::Kind::kIid, 2, 1);
  negative_min.min_shard_size = -1;
  EXPECT_FALSE(Partition(labels, 10, negative_min).ok());
}

TEST(PartitionKindNameTest, ParsesAndNames) {
  EXPECT_EQ(*ParsePartitionKind("iid"), PartitionOptions::Kind::kIid);
  EXPECT_EQ(*ParsePartitionKind("dirichlet"), PartitionOptions::Kind::kDirichlet);
  EXPECT_THAT(ParsePartitionKind("IID").status().message(), HasSubstr("unknown partition kind"));
  EXPECT_STREQ(PartitionKindName(PartitionOptions::Kind::kDirichlet), "dirichlet");
}

}  // namespace
}  // namespace huddle::data
