// LoadClientData: each client gets exactly its shard's rows, for IDX and CSV, and bad specs fail.
#include "data/client_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/data/test_files.h"

namespace huddle::data {
namespace {

using test_files::IdxHeader;
using test_files::TempDir;
using ::testing::HasSubstr;

constexpr uint32_t kRows = 200;

// Training split of kRows 1x2 images: image r's pixels are {r % 256, 7}; label r % 10.
void WriteTrainSplit(const TempDir& dir) {
  const IdxFilePair files = FashionMnistFiles(dir.path(), Split::kTrain);
  std::string images = IdxHeader({kRows, 1, 2});
  std::string labels = IdxHeader({kRows});
  for (uint32_t r = 0; r < kRows; ++r) {
    images.push_back(static_cast<char>(r % 256));
    images.push_back(7);
    labels.push_back(static_cast<char>(r % 10));
  }
  test_files::WriteGzip(files.images, images);
  test_files::WriteGzip(files.labels, labels);
}

DataSpec PartitionedSpec(const std::string& path, PartitionOptions::Kind kind, int64_t shard) {
  DataSpec spec;
  spec.path = path;
  spec.partitioned = true;
  spec.partition.kind = kind;
  spec.partition.num_shards = 4;
  spec.partition.seed = 9;
  spec.partition.alpha = 1.0;
  spec.partition.min_shard_size = 5;
  spec.shard = shard;
  return spec;
}

TEST(LoadClientDataTest, IdxShardHoldsExactlyItsRows) {
  TempDir dir;
  WriteTrainSplit(dir);
  std::vector<int32_t> all_labels(kRows);
  for (uint32_t r = 0; r < kRows; ++r) all_labels[r] = static_cast<int32_t>(r % 10);
  for (auto kind : {PartitionOptions::Kind::kIid, PartitionOptions::Kind::kDirichlet}) {
    const DataSpec first = PartitionedSpec(dir.path(), kind, 0);
    auto shards = Partition(all_labels, 10, first.partition);
    ASSERT_TRUE(shards.ok()) << shards.status();
    int64_t total = 0;
    for (int64_t s = 0; s < 4; ++s) {
      auto data = LoadClientData(PartitionedSpec(dir.path(), kind, s));
      ASSERT_TRUE(data.ok()) << data.status();
      const auto& rows = (*shards)[static_cast<size_t>(s)];
      ASSERT_EQ(data->size(), static_cast<int64_t>(rows.size()));
      for (size_t i = 0; i < rows.size(); ++i) {
        EXPECT_EQ(data->labels[i], rows[i] % 10);
        EXPECT_FLOAT_EQ(data->row_features(static_cast<int64_t>(i))[0],
                        static_cast<float>(rows[i]) / 255.0f);
      }
      total += data->size();
    }
    EXPECT_EQ(total, kRows);
  }
}

TEST(LoadClientDataTest, UnpartitionedIdxLoadsEverything) {
  TempDir dir;
  WriteTrainSplit(dir);
  DataSpec spec;
  spec.path = dir.path();
  auto data = LoadClientData(spec);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), kRows);
  EXPECT_EQ(data->feature_dim, 2);
}

TEST(LoadClientDataTest, CsvIsPartitionedByTheSameRules) {
  TempDir dir;
  const std::string path = dir.File("train.csv");
  std::string csv = "label,x\n";
  std::vector<int32_t> labels;
  for (int r = 0; r < 100; ++r) {
    csv += std::to_string(r % 3) + "," + std::to_string(r) + "\n";
    labels.push_back(r % 3);
  }
  test_files::WriteRaw(path, csv);
  DataSpec spec = PartitionedSpec(path, PartitionOptions::Kind::kIid, 3);
  spec.format = "csv";
  spec.num_classes = 3;
  auto data = LoadClientData(spec);
  ASSERT_TRUE(data.ok()) << data.status();
  auto shards = Partition(labels, 3, spec.partition);
  ASSERT_TRUE(shards.ok());
  ASSERT_EQ(data->size(), static_cast<int64_t>((*shards)[3].size()));
  for (size_t i = 0; i < (*shards)[3].size(); ++i) {
    EXPECT_EQ(data->features[i], static_cast<float>((*shards)[3][i]));
  }
  spec.partitioned = false;
  auto all = LoadClientData(spec);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 100);
}

TEST(LoadClientDataTest, RejectsBadSpecs) {
  TempDir dir;
  WriteTrainSplit(dir);
  DataSpec spec = PartitionedSpec(dir.path(), PartitionOptions::Kind::kIid, 4);
  EXPECT_THAT(LoadClientData(spec).status().message(), HasSubstr("shard 4 is outside [0, 4)"));
  spec.shard = -1;
  EXPECT_FALSE(LoadClientData(spec).ok());
  spec.shard = 0;
  spec.format = "parquet";
  EXPECT_THAT(LoadClientData(spec).status().message(), HasSubstr("'parquet' is unknown"));
  spec.format = "idx";
  spec.partition.min_shard_size = 1000;
  EXPECT_THAT(LoadClientData(spec).status().message(), HasSubstr("min_shard_size"));
  spec.path = dir.File("missing");
  EXPECT_EQ(LoadClientData(spec).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace huddle::data
