// Strict reading of YAML configuration into Options structs.
//
// `ConfigMap` wraps one YAML mapping. Each Optional*() call reads one key if present (leaving the
// default in place otherwise), checks its type and range, and remembers the key as known. Finish()
// then fails on any key that no call asked for, so a typo is an error that names the key, the
// place and what is allowed, e.g.
//   job.yaml: train: unknown key 'learning_rte' (did you mean 'learning_rate'? allowed: ...)
//   job.yaml: train.batch_size: 0 is out of range [1, 65536]
//
// Thread-safety: none.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace huddle {

class ConfigMap {
 public:
  // `origin` names the file (for errors), `path` the dotted key path of this mapping ("" at top).
  // A null node is an empty mapping. A non-mapping node is an error.
  static StatusOr<ConfigMap> From(const YAML::Node& node, std::string origin, std::string path);
  // Parses a YAML file into its top-level mapping.
  static StatusOr<ConfigMap> LoadFile(const std::string& file);

  Status Optional(std::string_view key, int64_t* out, int64_t lo, int64_t hi);
  Status Optional(std::string_view key, double* out, double lo, double hi);
  // Seconds (a number in [lo, hi]) into milliseconds.
  Status OptionalSeconds(std::string_view key, int64_t* out_ms, double lo, double hi);
  Status Optional(std::string_view key, bool* out);
  Status Optional(std::string_view key, std::string* out);
  // A file or directory path: a relative one is resolved against the directory of the YAML file
  // that holds it (not the working directory), so a config means the same from anywhere.
  Status OptionalPath(std::string_view key, std::string* out);
  Status OptionalChoice(std::string_view key, std::string* out,
                        std::initializer_list<std::string_view> allowed);
  Status Optional(std::string_view key, std::vector<int64_t>* out, int64_t lo, int64_t hi);

  bool Has(std::string_view key) const;
  // The keys of this mapping, in file order (nothing is marked as asked about).
  std::vector<std::string> Keys() const;
  // The child mapping at `key` (an empty mapping if absent).
  StatusOr<ConfigMap> Child(std::string_view key);
  // The mappings of the sequence at `key` (empty if absent), named "key[i]" in errors.
  StatusOr<std::vector<ConfigMap>> ChildList(std::string_view key);

  // Fails if the mapping holds a key that no Optional*/Child call asked about.
  Status Finish() const;

  // "job.yaml: train.batch_size" for errors about a key of this mapping.
  std::string Where(std::string_view key) const;

 private:
  ConfigMap(YAML::Node node, std::string origin, std::string path)
      : node_(std::move(node)), origin_(std::move(origin)), path_(std::move(path)) {}
  StatusOr<std::optional<YAML::Node>> Scalar(std::string_view key);

  YAML::Node node_;
  std::string origin_;
  std::string path_;
  std::set<std::string, std::less<>> known_;
};

}  // namespace huddle
