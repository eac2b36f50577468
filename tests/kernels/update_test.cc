// The update pipeline's CPU reference (kernels/update.h): the delta, the clipping guarantee, the
// norm's order; device-request parsing and the CPU backend.
#include "kernels/update.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "common/rng.h"
#include "kernels/backend.h"
#include "privacy/clip.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::RandomVector;
using ::testing::HasSubstr;

struct Pipeline {
  std::vector<float> values;
  UpdatePipelineStats stats;
};

Pipeline RunPipeline(const UpdatePipelineParams& p, const std::vector<float>& local,
                     const std::vector<float>& global) {
  Pipeline out;
  out.values.assign(local.size(), -1.0f);
  std::vector<double> scratch(kUpdatePipelineScratch);
  UpdatePipeline(p, local.data(), global.data(), static_cast<int64_t>(local.size()),
                 out.values.data(), scratch.data(), &out.stats);
  return out;
}

TEST(UpdatePipelineTest, WithoutClipItIsTheDelta) {
  Rng rng(1);
  const auto local = RandomVector(rng, 1000), global = RandomVector(rng, 1000);
  const Pipeline out = RunPipeline({}, local, global);
  for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(out.values[i], local[i] - global[i]) << i;
  EXPECT_EQ(out.stats.scale, 1.0);
  double squared = 0;
  for (size_t i = 0; i < local.size(); ++i) {
    const double d = local[i] - global[i];
    squared += d * d;
  }
  EXPECT_NEAR(out.stats.norm, std::sqrt(squared), 1e-12 * std::sqrt(squared));
}

TEST(UpdatePipelineTest, ClippedOutputNeverExceedsTheClipNormAsPrivacyMeasuresIt) {
  for (int64_t n : {1, 7, 4096, 100003}) {
    Rng rng(DeriveSeed(2, static_cast<uint64_t>(n)));
    const auto local = RandomVector(rng, n, -3, 3), global = RandomVector(rng, n, -1, 1);
    UpdatePipelineParams p;
    p.clip_norm = 0.5;
    const Pipeline out = RunPipeline(p, local, global);
    EXPECT_GT(out.stats.norm, p.clip_norm);
    EXPECT_LT(out.stats.scale, 1.0);
    const std::span<const float> spans[] = {out.values};
    const double norm = privacy::L2Norm(spans);
    EXPECT_LE(norm, p.clip_norm) << n;
    EXPECT_GT(norm, p.clip_norm * (1 - 1e-5)) << n;
  }
}

TEST(UpdatePipelineTest, SmallUpdatesAreNotScaled) {
  const std::vector<float> local = {0.1f, 0.2f}, global = {0, 0};
  UpdatePipelineParams p;
  p.clip_norm = 1.0;
  const Pipeline out = RunPipeline(p, local, global);
  EXPECT_EQ(out.stats.scale, 1.0);
  EXPECT_EQ(out.values, local);
}

TEST(UpdatePipelineTest, NonFiniteDeltaReportsNaNNormAndScaleZero) {
  std::vector<float> local = {1, 2, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<float> global = {0, 0, 0};
  UpdatePipelineParams p;
  p.clip_norm = 1;
  const Pipeline out = RunPipeline(p, local, global);
  EXPECT_TRUE(std::isnan(out.stats.norm));
  EXPECT_EQ(out.stats.scale, 0.0);
}

TEST(UpdatePipelineTest, TheNormIsAccurate) {
  Rng rng(8);
  auto x = RandomVector(rng, 123457);
  long double exact = 0;
  for (float v : x) exact += static_cast<long double>(v) * v;
  const std::span<float> pieces[] = {x};
  UpdatePipelineStats stats;
  ClipInPlace({}, pieces, &stats);
  EXPECT_NEAR(stats.norm * stats.norm, static_cast<double>(exact),
              1e-12 * static_cast<double>(exact));
}

// kernels/update_math.h's order written as documented (lane t of block b sums the block's elements
// t, t + 256, ... in increasing order; the halving tree; the blocks in order), for comparing bits.
double DocumentedSquaredSum(const std::vector<double>& v) {
  const auto n = static_cast<int64_t>(v.size());
  const int64_t per_block = 256 * 16;
  const int64_t blocks = std::min<int64_t>(kUpdatePipelineScratch,
                                           std::max<int64_t>(1, (n + per_block - 1) / per_block));
  const int64_t length = (n + blocks - 1) / blocks;
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    std::vector<double> lanes(256, 0.0);
    for (int64_t t = 0; t < 256; ++t) {
      for (int64_t i = b * length + t; i < std::min(n, (b + 1) * length); i += 256) {
        lanes[static_cast<size_t>(t)] += v[static_cast<size_t>(i)] * v[static_cast<size_t>(i)];
      }
    }
    for (size_t s = 128; s >= 1; s /= 2) {
      for (size_t t = 0; t < s; ++t) lanes[t] += lanes[t + s];
    }
    total += lanes[0];
  }
  return total;
}

TEST(UpdatePipelineTest, TheNormIsSummedInTheDocumentedOrderBitForBit) {
  for (int64_t n : {0, 1, 255, 4097, 100003, 4500001}) {
    Rng rng(DeriveSeed(9, static_cast<uint64_t>(n)));
    const auto local = RandomVector(rng, n, -3, 3), global = RandomVector(rng, n, -1, 1);
    std::vector<double> delta(local.size());
    for (size_t i = 0; i < local.size(); ++i) delta[i] = static_cast<double>(local[i] - global[i]);
    const Pipeline out = RunPipeline({}, local, global);
    EXPECT_EQ(out.stats.norm, std::sqrt(DocumentedSquaredSum(delta))) << n;
  }
}

TEST(UpdatePipelineTest, InPlaceGivesTheSameBits) {
  for (double clip : {0.0, 0.5}) {
    Rng rng(10);
    auto local = RandomVector(rng, 100003, -3, 3);
    const auto global = RandomVector(rng, 100003, -1, 1);
    UpdatePipelineParams p;
    p.clip_norm = clip;
    const Pipeline apart = RunPipeline(p, local, global);
    std::vector<double> scratch(kUpdatePipelineScratch);
    UpdatePipelineStats stats;
    UpdatePipeline(p, local.data(), global.data(), static_cast<int64_t>(local.size()), local.data(),
                   scratch.data(), &stats);
    EXPECT_EQ(local, apart.values) << clip;
    EXPECT_EQ(stats.norm, apart.stats.norm);
    EXPECT_EQ(stats.scale, apart.stats.scale);
  }
}

// ClipInPlace on a vector held in pieces is the pipeline on the whole vector against zeros.
TEST(UpdatePipelineTest, ClipInPlaceOnPiecesIsThePipelineOnTheirConcatenation) {
  const std::vector<size_t> cuts = {0, 0, 3, 5000, 5000, 80000, 100003};
  for (double clip : {0.0, 0.5, 1e9}) {
    Rng rng(11);
    const auto x = RandomVector(rng, 100003, -3, 3);
    const std::vector<float> zeros(x.size(), 0.0f);
    UpdatePipelineParams p;
    p.clip_norm = clip;
    const Pipeline whole = RunPipeline(p, x, zeros);
    std::vector<std::vector<float>> pieces;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      pieces.emplace_back(x.begin() + static_cast<std::ptrdiff_t>(cuts[c]),
                          x.begin() + static_cast<std::ptrdiff_t>(cuts[c + 1]));
    }
    std::vector<std::span<float>> spans(pieces.begin(), pieces.end());
    UpdatePipelineStats stats;
    ClipInPlace(p, spans, &stats);
    std::vector<float> joined;
    for (const auto& piece : pieces) joined.insert(joined.end(), piece.begin(), piece.end());
    EXPECT_EQ(joined, whole.values) << clip;
    EXPECT_EQ(stats.norm, whole.stats.norm) << clip;
    EXPECT_EQ(stats.scale, whole.stats.scale) << clip;
  }
  std::vector<float> bad = {1, std::numeric_limits<float>::infinity()};
  const std::span<float> spans[] = {bad};
  UpdatePipelineParams p;
  p.clip_norm = 1;
  UpdatePipelineStats stats;
  ClipInPlace(p, spans, &stats);
  EXPECT_FALSE(std::isfinite(stats.norm));
  EXPECT_EQ(stats.scale, 0.0);
}

TEST(DeviceRequestTest, ParsesTheDocumentedForms) {
  EXPECT_EQ(ParseDeviceRequest("auto")->kind, DeviceRequest::Kind::kAuto);
  EXPECT_EQ(ParseDeviceRequest("cpu")->kind, DeviceRequest::Kind::kCpu);
  EXPECT_EQ(ParseDeviceRequest("cuda")->ToString(), "cuda:0");
  EXPECT_EQ(ParseDeviceRequest("cuda:3")->index, 3);
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999", "CPU"}) {
    auto parsed = ParseDeviceRequest(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("auto, cpu, cuda, cuda:N"));
  }
}

TEST(DeviceRequestTest, CudaWithoutAGpuIsAnErrorNotAFallback) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  auto backend = OpenBackend(*ParseDeviceRequest("cuda:0"));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(backend.status().message(), HasSubstr("cuda:0"));
  auto automatic = OpenBackend(*ParseDeviceRequest("auto"));
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ((*automatic)->kind(), DeviceKind::kCpu);
}

TEST(CpuBackendTest, CopiesAndAllocationsBehave) {
  auto backend = OpenCpuBackend();
  EXPECT_EQ(backend->name(), "cpu");
  auto empty = backend->Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_FALSE(backend->Allocate(-1).ok());
  auto buffer = backend->Allocate(3 * sizeof(float));
  ASSERT_TRUE(buffer.ok());
  const float in[3] = {1, 2, 3};
  float out[3] = {};
  backend->CopyToDevice(buffer->data(), in, sizeof in);
  ASSERT_TRUE(backend->CopyToHost(out, buffer->data(), sizeof out).ok());
  EXPECT_EQ(std::vector<float>(out, out + 3), std::vector<float>(in, in + 3));
  backend->Zero(buffer->data(), buffer->bytes());
  ASSERT_TRUE(backend->CopyToHost(out, buffer->data(), sizeof out).ok());
  EXPECT_EQ(out[2], 0.0f);
}

}  // namespace
}  // namespace huddle::kernels
