// LoadIdxLabels/LoadIdxDataset on small synthetic files, and the installed Fashion-MNIST.
#include "data/fashion_mnist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "tests/data/test_files.h"

namespace huddle::data {
namespace {

using test_files::IdxHeader;
using test_files::TempDir;
using test_files::WriteGzip;
using ::testing::HasSubstr;

// Writes a 4-image 2x3 dataset in Fashion-MNIST layout under dir: pixel j of image i is
// 10 * i + j, and label i is i % num_labels_mod.
void WriteTinySplit(const TempDir& dir, Split split, uint32_t num_images = 4,
                    uint32_t num_labels = 4, uint8_t label_mod = 10) {
  const IdxFilePair files = FashionMnistFiles(dir.path(), split);
  std::string images = IdxHeader({num_images, 2, 3});
  for (uint32_t i = 0; i < num_images; ++i) {
    for (uint32_t j = 0; j < 6; ++j) images.push_back(static_cast<char>(10 * i + j));
  }
  std::string labels = IdxHeader({num_labels});
  for (uint32_t i = 0; i < num_labels; ++i) labels.push_back(static_cast<char>(i % label_mod));
  WriteGzip(files.images, images);
  WriteGzip(files.labels, labels);
}

TEST(FashionMnistFilesTest, NamesTheReleaseFiles) {
  EXPECT_EQ(FashionMnistFiles("/d", Split::kTrain).images, "/d/train-images-idx3-ubyte.gz");
  EXPECT_EQ(FashionMnistFiles("/d", Split::kTrain).labels, "/d/train-labels-idx1-ubyte.gz");
  EXPECT_EQ(FashionMnistFiles("/d", Split::kTest).images, "/d/t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(FashionMnistFiles("/d", Split::kTest).labels, "/d/t10k-labels-idx1-ubyte.gz");
}

TEST(LoadIdxDatasetTest, ScalesPixelsAndKeepsLabels) {
  TempDir dir;
  WriteTinySplit(dir, Split::kTrain);
  auto dataset = LoadFashionMnist(dir.path(), Split::kTrain);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->size(), 4);
  EXPECT_EQ(dataset->feature_dim, 6);
  EXPECT_EQ(dataset->num_classes, 10);
  EXPECT_EQ(dataset->labels, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_FLOAT_EQ(dataset->row_features(2)[5], 25.0f / 255.0f);
  EXPECT_TRUE(ValidateDataset(*dataset).ok());
}

TEST(LoadIdxDatasetTest, SelectsRows) {
  TempDir dir;
  WriteTinySplit(dir, Split::kTest);
  const std::vector<int64_t> rows = {1, 3};
  auto dataset = LoadFashionMnist(dir.path(), Split::kTest, &rows);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->labels, (std::vector<int32_t>{1, 3}));
  EXPECT_FLOAT_EQ(dataset->row_features(0)[0], 10.0f / 255.0f);
  EXPECT_FLOAT_EQ(dataset->row_features(1)[0], 30.0f / 255.0f);
}

TEST(LoadIdxDatasetTest, RejectsCountMismatch) {
  TempDir dir;
  WriteTinySplit(dir, Split::kTrain, /*num_images=*/4, /*num_labels=*/5);
  auto dataset = LoadFashionMnist(dir.path(), Split::kTrain);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().message(), HasSubstr("holds 4 images but"));
  EXPECT_THAT(dataset.status().message(), HasSubstr("holds 5 labels"));
}

TEST(LoadIdxDatasetTest, RejectsLabelOutOfRange) {
  TempDir dir;
  WriteTinySplit(dir, Split::kTrain, 4, 4, /*label_mod=*/255);
  const IdxFilePair files = FashionMnistFiles(dir.path(), Split::kTrain);
  auto dataset = LoadIdxDataset(files.images, files.labels, nullptr, /*num_classes=*/3);
  EXPECT_THAT(dataset.status().message(), HasSubstr("item 3 has label 3, outside [0, 3)"));
}

TEST(LoadIdxDatasetTest, RejectsSwappedFiles) {
  TempDir dir;
  WriteTinySplit(dir, Split::kTrain);
  const IdxFilePair files = FashionMnistFiles(dir.path(), Split::kTrain);
  EXPECT_THAT(LoadIdxLabels(files.images).status().message(), HasSubstr("has rank 3"));
  EXPECT_FALSE(LoadIdxDataset(files.labels, files.images, nullptr).ok());
}

TEST(LoadIdxDatasetTest, MissingDirectoryIsNotFound) {
  auto dataset = LoadFashionMnist("/nonexistent/huddle", Split::kTrain);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
}

TEST(RealFashionMnistTest, LoadsBothSplits) {
  if (!std::filesystem::exists(kDefaultFashionMnistDir)) {
    GTEST_SKIP() << kDefaultFashionMnistDir << " is not installed";
  }
  for (const auto& [split, expected] : {std::pair{Split::kTrain, 60000}, {Split::kTest, 10000}}) {
    auto dataset = LoadFashionMnist(kDefaultFashionMnistDir, split);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    EXPECT_EQ(dataset->size(), expected);
    EXPECT_EQ(dataset->feature_dim, 784);
    EXPECT_TRUE(ValidateDataset(*dataset).ok());
    const auto [lo, hi] = std::minmax_element(dataset->features.begin(), dataset->features.end());
    EXPECT_EQ(*lo, 0.0f);
    EXPECT_EQ(*hi, 1.0f);
    // Fashion-MNIST is balanced: every class has a tenth of the examples.
    std::vector<int64_t> counts(10, 0);
    for (int32_t label : dataset->labels) ++counts[static_cast<size_t>(label)];
    for (int64_t count : counts) EXPECT_EQ(count, expected / 10);
  }
}

}  // namespace
}  // namespace huddle::data
