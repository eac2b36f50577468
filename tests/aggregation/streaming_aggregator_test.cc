#include "aggregation/streaming_aggregator.h"

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "common/rng.h"
#include "gtest/gtest.h"
#include "kernels/exact_sum.h"
#include "tests/aggregation/alloc_counter.h"
#include "tests/testing/tensors.h"

namespace huddle::aggregation {
namespace {

// 40000 + 37 + 1 parameters: the first tensor spans several of Fold's chunks.
ModelLayout TestLayout() {
  return {{"fc0.weight", DType::kFloat32, {40, 1000}},
          {"fc0.bias", DType::kFloat32, {37}},
          {"scale", DType::kFloat32, {}}};
}

struct Update {
  std::vector<std::vector<float>> values;
  int64_t weight = 1;
  std::vector<std::span<const float>> Spans() const {
    return std::vector<std::span<const float>>(values.begin(), values.end());
  }
};

// Values over many magnitudes (down to max_abs * 2^-24), both signs.
Update RandomUpdate(Rng& rng, const ModelLayout& layout, double max_abs, int64_t max_weight) {
  Update u;
  u.weight = 1 + static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(max_weight)));
  for (const TensorSpec& spec : layout) {
    std::vector<float> v(static_cast<size_t>(spec.NumElements()));
    for (float& x : v) {
      const double magnitude = std::ldexp(max_abs, -static_cast<int>(rng.UniformInt(25)));
      x = static_cast<float>((2 * rng.Uniform() - 1) * magnitude);
    }
    u.values.push_back(std::move(v));
  }
  return u;
}

// The specification, written plainly: exact integer sums of the rounded terms, then one division.
TensorList ExactReference(const ModelLayout& layout, const std::vector<Update>& updates, int s,
                          double divisor) {
  TensorList out;
  for (size_t t = 0; t < layout.size(); ++t) {
    out.emplace_back(layout[t].name, layout[t].shape);
    for (size_t i = 0; i < out[t].data.size(); ++i) {
      int64_t sum = 0;
      for (const Update& u : updates) {
        sum += kernels::FixedPointReference(u.values[t][i], std::ldexp(double(u.weight), s));
      }
      out[t].data[i] = static_cast<float>(static_cast<double>(sum) * std::ldexp(1.0, -s) / divisor);
    }
  }
  return out;
}

StreamingAggregator MakeAggregator(AggregatorOptions options = {}) {
  auto agg = StreamingAggregator::Create(TestLayout(), options);
  EXPECT_TRUE(agg.ok()) << agg.status();
  return std::move(agg).value();
}

TEST(StreamingAggregatorTest, FractionBitsFollowTheOptions) {
  EXPECT_EQ(MakeAggregator().fraction_bits(), 51 - 24 - 10);
  EXPECT_EQ(MakeAggregator({.max_weight = 1, .max_abs_value = 1.0}).fraction_bits(), 51);
  EXPECT_EQ(MakeAggregator({.max_weight = 1, .max_abs_value = 0.75}).fraction_bits(), 51);
  EXPECT_EQ(MakeAggregator({.max_weight = 1000, .max_abs_value = 4.5}).fraction_bits(),
            51 - 10 - 3);
  EXPECT_EQ(MakeAggregator({.max_weight = 1, .max_abs_value = 0.01}).fraction_bits(), 51 + 6);
}

TEST(StreamingAggregatorTest, CreateRejectsBadLayoutsAndOptions) {
  EXPECT_EQ(StreamingAggregator::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  auto zero_dim = StreamingAggregator::Create({{"w", DType::kFloat32, {3, 0}}});
  EXPECT_EQ(zero_dim.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero_dim.status().message().find("'w'"), std::string::npos) << zero_dim.status();
  for (AggregatorOptions bad :
       {AggregatorOptions{.max_weight = 0}, AggregatorOptions{.max_weight = -5},
        AggregatorOptions{.max_weight = (int64_t{1} << 53) + 1},
        AggregatorOptions{.max_abs_value = 0.0}, AggregatorOptions{.max_abs_value = -1.0},
        AggregatorOptions{.max_abs_value = NAN}, AggregatorOptions{.max_abs_value = INFINITY},
        AggregatorOptions{.max_abs_value = 1e-30},
        AggregatorOptions{.max_weight = int64_t{1} << 40, .max_abs_value = 1 << 20}}) {
    auto agg = StreamingAggregator::Create(TestLayout(), bad);
    EXPECT_EQ(agg.status().code(), absl::StatusCode::kInvalidArgument)
        << bad.max_weight << " " << bad.max_abs_value;
  }
}

TEST(StreamingAggregatorTest, MatchesExactAndDoubleReferences) {
  Rng rng(7);
  StreamingAggregator agg = MakeAggregator({.max_weight = 1000, .max_abs_value = 8.0});
  std::vector<Update> updates;
  for (int k = 0; k < 20; ++k) {
    updates.push_back(RandomUpdate(rng, agg.layout(), 8.0, 1000));
    ASSERT_TRUE(agg.Fold(updates.back().Spans(), updates.back().weight).ok());
  }
  int64_t total_weight = 0;
  for (const Update& u : updates) total_weight += u.weight;
  EXPECT_EQ(agg.count(), 20);
  EXPECT_EQ(agg.total_weight(), total_weight);

  TensorList mean;
  ASSERT_TRUE(agg.WeightedMean(&mean).ok());
  EXPECT_TRUE(testing::BitwiseEqual(mean, ExactReference(agg.layout(), updates, agg.fraction_bits(),
                                                         static_cast<double>(total_weight))));
  // Against plain double arithmetic: each term is within half a fixed-point step.
  const double step_error = 20 * std::ldexp(0.5, -agg.fraction_bits()) / total_weight;
  for (size_t t = 0; t < mean.size(); ++t) {
    EXPECT_EQ(mean[t].spec, agg.layout()[t]);
    for (size_t i = 0; i < mean[t].data.size(); ++i) {
      long double sum = 0;
      for (const Update& u : updates) sum += static_cast<long double>(u.values[t][i]) * u.weight;
      const double ref = static_cast<double>(sum / total_weight);
      ASSERT_NEAR(mean[t].data[i], ref, step_error + std::abs(ref) * 0x1p-23 + 1e-37)
          << mean[t].name() << "[" << i << "]";
    }
  }
}

TEST(StreamingAggregatorTest, AnyFoldOrderGivesIdenticalBits) {
  Rng rng(11);
  StreamingAggregator agg = MakeAggregator();
  std::vector<Update> updates;
  for (int k = 0; k < 50; ++k) updates.push_back(RandomUpdate(rng, agg.layout(), 1024.0, 1 << 24));
  std::vector<size_t> order(updates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;

  TensorList first;
  std::vector<float> first_naive;
  bool naive_differs = false;
  for (int permutation = 0; permutation < 12; ++permutation) {
    agg.Reset();
    if (permutation > 0) rng.Shuffle(order);
    for (size_t k : order) ASSERT_TRUE(agg.Fold(updates[k].Spans(), updates[k].weight).ok());
    TensorList mean;
    ASSERT_TRUE(agg.WeightedMean(&mean).ok());
    // The same sum in plain float arithmetic, to show that the order does matter there.
    std::vector<float> naive(updates[0].values[0].size());
    for (size_t k : order) {
      for (size_t i = 0; i < naive.size(); ++i) {
        naive[i] += static_cast<float>(updates[k].weight) * updates[k].values[0][i];
      }
    }
    if (permutation == 0) {
      first = mean;
      first_naive = naive;
    } else {
      EXPECT_TRUE(testing::BitwiseEqual(first, mean)) << "permutation " << permutation;
      naive_differs |= naive != first_naive;
    }
  }
  EXPECT_TRUE(naive_differs) << "the test inputs should make a plain float sum order-dependent";
}

// Fold's chunk (kChunk in streaming_aggregator.cc): values in one chunk share a path.
constexpr size_t kFoldChunk = 16384;

// An update whose chunks are each either small (terms below 2^26 at 16 fraction bits and weights
// up to 255: the int32 partial sums, full after ~32 folds) or large (up to 1024: the int64 sums).
Update MixedUpdate(Rng& rng, const ModelLayout& layout) {
  Update u;
  u.weight = 1 + static_cast<int64_t>(rng.UniformInt(255));
  for (const TensorSpec& spec : layout) {
    std::vector<float> v(static_cast<size_t>(spec.NumElements()));
    for (size_t begin = 0; begin < v.size(); begin += kFoldChunk) {
      const double max_abs = rng.UniformInt(4) == 0 ? 1024.0 : 4.0;
      for (size_t i = begin; i < std::min(v.size(), begin + kFoldChunk); ++i) {
        const double magnitude = std::ldexp(max_abs, -static_cast<int>(rng.UniformInt(25)));
        v[i] = static_cast<float>((2 * rng.Uniform() - 1) * magnitude);
      }
    }
    u.values.push_back(std::move(v));
  }
  return u;
}

// Every path a term can take (the int32 partial sums, emptying them into the int64 sums when full,
// the int64 sums directly), chunk by chunk within one update: the sum is still exact, and still
// independent of the order.
TEST(StreamingAggregatorTest, PartialSumsAndWideSumsGiveTheExactSum) {
  Rng rng(23);
  StreamingAggregator agg =
      MakeAggregator({.max_weight = 255, .max_abs_value = 1024.0, .fraction_bits = 16});
  std::vector<Update> updates;
  for (int k = 0; k < 120; ++k) updates.push_back(MixedUpdate(rng, agg.layout()));
  std::vector<size_t> order(updates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  int64_t total_weight = 0;
  for (const Update& u : updates) total_weight += u.weight;
  const TensorList want =
      ExactReference(agg.layout(), updates, 16, static_cast<double>(total_weight));
  for (int permutation = 0; permutation < 3; ++permutation) {
    agg.Reset();
    if (permutation > 0) rng.Shuffle(order);
    for (size_t k : order) ASSERT_TRUE(agg.Fold(updates[k].Spans(), updates[k].weight).ok());
    TensorList mean;
    ASSERT_TRUE(agg.WeightedMean(&mean).ok());
    EXPECT_TRUE(testing::BitwiseEqual(mean, want)) << "permutation " << permutation;
  }
}

// A rejected update whose earlier chunks went to the int32 partial sums: the rollback restores
// every sum, and later folds (which may then empty the partial sums) stay exact.
TEST(StreamingAggregatorTest, RollbackAfterPartialSumsRestoresTheSums) {
  Rng rng(29);
  StreamingAggregator agg =
      MakeAggregator({.max_weight = 255, .max_abs_value = 1024.0, .fraction_bits = 16});
  const Update good = MixedUpdate(rng, agg.layout());
  ASSERT_TRUE(agg.Fold(good.Spans(), good.weight).ok());
  TensorList before;
  ASSERT_TRUE(agg.Finalize(1.0, &before).ok());
  for (int k = 0; k < 60; ++k) {
    Update bad = MixedUpdate(rng, agg.layout());
    bad.values[k % 2 == 0 ? 1 : 0][k % 2 == 0 ? 5 : 2 * kFoldChunk + 7] = NAN;
    ASSERT_EQ(agg.Fold(bad.Spans(), bad.weight).code(), absl::StatusCode::kInvalidArgument);
    TensorList after;
    ASSERT_TRUE(agg.Finalize(1.0, &after).ok());
    ASSERT_TRUE(testing::BitwiseEqual(before, after)) << "rejection " << k;
  }
  Update negated = good;
  for (auto& v : negated.values) {
    for (float& x : v) x = -x;
  }
  for (int k = 0; k < 40; ++k) {  // enough to fill and empty the partial sums again
    ASSERT_TRUE(agg.Fold(good.Spans(), good.weight).ok());
    ASSERT_TRUE(agg.Fold(negated.Spans(), negated.weight).ok());
  }
  ASSERT_TRUE(agg.Fold(negated.Spans(), negated.weight).ok());
  TensorList zero;
  ASSERT_TRUE(agg.Finalize(1.0, &zero).ok());
  for (const Tensor& t : zero) {
    for (float x : t.data) ASSERT_EQ(x, 0.0f) << t.name();
  }
}

struct BadValueCase {
  const char* where;
  size_t tensor;
  size_t index;
};

TEST(StreamingAggregatorTest, RejectedValueLeavesStateBitwiseUnchanged) {
  Rng rng(3);
  StreamingAggregator agg = MakeAggregator();
  const Update good = RandomUpdate(rng, agg.layout(), 1024.0, 1000);
  ASSERT_TRUE(agg.Fold(good.Spans(), good.weight).ok());
  TensorList before;
  ASSERT_TRUE(agg.Finalize(1.0, &before).ok());

  const BadValueCase cases[] = {{"start", 0, 0},
                                {"middle of a later chunk", 0, 20000},
                                {"second tensor", 1, 18},
                                {"end", 2, 0}};
  const float bad_values[] = {NAN, INFINITY, -INFINITY, 1024.5f, -3.2e5f};
  for (const BadValueCase& c : cases) {
    for (float bad : bad_values) {
      Update u = RandomUpdate(rng, agg.layout(), 1024.0, 1000);
      u.values[c.tensor][c.index] = bad;
      const Status st = agg.Fold(u.Spans(), u.weight);
      ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.where << " " << bad;
      const std::string name = agg.layout()[c.tensor].name;
      EXPECT_NE(st.message().find(absl::StrCat("tensor '", name, "' element ", c.index, " is ")),
                std::string::npos)
          << st;
      EXPECT_EQ(agg.count(), 1);
      EXPECT_EQ(agg.total_weight(), good.weight);
      TensorList after;
      ASSERT_TRUE(agg.Finalize(1.0, &after).ok());
      ASSERT_TRUE(testing::BitwiseEqual(before, after)) << c.where << " " << bad;
    }
  }
  // Exactness below float resolution: folding the negated update must cancel to exact zeros.
  Update negated = good;
  for (auto& v : negated.values) {
    for (float& x : v) x = -x;
  }
  ASSERT_TRUE(agg.Fold(negated.Spans(), negated.weight).ok());
  TensorList zero;
  ASSERT_TRUE(agg.Finalize(1.0, &zero).ok());
  for (const Tensor& t : zero) {
    for (float x : t.data) ASSERT_EQ(x, 0.0f) << t.name();
  }
}

TEST(StreamingAggregatorTest, ErrorMessagesNameTheValue) {
  StreamingAggregator agg = MakeAggregator();
  Update u{{std::vector<float>(40000), std::vector<float>(37), std::vector<float>(1)}, 1};
  u.values[0][1234] = NAN;
  EXPECT_EQ(agg.Fold(u.Spans(), 1).message(), "tensor 'fc0.weight' element 1234 is NaN");
  u.values[0][1234] = 0;
  u.values[1][5] = 2048.0f;
  EXPECT_EQ(agg.Fold(u.Spans(), 1).message(),
            "tensor 'fc0.bias' element 5 is 2048, above the bound 1024 (max_abs_value)");
  u.values[1][5] = -INFINITY;
  EXPECT_EQ(agg.Fold(u.Spans(), 1).message(), "tensor 'fc0.bias' element 5 is -inf");
  u.values[1][5] = 1024.0f;  // the bound itself is accepted
  u.values[2][0] = -1024.0f;
  EXPECT_TRUE(agg.Fold(u.Spans(), 1).ok());
}

TEST(StreamingAggregatorTest, RejectsWrongTensorCountAndSizes) {
  StreamingAggregator agg = MakeAggregator();
  std::vector<float> a(40000), b(37), c(1), short_b(36);
  std::vector<std::span<const float>> two = {a, b};
  Status st = agg.Fold(two, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "update has 2 tensors, the layout expects 3");
  std::vector<std::span<const float>> wrong = {a, short_b, c};
  st = agg.Fold(wrong, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "tensor 1 ('fc0.bias') has 36 values, the layout expects 37 (shape [37])");
  EXPECT_EQ(agg.count(), 0);
}

TEST(StreamingAggregatorTest, RejectsWeightsOutOfRange) {
  StreamingAggregator agg = MakeAggregator({.max_weight = 100});
  std::vector<float> a(40000, 1.0f), b(37), c(1);
  std::vector<std::span<const float>> update = {a, b, c};
  for (int64_t w : {int64_t{0}, int64_t{-1}, int64_t{101}, INT64_MIN}) {
    const Status st = agg.Fold(update, w);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << w;
    EXPECT_NE(st.message().find("[1, 100] (max_weight)"), std::string::npos) << st;
  }
  EXPECT_EQ(agg.count(), 0);
  EXPECT_TRUE(agg.Fold(update, 100).ok());
  EXPECT_EQ(agg.total_weight(), 100);
}

TEST(StreamingAggregatorTest, RefusesFoldsPastTheOverflowBound) {
  // S = 51 - 20 - 31 = 0 and each fold at max weight may add up to 2^51: room for 2^11 folds.
  const AggregatorOptions options{.max_weight = 1 << 20, .max_abs_value = 2147483648.0};
  auto created = StreamingAggregator::Create({{"x", DType::kFloat32, {2}}}, options);
  ASSERT_TRUE(created.ok()) << created.status();
  StreamingAggregator agg = std::move(created).value();
  ASSERT_EQ(agg.fraction_bits(), 0);
  const std::vector<float> extreme = {2147483648.0f, -2147483648.0f};
  const std::vector<std::span<const float>> update = {extreme};
  for (int k = 0; k < 2048; ++k) ASSERT_TRUE(agg.Fold(update, 1 << 20).ok()) << k;
  const Status st = agg.Fold(update, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(agg.count(), 2048);
  // The sums reached exactly +-2^62 without overflowing.
  TensorList mean;
  ASSERT_TRUE(agg.WeightedMean(&mean).ok());
  EXPECT_EQ(mean[0].data, extreme);
}

TEST(StreamingAggregatorTest, ResetReusesBuffersAndFoldDoesNotAllocate) {
  Rng rng(5);
  StreamingAggregator agg = MakeAggregator();
  const Update u1 = RandomUpdate(rng, agg.layout(), 1024.0, 1 << 24);
  const Update u2 = RandomUpdate(rng, agg.layout(), 1024.0, 1 << 24);
  const auto s1 = u1.Spans();
  const auto s2 = u2.Spans();
  ASSERT_TRUE(agg.Fold(s1, u1.weight).ok());
  TensorList mean;
  ASSERT_TRUE(agg.WeightedMean(&mean).ok());
  const float* out_data = mean[0].data.data();

  const int64_t allocations = testing_util::AllocationCount();
  agg.Reset();
  EXPECT_EQ(agg.count(), 0);
  EXPECT_EQ(agg.total_weight(), 0);
  ASSERT_TRUE(agg.Fold(s2, u2.weight).ok());
  ASSERT_TRUE(agg.Fold(s1, u1.weight).ok());
  ASSERT_TRUE(agg.WeightedMean(&mean).ok());  // reuses mean's buffers
  EXPECT_EQ(testing_util::AllocationCount(), allocations);
  EXPECT_EQ(mean[0].data.data(), out_data);

  auto fresh = MakeAggregator();
  ASSERT_TRUE(fresh.Fold(s1, u1.weight).ok());
  ASSERT_TRUE(fresh.Fold(s2, u2.weight).ok());
  TensorList fresh_mean;
  ASSERT_TRUE(fresh.WeightedMean(&fresh_mean).ok());
  EXPECT_TRUE(testing::BitwiseEqual(mean, fresh_mean));

  agg.Reset();
  EXPECT_EQ(agg.WeightedMean(&mean).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(agg.Finalize(3.0, &mean).ok());
  for (const Tensor& t : mean) {
    for (float x : t.data) ASSERT_EQ(x, 0.0f);
  }
}

TEST(StreamingAggregatorTest, FinalizeChecksTheDivisorAndTheFloatRange) {
  StreamingAggregator agg = MakeAggregator();
  TensorList out;
  for (double bad : {0.0, -1.0, double(NAN), double(INFINITY)}) {
    EXPECT_EQ(agg.Finalize(bad, &out).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  std::vector<float> a(40000), b(37), c(1, 1000.0f);
  const std::vector<std::span<const float>> update = {a, b, c};
  ASSERT_TRUE(agg.Fold(update, 1 << 24).ok());
  ASSERT_TRUE(agg.Finalize(4.0, &out).ok());
  EXPECT_EQ(out[2].data[0], 1000.0f * (1 << 24) / 4);
  const Status st = agg.Finalize(1e-30, &out);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("tensor 'scale' element 0"), std::string::npos) << st;
}

TEST(StreamingAggregatorTest, ExplicitFractionBitsAndResetWithNewOptions) {
  auto agg = StreamingAggregator::Create(
      TestLayout(), {.max_weight = 1, .max_abs_value = 1.0, .fraction_bits = 20});
  ASSERT_TRUE(agg.ok()) << agg.status();
  EXPECT_EQ(agg->fraction_bits(), 20);
  auto too_many = StreamingAggregator::Create(
      TestLayout(), {.max_weight = 1, .max_abs_value = 1.0, .fraction_bits = 52});
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  // A grid of 2^-20: 0.3 rounds to the nearest multiple, exactly as the reference says.
  std::vector<std::vector<float>> values;
  for (const TensorSpec& spec : agg->layout()) {
    values.emplace_back(static_cast<size_t>(spec.NumElements()), 0.3f);
  }
  std::vector<std::span<const float>> spans(values.begin(), values.end());
  ASSERT_TRUE(agg->Fold(spans, 1).ok());
  TensorList out;
  ASSERT_TRUE(agg->Finalize(1.0, &out).ok());
  EXPECT_EQ(out[2].data[0], static_cast<float>(std::nearbyint(0.3f * 1048576.0) / 1048576.0));
  // Reset with other options keeps the layout and empties the sums; bad options change nothing.
  EXPECT_FALSE(agg->Reset({.max_weight = 1, .max_abs_value = 1.0, .fraction_bits = 60}).ok());
  EXPECT_EQ(agg->count(), 1);
  EXPECT_EQ(agg->fraction_bits(), 20);
  ASSERT_TRUE(agg->Reset({.max_weight = 4, .max_abs_value = 2.0}).ok());
  EXPECT_EQ(agg->count(), 0);
  EXPECT_EQ(agg->fraction_bits(), 51 - 2 - 1);
}

TEST(StreamingAggregatorTest, AddUnitsJoinsTheExactSum) {
  auto agg = StreamingAggregator::Create(
      TestLayout(), {.max_weight = 1, .max_abs_value = 1.0, .fraction_bits = 10});
  ASSERT_TRUE(agg.ok());
  ASSERT_EQ(agg->size(), 40000u + 37u + 1u);
  std::vector<int64_t> units = {5, -3, 1024};
  ASSERT_TRUE(agg->AddUnits(40000 + 35, units).ok());  // fc0.bias[35], fc0.bias[36], scale
  TensorList out;
  ASSERT_TRUE(agg->Finalize(1.0, &out).ok());
  EXPECT_EQ(out[1].data[35], 5.0f / 1024);
  EXPECT_EQ(out[1].data[36], -3.0f / 1024);
  EXPECT_EQ(out[2].data[0], 1.0f);
  EXPECT_FALSE(agg->AddUnits(agg->size() - 1, units).ok()) << "range past the layout";
  EXPECT_FALSE(agg->AddUnits(agg->size() + 1, {}).ok());
  // Noise can be negative and large; the capacity bound still refuses what could overflow.
  std::vector<int64_t> huge = {int64_t{1} << 62};
  EXPECT_EQ(agg->AddUnits(0, huge).code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace huddle::aggregation
