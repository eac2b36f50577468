#include "data/partition.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/rng.h"

namespace huddle::data {
namespace {

using Shards = std::vector<std::vector<int64_t>>;

// Independent random streams derived from the user's seed.
constexpr uint64_t kIidStream = 1;
constexpr uint64_t kDirichletStream = 2;

Status CheckInputs(std::span<const int32_t> labels, int64_t num_classes,
                   const PartitionOptions& options) {
  const auto n = static_cast<int64_t>(labels.size());
  if (num_classes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: num_classes is ", num_classes, "; it must be >= 1"));
  }
  if (n == 0) return absl::InvalidArgumentError("partition: there are no rows to partition");
  if (options.num_shards < 1 || options.num_shards > n) {
    return absl::InvalidArgumentError(absl::StrCat("partition: num_shards is ", options.num_shards,
                                                   "; it must be in [1, ", n, "] for ", n,
                                                   " rows"));
  }
  if (options.min_shard_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: min_shard_size is ", options.min_shard_size, "; it must be >= 0"));
  }
  if (options.kind == PartitionOptions::Kind::kDirichlet &&
      !(options.alpha > 0.0 && std::isfinite(options.alpha))) {
    return absl::InvalidArgumentError(absl::StrCat("partition: Dirichlet alpha is ", options.alpha,
                                                   "; it must be positive and finite"));
  }
  for (int64_t r = 0; r < n; ++r) {
    if (labels[r] < 0 || labels[r] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat("partition: row ", r, " has label ", labels[r],
                                                     ", outside [0, ", num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

int64_t SmallestShard(const Shards& shards) {
  size_t smallest = shards[0].size();
  for (const auto& shard : shards) smallest = std::min(smallest, shard.size());
  return static_cast<int64_t>(smallest);
}

StatusOr<Shards> IidPartition(int64_t n, const PartitionOptions& options) {
  const int64_t k = options.num_shards;
  if (n / k < options.min_shard_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: ", n, " rows dealt to ", k, " shards give ", n / k,
                     " rows to the smallest, below min_shard_size ", options.min_shard_size));
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  Rng rng(DeriveSeed(options.seed, kIidStream));
  rng.Shuffle(order);
  Shards shards(static_cast<size_t>(k));
  for (int64_t s = 0; s < k; ++s) {
    // Boundaries at s*n/k make the sizes differ by at most one.
    shards[s].assign(order.begin() + s * n / k, order.begin() + (s + 1) * n / k);
    std::sort(shards[s].begin(), shards[s].end());
  }
  return shards;
}

// Proportions ~ Dir(alpha, ..., alpha) over k shards, via normalised Gamma(alpha) draws. For tiny
// alpha every draw can underflow to 0; the limit of the distribution then is a single random shard.
std::vector<double> DrawDirichlet(Rng& rng, double alpha, int64_t k) {
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0.0;
  for (double& x : p) {
    x = rng.Gamma(alpha);
    sum += x;
  }
  if (!(sum > 0.0) || !std::isfinite(sum)) {
    std::fill(p.begin(), p.end(), 0.0);
    p[rng.UniformInt(static_cast<uint64_t>(k))] = 1.0;
    return p;
  }
  for (double& x : p) x /= sum;
  return p;
}

// One Dirichlet draw: each class's shuffled rows cut at the cumulative proportions.
Shards DirichletDraw(const Shards& rows_by_class, const PartitionOptions& options, Rng& rng) {
  const int64_t k = options.num_shards;
  Shards shards(static_cast<size_t>(k));
  for (const std::vector<int64_t>& class_rows : rows_by_class) {
    std::vector<int64_t> rows = class_rows;
    rng.Shuffle(rows);
    const std::vector<double> p = DrawDirichlet(rng, options.alpha, k);
    const auto m = static_cast<int64_t>(rows.size());
    double cumulative = 0.0;
    int64_t start = 0;
    for (int64_t s = 0; s < k; ++s) {
      cumulative += p[s];
      int64_t end = s == k - 1 ? m : std::llround(cumulative * static_cast<double>(m));
      end = std::clamp(end, start, m);
      shards[s].insert(shards[s].end(), rows.begin() + start, rows.begin() + end);
      start = end;
    }
  }
  for (auto& shard : shards) std::sort(shard.begin(), shard.end());
  return shards;
}

// Labels are already checked to lie in [0, num_classes). Only classes that occur matter (an absent
// class has no rows to cut), so a huge num_classes never sizes an allocation.
StatusOr<Shards> DirichletPartition(std::span<const int32_t> labels,
                                    const PartitionOptions& options) {
  const int32_t max_label = *std::max_element(labels.begin(), labels.end());
  Shards rows_by_class(static_cast<size_t>(max_label) + 1);
  for (size_t r = 0; r < labels.size(); ++r) {
    rows_by_class[static_cast<size_t>(labels[r])].push_back(static_cast<int64_t>(r));
  }
  int64_t best_smallest = -1;
  for (int attempt = 0; attempt < kMaxDirichletAttempts; ++attempt) {
    Rng rng(DeriveSeed(options.seed, kDirichletStream, static_cast<uint64_t>(attempt)));
    Shards shards = DirichletDraw(rows_by_class, options, rng);
    const int64_t smallest = SmallestShard(shards);
    if (smallest >= options.min_shard_size) return shards;
    best_smallest = std::max(best_smallest, smallest);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "partition: no Dirichlet(alpha=", options.alpha, ") draw in ", kMaxDirichletAttempts,
      " attempts gave each of ", options.num_shards, " shards at least min_shard_size=",
      options.min_shard_size, " of ", labels.size(), " rows (best smallest shard: ", best_smallest,
      "); raise alpha, use fewer shards or lower min_shard_size"));
}

}  // namespace

StatusOr<std::vector<std::vector<int64_t>>> Partition(std::span<const int32_t> labels,
                                                      int64_t num_classes,
                                                      const PartitionOptions& options) {
  HUDDLE_RETURN_IF_ERROR(CheckInputs(labels, num_classes, options));
  switch (options.kind) {
    case PartitionOptions::Kind::kIid:
      return IidPartition(static_cast<int64_t>(labels.size()), options);
    case PartitionOptions::Kind::kDirichlet:
      return DirichletPartition(labels, options);
  }
  return absl::InvalidArgumentError("partition: unknown partition kind");
}

StatusOr<PartitionOptions::Kind> ParsePartitionKind(std::string_view name) {
  if (name == "iid") return PartitionOptions::Kind::kIid;
  if (name == "dirichlet") return PartitionOptions::Kind::kDirichlet;
  return absl::InvalidArgumentError(absl::StrCat("unknown partition kind '", std::string(name),
                                                 "'; expected 'iid' or 'dirichlet'"));
}

const char* PartitionKindName(PartitionOptions::Kind kind) {
  switch (kind) {
    case PartitionOptions::Kind::kIid:
      return "iid";
    case PartitionOptions::Kind::kDirichlet:
      return "dirichlet";
  }
  return "unknown";
}

}  // namespace huddle::data
