#include "data/client_data.h"

#include <vector>

#include "data/csv.h"

namespace huddle::data {
namespace {

Status CheckSpec(const DataSpec& spec) {
  if (spec.format != "idx" && spec.format != "csv") {
    return absl::InvalidArgumentError(
        absl::StrCat("data format '", spec.format, "' is unknown; expected 'idx' or 'csv'"));
  }
  if (spec.path.empty()) return absl::InvalidArgumentError("data path is empty");
  if (spec.num_classes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes is ", spec.num_classes, "; it must be >= 1"));
  }
  if (spec.partitioned) {
    if (spec.partition.num_shards < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("num_shards is ", spec.partition.num_shards, "; it must be >= 1"));
    }
    if (spec.shard < 0 || spec.shard >= spec.partition.num_shards) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", spec.shard, " is outside [0, ", spec.partition.num_shards, ")"));
    }
  }
  return absl::OkStatus();
}

// This client's rows of a dataset with the given labels.
StatusOr<std::vector<int64_t>> ShardRows(std::span<const int32_t> labels, const DataSpec& spec) {
  HUDDLE_ASSIGN_OR_RETURN(auto shards, Partition(labels, spec.num_classes, spec.partition));
  return std::move(shards[static_cast<size_t>(spec.shard)]);
}

StatusOr<Dataset> LoadIdx(const DataSpec& spec) {
  const IdxFilePair files = FashionMnistFiles(spec.path, Split::kTrain);
  if (!spec.partitioned) {
    return LoadIdxDataset(files.images, files.labels, nullptr, spec.num_classes);
  }
  HUDDLE_ASSIGN_OR_RETURN(const std::vector<int32_t> labels, LoadIdxLabels(files.labels));
  HUDDLE_ASSIGN_OR_RETURN(const std::vector<int64_t> rows, ShardRows(labels, spec));
  return LoadIdxDataset(files.images, files.labels, &rows, spec.num_classes);
}

StatusOr<Dataset> LoadCsv(const DataSpec& spec) {
  CsvOptions options;
  options.num_classes = spec.num_classes;
  options.scale_255 = spec.csv_scale_255;
  HUDDLE_ASSIGN_OR_RETURN(Dataset all, LoadCsvDataset(spec.path, options));
  if (!spec.partitioned) return all;
  HUDDLE_ASSIGN_OR_RETURN(const std::vector<int64_t> rows, ShardRows(all.labels, spec));
  return SelectRows(all, rows);
}

}  // namespace

StatusOr<Dataset> LoadClientData(const DataSpec& spec) {
  HUDDLE_RETURN_IF_ERROR(CheckSpec(spec));
  return spec.format == "idx" ? LoadIdx(spec) : LoadCsv(spec);
}

Status ReadDataSpec(ConfigMap& m, DataSpec* spec, bool shard_keys) {
  HUDDLE_RETURN_IF_ERROR(m.OptionalPath("path", &spec->path));
  HUDDLE_RETURN_IF_ERROR(m.OptionalChoice("format", &spec->format, {"idx", "csv"}));
  std::string partition =
      spec->partitioned
          ? (spec->partition.kind == PartitionOptions::Kind::kIid ? "iid" : "dirichlet")
          : "none";
  HUDDLE_RETURN_IF_ERROR(m.OptionalChoice("partition", &partition, {"none", "iid", "dirichlet"}));
  spec->partitioned = partition != "none";
  spec->partition.kind =
      partition == "dirichlet" ? PartitionOptions::Kind::kDirichlet : PartitionOptions::Kind::kIid;
  HUDDLE_RETURN_IF_ERROR(m.Optional("alpha", &spec->partition.alpha, 1e-3, 1e6));
  HUDDLE_RETURN_IF_ERROR(m.Optional("num_classes", &spec->num_classes, 2, 1 << 16));
  HUDDLE_RETURN_IF_ERROR(m.Optional("scale_255", &spec->csv_scale_255));
  int64_t seed = static_cast<int64_t>(spec->partition.seed);
  HUDDLE_RETURN_IF_ERROR(m.Optional("seed", &seed, 0, INT64_MAX));
  spec->partition.seed = static_cast<uint64_t>(seed);
  if (shard_keys) {
    HUDDLE_RETURN_IF_ERROR(m.Optional("num_shards", &spec->partition.num_shards, 1, 1 << 20));
    HUDDLE_RETURN_IF_ERROR(m.Optional("shard", &spec->shard, 0, (1 << 20) - 1));
  }
  return m.Finish();
}

}  // namespace huddle::data
