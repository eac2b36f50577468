// CPU reference of kernels/group_norm.h: plain loops over row-major [batch, channels, spatial]
// buffers, summing in the header's order (kernels/lane_sums.h within a group or a plane, then
// planes in channel or example order) with batch_norm_math's and group_norm_math's arithmetic,
// shared with kernels/cuda/group_norm.cu.
#include <vector>

#include "kernels/group_norm.h"
#include "kernels/lane_sums.h"

namespace huddle::kernels {
namespace {

namespace bm = batch_norm_math;
namespace gm = group_norm_math;

// P_dy and P_dyx of plane (n, c): `spatial` values from dy_plane and x_plane.
lane_sums::Pair PlaneSums(const float* dy_plane, const float* x_plane, int64_t spatial, float mean,
                          float invstd) {
  return lane_sums::LaneSums(spatial, [=](int64_t s, double* a, double* b) {
    bm::AccumulateBackwardSums(dy_plane[s], x_plane[s], mean, invstd, a, b);
  });
}

}  // namespace

void GroupNormForward(const GroupNormShape& s, const float* x, const float* gamma,
                      const float* beta, double eps, float* y, float* mean, float* invstd) {
  const int64_t per_group = s.channels / s.groups;
  const int64_t count = per_group * s.spatial;  // L
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t g = 0; g < s.groups; ++g) {
      const int64_t base = (n * s.channels + g * per_group) * s.spatial;
      const float* x_group = x + base;  // [per_group, spatial]
      const lane_sums::Pair sums = lane_sums::LaneSums(
          count,
          [x_group](int64_t i, double* a, double* b) { bm::AccumulateSums(x_group[i], a, b); });
      double m = 0;
      const double var = bm::Variance(sums.a, sums.b, static_cast<double>(count), &m);
      const int64_t stat = n * s.groups + g;
      mean[stat] = static_cast<float>(m);
      invstd[stat] = static_cast<float>(bm::InvStd(var, eps));
      for (int64_t j = 0; j < per_group; ++j) {
        const int64_t c = g * per_group + j;
        for (int64_t i = base + j * s.spatial; i < base + (j + 1) * s.spatial; ++i) {
          y[i] = bm::ForwardValue(x[i], mean[stat], invstd[stat], gamma[c], beta[c]);
        }
      }
    }
  }
}

void GroupNormBackward(const GroupNormShape& s, const float* x, const float* dy, const float* gamma,
                       const float* mean, const float* invstd, float* dgamma, float* dbeta,
                       float* dx) {
  const int64_t per_group = s.channels / s.groups;
  const auto count = static_cast<double>(per_group * s.spatial);      // L
  std::vector<double> sum_dy(static_cast<size_t>(s.channels), 0.0);   // Σ_n P_dy[n, c]
  std::vector<double> sum_dyx(static_cast<size_t>(s.channels), 0.0);  // Σ_n P_dyx[n, c]
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t g = 0; g < s.groups; ++g) {
      const int64_t stat = n * s.groups + g;
      const int64_t base = (n * s.channels + g * per_group) * s.spatial;
      double a = 0, b = 0;
      for (int64_t j = 0; j < per_group; ++j) {
        const int64_t c = g * per_group + j, plane = base + j * s.spatial;
        const lane_sums::Pair p =
            PlaneSums(dy + plane, x + plane, s.spatial, mean[stat], invstd[stat]);
        sum_dy[c] = hd::Add(sum_dy[c], p.a);
        sum_dyx[c] = hd::Add(sum_dyx[c], p.b);
        gm::FoldGroupSums(gamma[c], p.a, p.b, &a, &b);
      }
      if (dx == nullptr) continue;
      // The whole group is read above before any of it is written: dx may be dy or x.
      const gm::InputGradientFactors k = gm::GradientFactors(a, b, count);
      for (int64_t j = 0; j < per_group; ++j) {
        const int64_t c = g * per_group + j, plane = base + j * s.spatial;
        for (int64_t i = plane; i < plane + s.spatial; ++i) {
          dx[i] = gm::InputGradient(dy[i], x[i], mean[stat], invstd[stat], gamma[c], k);
        }
      }
    }
  }
  for (int64_t c = 0; c < s.channels; ++c) {
    dbeta[c] = static_cast<float>(sum_dy[c]);
    dgamma[c] = static_cast<float>(sum_dyx[c]);
  }
}

void AddGroupNormSquaredNorms(const GroupNormShape& s, const float* x, const float* dy,
                              const float* mean, const float* invstd, double* squared_norms) {
  for (int64_t n = 0; n < s.batch; ++n) {
    double total = 0;
    for (int64_t c = 0; c < s.channels; ++c) {
      const int64_t stat = gm::StatIndex(s, n, c), plane = (n * s.channels + c) * s.spatial;
      const lane_sums::Pair p =
          PlaneSums(dy + plane, x + plane, s.spatial, mean[stat], invstd[stat]);
      gm::FoldSquaredNorm(p.a, p.b, &total);
    }
    squared_norms[n] = hd::Add(squared_norms[n], total);
  }
}

}  // namespace huddle::kernels
