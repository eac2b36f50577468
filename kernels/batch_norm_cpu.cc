// CPU reference of kernels/batch_norm.h: plain loops over row-major [batch, features, spatial]
// buffers. The arithmetic is batch_norm_math's, shared with kernels/cuda/batch_norm.cu; the loops
// visit rows in order and sum each (row, feature) plane in kernels/lane_sums.h's order, the
// summation order the header promises. With spatial == 1 a plane's lane sum is its one value, so
// the sums take the direct path (a plain row-order sum), which gives the same bits faster.
#include <algorithm>

#include "kernels/batch_norm.h"
#include "kernels/lane_sums.h"

namespace huddle::kernels {

namespace bm = batch_norm_math;

void BatchNormSums(const float* x, int64_t batch, int64_t features, int64_t spatial, double* sums) {
  double* sum = sums;                // [features]
  double* sum_sq = sums + features;  // [features]
  for (int64_t f = 0; f < features; ++f) sum[f] = sum_sq[f] = 0.0;
  for (int64_t r = 0; r < batch; ++r) {
    const float* row = x + r * features * spatial;  // [features, spatial]
    for (int64_t f = 0; f < features; ++f) {
      if (spatial == 1) {
        bm::AccumulateSums(row[f], &sum[f], &sum_sq[f]);
        continue;
      }
      const float* plane = row + f * spatial;  // [spatial]
      const lane_sums::Pair p = lane_sums::LaneSums(
          spatial,
          [plane](int64_t s, double* a, double* b) { bm::AccumulateSums(plane[s], a, b); });
      sum[f] = hd::Add(sum[f], p.a);
      sum_sq[f] = hd::Add(sum_sq[f], p.b);
    }
  }
}

void BatchNormMoments(const double* sums, int64_t count, int64_t features, double eps, float* mean,
                      float* invstd) {
  const auto n = static_cast<double>(count);
  for (int64_t f = 0; f < features; ++f) {
    double m = 0;
    const double var = bm::Variance(sums[f], sums[features + f], n, &m);
    mean[f] = static_cast<float>(m);
    invstd[f] = static_cast<float>(bm::InvStd(var, eps));
  }
}

void BatchNormUpdateRunning(const double* sums, int64_t count, int64_t features, double momentum,
                            float* running_mean, float* running_var) {
  const auto n = static_cast<double>(count);
  const double unbias = bm::UnbiasFactor(count);
  for (int64_t f = 0; f < features; ++f) {
    double m = 0;
    const double var = bm::Variance(sums[f], sums[features + f], n, &m);
    running_mean[f] = bm::Blend(running_mean[f], m, momentum);
    running_var[f] = bm::Blend(running_var[f], hd::Mul(var, unbias), momentum);
  }
}

void BatchNormInvStd(const float* var, int64_t features, double eps, float* invstd) {
  for (int64_t f = 0; f < features; ++f) invstd[f] = static_cast<float>(bm::InvStd(var[f], eps));
}

void BatchNormForward(const float* x, int64_t batch, int64_t features, int64_t spatial,
                      const float* mean, const float* invstd, const float* gamma, const float* beta,
                      float* y) {
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t f = 0; f < features; ++f) {
      const int64_t base = (r * features + f) * spatial;
      const float* x_plane = x + base;  // [spatial]
      float* y_plane = y + base;        // [spatial]; may be x_plane
      for (int64_t s = 0; s < spatial; ++s) {
        y_plane[s] = bm::ForwardValue(x_plane[s], mean[f], invstd[f], gamma[f], beta[f]);
      }
    }
  }
}

void BatchNormBackwardSums(const float* dy, const float* x, const float* mean, const float* invstd,
                           int64_t batch, int64_t features, int64_t spatial, double* sums) {
  double* sum_dy = sums;                  // [features]
  double* sum_dy_xhat = sums + features;  // [features]
  for (int64_t f = 0; f < features; ++f) sum_dy[f] = sum_dy_xhat[f] = 0.0;
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t f = 0; f < features; ++f) {
      const int64_t base = (r * features + f) * spatial;
      const float* dy_plane = dy + base;  // [spatial]
      const float* x_plane = x + base;    // [spatial]
      if (spatial == 1) {
        bm::AccumulateBackwardSums(*dy_plane, *x_plane, mean[f], invstd[f], &sum_dy[f],
                                   &sum_dy_xhat[f]);
        continue;
      }
      const float m = mean[f], k = invstd[f];
      const lane_sums::Pair p = lane_sums::LaneSums(spatial, [=](int64_t s, double* a, double* b) {
        bm::AccumulateBackwardSums(dy_plane[s], x_plane[s], m, k, a, b);
      });
      sum_dy[f] = hd::Add(sum_dy[f], p.a);
      sum_dy_xhat[f] = hd::Add(sum_dy_xhat[f], p.b);
    }
  }
}

void BatchNormParamGrads(const double* sums, int64_t features, float* dgamma, float* dbeta) {
  for (int64_t f = 0; f < features; ++f) {
    dbeta[f] = static_cast<float>(sums[f]);
    dgamma[f] = static_cast<float>(sums[features + f]);
  }
}

void BatchNormBackwardInput(const float* dy, const float* x, const float* mean, const float* invstd,
                            const float* gamma, const double* sums, int64_t count, int64_t batch,
                            int64_t features, int64_t spatial, float* dx) {
  const auto n = static_cast<double>(count);
  // Features in chunks whose factors fit on the stack, rows in order within a chunk. Each
  // element's inputs are read just before its output is written, so dx may be dy or x.
  constexpr int64_t kChunk = 64;
  bm::InputGradientFactors k[kChunk];
  for (int64_t f0 = 0; f0 < features; f0 += kChunk) {
    const int64_t width = std::min(kChunk, features - f0);
    for (int64_t j = 0; j < width; ++j) {
      const int64_t f = f0 + j;
      k[j] = bm::GradientFactors(gamma[f], invstd[f], sums[f], sums[features + f], n);
    }
    for (int64_t r = 0; r < batch; ++r) {
      for (int64_t j = 0; j < width; ++j) {
        const int64_t f = f0 + j, base = (r * features + f) * spatial;
        for (int64_t i = base; i < base + spatial; ++i) {
          dx[i] = bm::InputGradient(dy[i], x[i], mean[f], invstd[f], k[j]);
        }
      }
    }
  }
}

}  // namespace huddle::kernels
