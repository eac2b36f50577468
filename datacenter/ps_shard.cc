#include "datacenter/ps_shard.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace huddle::datacenter {

Shard::Shard(ShardRange range, std::vector<float> params, std::vector<float> velocity,
             int64_t version, const kernels::SgdHyper& hyper, bool async)
    : range_(range),
      params_(std::move(params)),
      velocity_(std::move(velocity)),
      version_(version),
      hyper_(hyper),
      async_(async) {
  if (hyper_.momentum != 0.0f && velocity_.size() != params_.size()) {
    velocity_.assign(params_.size(), 0.0f);
  }
  if (!async_) {
    sum_.assign(params_.size(), 0.0);
    mean_.assign(params_.size(), 0.0f);
  }
}

StatusOr<Shard::Pushed> Shard::Push(int64_t base_version, int64_t rows, int64_t need,
                                    std::span<const float> grad) {
  if (grad.size() != params_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gradient of ", grad.size(), " values for a shard of ", params_.size()));
  }
  if (base_version < 0 || base_version > version_) {
    return absl::InvalidArgumentError(absl::StrCat("a gradient of version ", base_version,
                                                   "; the shard is at version ", version_));
  }
  if (rows < 1) return absl::InvalidArgumentError(absl::StrCat("a gradient of ", rows, " rows"));
  for (float g : grad) {
    if (!std::isfinite(g)) {
      return absl::InvalidArgumentError(
          "a gradient with a non-finite value (training diverged? lower train.learning_rate)");
    }
  }
  Pushed out;
  out.staleness = version_ - base_version;
  float* velocity = velocity_.empty() ? nullptr : velocity_.data();
  const auto n = static_cast<int64_t>(params_.size());
  if (async_) {
    kernels::SgdStep(hyper_, grad.data(), params_.data(), velocity, n);
    ++version_;
    out.accepted = true;
    out.version = version_;
    return out;
  }
  if (base_version < version_) {  // a step already taken: a backup's (or a re-run's) late one
    ++dropped_;
    out.version = version_;
    return out;
  }
  if (need < 1 || (count_ > 0 && need != need_)) {
    return absl::InvalidArgumentError(absl::StrCat("a gradient for version ", version_, " needing ",
                                                   need, " of the step's ", need_));
  }
  need_ = need;
  const auto w = static_cast<double>(rows);
  for (size_t i = 0; i < grad.size(); ++i) sum_[i] += w * static_cast<double>(grad[i]);
  rows_ += rows;
  out.accepted = true;
  if (++count_ == need_) {
    const double total = static_cast<double>(rows_);
    for (size_t i = 0; i < sum_.size(); ++i) {
      mean_[i] = static_cast<float>(sum_[i] / total);
      sum_[i] = 0.0;
    }
    kernels::SgdStep(hyper_, mean_.data(), params_.data(), velocity, n);
    ++version_;
    rows_ = count_ = need_ = 0;
  }
  out.version = version_;
  return out;
}

}  // namespace huddle::datacenter
