// The figure that matters: a 784-128-10 MLP trained for one epoch on 6000 real Fashion-MNIST
// examples classifies the 10000 test images with accuracy > 0.75.
//
// The recipe is SGD with momentum 0.9, learning rate 0.02, batch 32. Measured over 10 IID shards
// and seeds it reaches 0.76-0.80 (mean 0.78) after this one epoch; plain SGD at the default
// learning rate 0.05 reaches only 0.64-0.74 (mean 0.70), too noisy for a fixed threshold.
#include <gtest/gtest.h>

#include <filesystem>

#include "data/fashion_mnist.h"
#include "data/partition.h"
#include "models/model.h"

namespace huddle::models {
namespace {

TEST(FashionMnistMlpTest, OneEpochOnSixThousandExamples) {
  if (!std::filesystem::exists(data::kDefaultFashionMnistDir)) {
    GTEST_SKIP() << data::kDefaultFashionMnistDir << " is not installed";
  }
  // One IID tenth of the training set, as one of 10 federated clients would hold.
  auto labels = data::LoadIdxLabels(
      data::FashionMnistFiles(data::kDefaultFashionMnistDir, data::Split::kTrain).labels);
  ASSERT_TRUE(labels.ok()) << labels.status();
  data::PartitionOptions partition;
  partition.num_shards = 10;
  partition.seed = 1;
  auto shards = data::Partition(*labels, 10, partition);
  ASSERT_TRUE(shards.ok()) << shards.status();
  auto train =
      data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTrain, &(*shards)[0]);
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_EQ(train->size(), 6000);
  auto test = data::LoadFashionMnist(data::kDefaultFashionMnistDir, data::Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();

  const MlpSpec spec;  // 784-128-10
  TensorList params = InitModel(spec, 42);
  TrainOptions options;  // 1 epoch, batch 32
  options.learning_rate = 0.02;
  options.momentum = 0.9;
  auto stats = TrainModel(spec, options, {&*train, {}}, 7, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->steps, 188);
  auto eval = EvaluateModel(spec, params, {&*test, {}});
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_GT(eval->accuracy, 0.75) << "loss " << eval->loss;
  RecordProperty("test_accuracy", std::to_string(eval->accuracy));
  RecordProperty("train_seconds", std::to_string(stats->seconds));
}

}  // namespace
}  // namespace huddle::models
