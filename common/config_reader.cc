#include "common/config_reader.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"

namespace huddle {
namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

StatusOr<ConfigMap> ConfigMap::From(const YAML::Node& node, std::string origin, std::string path) {
  if (node && !node.IsNull() && !node.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", path.empty() ? "top level" : path,
                                                   " must be a mapping of keys to values"));
  }
  if (node && node.IsMap()) {
    // yaml-cpp keeps the first of two equal keys silently; a repeated key is a mistake to report.
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>("");
      if (!seen.insert(key).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            origin, ": ", path.empty() ? "top level" : path, ": key '", key, "' appears twice"));
      }
    }
  }
  return ConfigMap(node && node.IsMap() ? node : YAML::Node(YAML::NodeType::Map), std::move(origin),
                   std::move(path));
}

StatusOr<ConfigMap> ConfigMap::LoadFile(const std::string& file) {
  try {
    return From(YAML::LoadFile(file), file, "");
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(absl::StrCat("cannot read config file '", file, "'"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": YAML syntax error: ", e.what()));
  }
}

std::string ConfigMap::Where(std::string_view key) const {
  return absl::StrCat(origin_, ": ", path_, path_.empty() ? "" : ".", std::string(key));
}

bool ConfigMap::Has(std::string_view key) const {
  return static_cast<bool>(node_[std::string(key)]);
}

StatusOr<std::optional<YAML::Node>> ConfigMap::Scalar(std::string_view key) {
  known_.emplace(key);
  YAML::Node v = node_[std::string(key)];
  if (!v || v.IsNull()) return std::optional<YAML::Node>();
  if (!v.IsScalar()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(key), " must be a single value"));
  }
  return std::optional<YAML::Node>(v);
}

Status ConfigMap::Optional(std::string_view key, int64_t* out, int64_t lo, int64_t hi) {
  HUDDLE_ASSIGN_OR_RETURN(auto v, Scalar(key));
  if (!v) return absl::OkStatus();
  const std::string text = v->Scalar();
  int64_t x;
  if (!absl::SimpleAtoi(text, &x)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(key), ": '", text, "' is not an integer (allowed: [", lo, ", ", hi, "])"));
  }
  if (x < lo || x > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key), ": ", x, " is out of range [", lo, ", ", hi, "]"));
  }
  *out = x;
  return absl::OkStatus();
}

Status ConfigMap::OptionalSeconds(std::string_view key, int64_t* out_ms, double lo, double hi) {
  double s = static_cast<double>(*out_ms) / 1000.0;
  HUDDLE_RETURN_IF_ERROR(Optional(key, &s, lo, hi));
  *out_ms = static_cast<int64_t>(s * 1000.0);
  return absl::OkStatus();
}

Status ConfigMap::Optional(std::string_view key, double* out, double lo, double hi) {
  HUDDLE_ASSIGN_OR_RETURN(auto v, Scalar(key));
  if (!v) return absl::OkStatus();
  const std::string text = v->Scalar();
  double x;
  if (!absl::SimpleAtod(text, &x) || !std::isfinite(x)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(key), ": '", text, "' is not a finite number (allowed: [", lo, ", ", hi, "])"));
  }
  if (x < lo || x > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key), ": ", text, " is out of range [", lo, ", ", hi, "]"));
  }
  *out = x;
  return absl::OkStatus();
}

Status ConfigMap::Optional(std::string_view key, bool* out) {
  HUDDLE_ASSIGN_OR_RETURN(auto v, Scalar(key));
  if (!v) return absl::OkStatus();
  const std::string text = v->Scalar();
  if (text == "true") {
    *out = true;
  } else if (text == "false") {
    *out = false;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key), ": '", text, "' is not a boolean (allowed: true, false)"));
  }
  return absl::OkStatus();
}

Status ConfigMap::Optional(std::string_view key, std::string* out) {
  HUDDLE_ASSIGN_OR_RETURN(auto v, Scalar(key));
  if (v) *out = v->Scalar();
  return absl::OkStatus();
}

Status ConfigMap::OptionalPath(std::string_view key, std::string* out) {
  HUDDLE_ASSIGN_OR_RETURN(auto v, Scalar(key));
  if (!v) return absl::OkStatus();
  const std::filesystem::path given(v->Scalar());
  if (given.empty() || given.is_absolute()) {
    *out = given.string();
    return absl::OkStatus();
  }
  *out = (std::filesystem::path(origin_).parent_path() / given).lexically_normal().string();
  return absl::OkStatus();
}

Status ConfigMap::OptionalChoice(std::string_view key, std::string* out,
                                 std::initializer_list<std::string_view> allowed) {
  HUDDLE_ASSIGN_OR_RETURN(auto v, Scalar(key));
  if (!v) return absl::OkStatus();  // absent: the default stays, whatever it is
  const std::string value = v->Scalar();
  if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(key), ": '", value, "' is not allowed (allowed: ",
        absl::StrJoin(std::vector<std::string>(allowed.begin(), allowed.end()), ", "), ")"));
  }
  *out = value;
  return absl::OkStatus();
}

Status ConfigMap::Optional(std::string_view key, std::vector<int64_t>* out, int64_t lo,
                           int64_t hi) {
  known_.emplace(key);
  YAML::Node v = node_[std::string(key)];
  if (!v || v.IsNull()) return absl::OkStatus();
  if (!v.IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(key), " must be a list of integers, e.g. [128, 64]"));
  }
  std::vector<int64_t> values;
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t x;
    const std::string text = v[i].IsScalar() ? v[i].Scalar() : "<not a scalar>";
    if (!absl::SimpleAtoi(text, &x) || x < lo || x > hi) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(key), "[", i, "]: '", text, "' is not an integer in [", lo, ", ", hi, "]"));
    }
    values.push_back(x);
  }
  *out = std::move(values);
  return absl::OkStatus();
}

StatusOr<ConfigMap> ConfigMap::Child(std::string_view key) {
  known_.emplace(key);
  return From(node_[std::string(key)], origin_,
              path_.empty() ? std::string(key) : absl::StrCat(path_, ".", std::string(key)));
}

StatusOr<std::vector<ConfigMap>> ConfigMap::ChildList(std::string_view key) {
  known_.emplace(key);
  const std::string where =
      path_.empty() ? std::string(key) : absl::StrCat(path_, ".", std::string(key));
  const YAML::Node node = node_[std::string(key)];
  std::vector<ConfigMap> out;
  if (!node || node.IsNull()) return out;
  if (!node.IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin_, ": ", where, " must be a list of mappings"));
  }
  for (size_t i = 0; i < node.size(); ++i) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap m, From(node[i], origin_, absl::StrCat(where, "[", i, "]")));
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<std::string> ConfigMap::Keys() const {
  std::vector<std::string> keys;
  for (const auto& kv : node_) keys.push_back(kv.first.as<std::string>(""));
  return keys;
}

Status ConfigMap::Finish() const {
  for (const auto& kv : node_) {
    const std::string key = kv.first.as<std::string>("");
    if (known_.count(key)) continue;
    std::string best;
    size_t best_d = 3;  // suggest only close matches
    for (const std::string& k : known_) {
      size_t d = EditDistance(key, k);
      if (d < best_d) {
        best_d = d;
        best = k;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(origin_, ": ", path_.empty() ? "top level" : path_, ": unknown key '", key,
                     "' (", best.empty() ? "" : absl::StrCat("did you mean '", best, "'? "),
                     "allowed: ", absl::StrJoin(known_, ", "), ")"));
  }
  return absl::OkStatus();
}

}  // namespace huddle
