#include "aggregation/server_optimizer.h"

#include <cmath>

#include "gtest/gtest.h"

namespace huddle::aggregation {
namespace {

TensorList Model(std::vector<float> w, std::vector<float> b) {
  TensorList m;
  m.emplace_back("w", std::vector<int64_t>{2, 2});
  m.emplace_back("b", std::vector<int64_t>{2});
  m[0].data = std::move(w);
  m[1].data = std::move(b);
  return m;
}

TEST(ServerOptimizerTest, FedAvgAddsScaledDelta) {
  ServerOptimizer opt({.learning_rate = 0.5});
  TensorList model = Model({1, 2, 3, 4}, {10, 20});
  const TensorList delta = Model({2, -2, 0.5f, 0}, {1, -1});
  ASSERT_TRUE(opt.Apply(delta, &model).ok());
  EXPECT_EQ(model[0].data, (std::vector<float>{2, 1, 3.25f, 4}));
  EXPECT_EQ(model[1].data, (std::vector<float>{10.5f, 19.5f}));
  EXPECT_TRUE(opt.state().empty()) << "momentum 0 keeps no velocity";
}

TEST(ServerOptimizerTest, MomentumAccumulatesVelocity) {
  ServerOptimizer opt({.learning_rate = 0.5, .momentum = 0.5});
  TensorList model = Model({0, 0, 0, 0}, {0, 0});
  EXPECT_TRUE(opt.state().empty());
  ASSERT_TRUE(opt.Apply(Model({1, 2, 4, 8}, {1, 1}), &model).ok());
  // v = d1; w = 0.5 * d1
  EXPECT_EQ(opt.state()[0].data, (std::vector<float>{1, 2, 4, 8}));
  EXPECT_EQ(model[0].data, (std::vector<float>{0.5f, 1, 2, 4}));
  ASSERT_TRUE(opt.Apply(Model({1, 0, 0, -4}, {0, 2}), &model).ok());
  // v = 0.5 * d1 + d2; w += 0.5 * v
  EXPECT_EQ(opt.state()[0].data, (std::vector<float>{1.5f, 1, 2, 0}));
  EXPECT_EQ(opt.state()[1].data, (std::vector<float>{0.5f, 2.5f}));
  EXPECT_EQ(model[0].data, (std::vector<float>{1.25f, 1.5f, 3, 4}));
  EXPECT_EQ(model[1].data, (std::vector<float>{0.75f, 1.75f}));
  EXPECT_EQ(opt.state()[0].name(), "w");
  EXPECT_EQ(opt.state()[0].spec.shape, (std::vector<int64_t>{2, 2}));
}

TEST(ServerOptimizerTest, RestoredStateContinuesIdentically) {
  const ServerOptimizerOptions options{.learning_rate = 0.7, .momentum = 0.9};
  const std::vector<TensorList> deltas = {Model({0.1f, -0.3f, 0.2f, 1e-3f}, {0.5f, -0.25f}),
                                          Model({-0.2f, 0.1f, 0.7f, 3e-3f}, {0.1f, 0.3f}),
                                          Model({0.3f, 0.3f, -0.9f, 1e-4f}, {-0.6f, 0.2f})};
  ServerOptimizer a(options);
  TensorList model_a = Model({1, 2, 3, 4}, {5, 6});
  ASSERT_TRUE(a.Apply(deltas[0], &model_a).ok());
  ASSERT_TRUE(a.Apply(deltas[1], &model_a).ok());
  const TensorList checkpoint_model = model_a;
  const TensorList checkpoint_state = a.state();
  ASSERT_TRUE(a.Apply(deltas[2], &model_a).ok());

  ServerOptimizer b(options);
  ASSERT_TRUE(b.RestoreState(checkpoint_state).ok());
  TensorList model_b = checkpoint_model;
  ASSERT_TRUE(b.Apply(deltas[2], &model_b).ok());
  for (size_t t = 0; t < model_a.size(); ++t) {
    EXPECT_EQ(model_a[t].data, model_b[t].data);
    EXPECT_EQ(a.state()[t].data, b.state()[t].data);
  }
  // Restoring the empty state starts over from zero velocity.
  ASSERT_TRUE(b.RestoreState({}).ok());
  EXPECT_TRUE(b.state().empty());
}

TEST(ServerOptimizerTest, MismatchedDeltaLeavesModelUnchanged) {
  ServerOptimizer opt({.learning_rate = 1.0, .momentum = 0.9});
  const TensorList original = Model({1, 2, 3, 4}, {5, 6});
  TensorList model = original;

  TensorList fewer = Model({1, 1, 1, 1}, {1, 1});
  fewer.pop_back();
  Status st = opt.Apply(fewer, &model);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "delta has 1 tensors, the model has 2");

  TensorList reshaped = Model({1, 1, 1, 1}, {1, 1});
  reshaped[0].spec.shape = {4, 1};
  st = opt.Apply(reshaped, &model);
  EXPECT_EQ(st.message(), "delta tensor 0 is 'w' [4,1], the model has 'w' [2,2]");

  TensorList renamed = Model({1, 1, 1, 1}, {1, 1});
  renamed[1].spec.name = "bias";
  EXPECT_EQ(opt.Apply(renamed, &model).code(), absl::StatusCode::kInvalidArgument);

  TensorList truncated = Model({1, 1, 1}, {1, 1});
  EXPECT_EQ(opt.Apply(truncated, &model).code(), absl::StatusCode::kInvalidArgument);

  TensorList non_finite = Model({1, NAN, 1, 1}, {1, 1});
  st = opt.Apply(non_finite, &model);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 'w' element 1"), std::string::npos) << st;

  for (size_t t = 0; t < model.size(); ++t) EXPECT_EQ(model[t].data, original[t].data);
  EXPECT_TRUE(opt.state().empty());
}

TEST(ServerOptimizerTest, RejectsBadStateAndOptions) {
  ServerOptimizer fedavg({});
  EXPECT_EQ(fedavg.RestoreState(Model({0, 0, 0, 0}, {0, 0})).code(),
            absl::StatusCode::kInvalidArgument);

  ServerOptimizer momentum({.momentum = 0.5});
  EXPECT_EQ(momentum.RestoreState(Model({0, INFINITY, 0, 0}, {0, 0})).code(),
            absl::StatusCode::kInvalidArgument);
  // A velocity of another model's layout is caught at the next Apply; nothing changes.
  TensorList other;
  other.emplace_back("v", std::vector<int64_t>{3});
  ASSERT_TRUE(momentum.RestoreState(other).ok());
  TensorList model = Model({1, 2, 3, 4}, {5, 6});
  EXPECT_EQ(momentum.Apply(Model({1, 1, 1, 1}, {1, 1}), &model).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model[0].data, (std::vector<float>{1, 2, 3, 4}));

  for (ServerOptimizerOptions bad :
       {ServerOptimizerOptions{.learning_rate = 0}, ServerOptimizerOptions{.learning_rate = NAN},
        ServerOptimizerOptions{.momentum = 1.0}, ServerOptimizerOptions{.momentum = -0.1}}) {
    ServerOptimizer opt(bad);
    EXPECT_EQ(opt.Apply(Model({1, 1, 1, 1}, {1, 1}), &model).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(model[0].data, (std::vector<float>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace huddle::aggregation
