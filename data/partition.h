// Splitting a labelled dataset's rows into shards, one per simulated or real client.
//
// Two schemes:
//   kIid       - shuffle all rows and deal them out evenly (shard sizes differ by at most one).
//   kDirichlet - label skew (Hsu et al., 2019): for each class independently, draw shard
//                proportions p ~ Dir(alpha, ..., alpha) and cut that class's shuffled rows at the
//                cumulative proportions. Small alpha (0.1) gives each shard a few dominant classes;
//                large alpha (1000) approaches IID. If any shard ends up with fewer than
//                min_shard_size rows the whole draw is repeated from a new derived seed, at most
//                kMaxDirichletAttempts times, after which Partition fails with a clear error.
//
// Result: for each shard, its rows in increasing order. Shards are disjoint and together cover
// every row exactly once. The result depends only on (labels, num_classes, options): every client
// that computes the partition with the same seed agrees on it, so each can load only its shard.
//
// Thread-safety: stateless functions; safe to call concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace huddle::data {

struct PartitionOptions {
  enum class Kind { kIid, kDirichlet };
  Kind kind = Kind::kIid;
  int64_t num_shards = 1;       // >= 1 and <= number of rows
  double alpha = 0.5;           // Dirichlet concentration, > 0 (kDirichlet only)
  uint64_t seed = 0;            // same seed => same partition
  int64_t min_shard_size = 10;  // every shard must get at least this many rows (>= 0)
};

// How many Dirichlet draws Partition tries before giving up on min_shard_size.
inline constexpr int kMaxDirichletAttempts = 100;

// Partitions rows 0..labels.size()-1 into options.num_shards shards (see above).
// InvalidArgument for bad options, a label outside [0, num_classes), or when no draw (IID: the
// even split) gives every shard min_shard_size rows.
StatusOr<std::vector<std::vector<int64_t>>> Partition(std::span<const int32_t> labels,
                                                      int64_t num_classes,
                                                      const PartitionOptions& options);

// "iid" -> kIid, "dirichlet" -> kDirichlet; anything else is InvalidArgument.
StatusOr<PartitionOptions::Kind> ParsePartitionKind(std::string_view name);

// Inverse of ParsePartitionKind.
const char* PartitionKindName(PartitionOptions::Kind kind);

}  // namespace huddle::data
