// project.yaml, the input of `huddle provision` (cli/provision.h): read strictly, every value
// checked, and each site's agent.yaml made and read back as `huddle agent` reads it, so that a
// kit never carries a config its agent would refuse.
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <set>

#include "absl/strings/str_replace.h"
#include "cli/provision_internal.h"
#include "client/config.h"
#include "common/config_reader.h"
#include "common/file_util.h"
#include "data/client_data.h"
#include "proto/messages.h"
#include "service/http_endpoint.h"

namespace huddle::cli {
namespace {

namespace fs = std::filesystem;

// A host name, an IPv4 address or an IPv6 literal (bare or in brackets).
bool IsValidHost(std::string host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host.size() > 253) return false;
  const bool v6 = host.find(':') != std::string::npos;
  return std::all_of(host.begin(), host.end(), [v6](char c) {
    return v6 ? (std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.')
              : (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-');
  });
}

// "HOST:PORT" with a valid host (or "*" where `any` allows) and a port in [1, 65535].
bool IsValidHostPort(const std::string& text, bool any) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 >= text.size()) return false;
  const std::string host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    return false;
  }
  const int p = std::stoi(port);
  return p >= 1 && p <= 65535 && ((any && host == "*") || IsValidHost(host));
}

// A block-style YAML text of `node` (flow-style mappings and lists as the user wrote them become
// blocks, so that the sections can be composed into one file).
void ToBlock(YAML::Node node) {
  if (node.IsMap() || node.IsSequence()) {
    node.SetStyle(YAML::EmitterStyle::Block);
    for (auto it = node.begin(); it != node.end(); ++it) ToBlock(node.IsMap() ? it->second : *it);
  }
}
std::string BlockYaml(const YAML::Node& node) {
  YAML::Node copy = YAML::Clone(node);
  ToBlock(copy);
  YAML::Emitter out;
  out << copy;
  return std::string(out.c_str()) + "\n";
}

// `datasets:` of a site: the agent's reader's own checks, plus absolute paths (the agent reads
// its config from the etc directory: a relative path there means nothing to whoever wrote
// project.yaml) and a shard inside its partition.
Status ReadDatasets(ConfigMap& site, const YAML::Node& raw) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap sets, site.Child("datasets"));
  for (const std::string& name : sets.Keys()) {
    if (!wire::IsValidClientId(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          sets.Where(name), ": a data set name is 1-128 characters of [A-Za-z0-9._-]"));
    }
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap one, sets.Child(name));
    const YAML::Node path = raw[name]["path"];
    if (path && path.IsScalar() && !fs::path(path.Scalar()).is_absolute()) {
      return absl::InvalidArgumentError(
          absl::StrCat(one.Where("path"), ": '", path.Scalar(),
                       "' must be an absolute path (the path on the site's host)"));
    }
    data::DataSpec spec;
    HUDDLE_RETURN_IF_ERROR(data::ReadDataSpec(one, &spec, /*shard_keys=*/true));
    if (spec.partitioned && spec.shard >= spec.partition.num_shards) {
      return absl::InvalidArgumentError(absl::StrCat(one.Where("shard"), ": ", spec.shard,
                                                     " is out of range for ",
                                                     spec.partition.num_shards, " shards"));
    }
  }
  return sets.Finish();
}

// The site's agent.yaml read back by `huddle agent`'s reader: its privacy policy and
// secure-aggregation assumptions are checked there, and its errors are given as project.yaml's.
Status CheckAgentYaml(const std::string& origin, const ProjectSpec& spec, const ProjectSite& site) {
  std::string tmp = (fs::temp_directory_path() / "huddle-provision-XXXXXX").string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return absl::InternalError("cannot create a temporary file to check agent.yaml");
  ::close(fd);
  Status st = WriteFileAtomic(tmp, provision::AgentYaml(spec, site, provision::Dirs{}), 0600);
  StatusOr<client::ClientConfig> loaded =
      st.ok() ? client::LoadClientConfig(tmp) : StatusOr<client::ClientConfig>(st);
  std::error_code ec;
  fs::remove(tmp, ec);
  if (loaded.ok()) return absl::OkStatus();
  const std::string where = absl::StrCat(origin, ": sites.", site.name, ".");
  return Status(loaded.status().code(),
                absl::StrReplaceAll(loaded.status().message(),
                                    {{tmp + ": ", where},
                                     {tmp, absl::StrCat("the agent.yaml of site ", site.name)}}));
}

Status ReadSite(const std::string& origin, ConfigMap& sites, const std::string& name,
                const YAML::Node& raw, ProjectSpec* spec) {
  if (!IsValidPartyName(name) || name == "server" || name == "project") {
    return absl::InvalidArgumentError(absl::StrCat(
        sites.Where(name),
        !IsValidPartyName(name)
            ? ": a site's name is 1-64 characters of [A-Za-z0-9._-] starting with a letter or a "
              "digit (it is the site's client id and names its kit)"
            : ": 'server' and 'project' name kits of their own; choose another site name"));
  }
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap site, sites.Child(name));
  ProjectSite s;
  s.name = name;
  HUDDLE_RETURN_IF_ERROR(ReadDatasets(site, raw["datasets"]));
  if (raw["datasets"] && !raw["datasets"].IsNull()) s.datasets_yaml = BlockYaml(raw["datasets"]);
  if (raw["privacy"] && !raw["privacy"].IsNull()) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap privacy, site.Child("privacy"));
    if (privacy.Has("ledger")) {
      return absl::InvalidArgumentError(
          absl::StrCat(privacy.Where("ledger"), ": set by huddle provision (STATE_DIR/agents/",
                       name, "/privacy.ledger, where the agent's unit may write); leave it out"));
    }
    s.privacy_yaml = BlockYaml(raw["privacy"]);
  } else {
    HUDDLE_RETURN_IF_ERROR(site.Child("privacy").status());
  }
  HUDDLE_RETURN_IF_ERROR(site.Child("secure_aggregation").status());
  if (raw["secure_aggregation"] && !raw["secure_aggregation"].IsNull()) {
    if (!spec->secure_aggregation) {
      return absl::InvalidArgumentError(
          absl::StrCat(site.Where("secure_aggregation"),
                       ": the site's assumptions in secure aggregation, which the project does "
                       "not enable (secure_aggregation: true at the top)"));
    }
    s.secure_aggregation_yaml = BlockYaml(raw["secure_aggregation"]);
  }
  if (site.Has("device")) {
    std::string device = "auto";
    HUDDLE_RETURN_IF_ERROR(client::ReadDevice(site, &device));
    s.device = device;
  }
  HUDDLE_RETURN_IF_ERROR(site.Finish());
  HUDDLE_RETURN_IF_ERROR(CheckAgentYaml(origin, *spec, s));
  spec->sites.push_back(std::move(s));
  return absl::OkStatus();
}

Status ReadServer(ConfigMap& top, ProjectServer* s) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap server, top.Child("server"));
  HUDDLE_RETURN_IF_ERROR(server.Optional("address", &s->address));
  if (!IsValidHost(s->address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        server.Where("address"), s->address.empty() ? ": required" : ": '" + s->address + "'",
        " (the host name or IP address the sites reach the service at)"));
  }
  HUDDLE_RETURN_IF_ERROR(server.Optional("port", &s->port, 1, 65535));
  HUDDLE_RETURN_IF_ERROR(server.Optional("bind_host", &s->bind_host));
  if (!IsValidHost(s->bind_host) && s->bind_host != "*") {
    return absl::InvalidArgumentError(absl::StrCat(
        server.Where("bind_host"), ": '", s->bind_host,
        "' is not an address to listen on (0.0.0.0, the default: every IPv4 address)"));
  }
  HUDDLE_RETURN_IF_ERROR(server.Optional("operator_bind", &s->operator_bind));
  if (s->operator_bind.rfind("tcp://", 0) != 0 ||
      !IsValidHostPort(s->operator_bind.substr(6), /*any=*/true)) {
    return absl::InvalidArgumentError(absl::StrCat(
        server.Where("operator_bind"), ": '", s->operator_bind,
        "' is not tcp://HOST:PORT (default tcp://127.0.0.1:5556: operators on the server host)"));
  }
  HUDDLE_RETURN_IF_ERROR(server.Optional("http_bind", &s->http_bind));
  // The service's own rule for http.bind, so that no kit holds one the service refuses.
  if (StatusOr<service::BindAddress> bind = service::ParseBindAddress(s->http_bind); !bind.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        server.Where("http_bind"), ": ", bind.status().message(), " (default 127.0.0.1:9464)"));
  }
  HUDDLE_RETURN_IF_ERROR(server.Optional("state_dir", &s->state_dir));
  if (!s->state_dir.empty() && !fs::path(s->state_dir).is_absolute()) {
    return absl::InvalidArgumentError(
        absl::StrCat(server.Where("state_dir"), ": '", s->state_dir, "' must be an absolute path"));
  }
  return server.Finish();
}

Status ReadOperators(const std::string& origin, const YAML::Node& raw, ProjectSpec* spec) {
  if (!raw || raw.IsNull()) return absl::OkStatus();
  if (!raw.IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": operators must be a list of names, e.g. [alice, bob]"));
  }
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::string name = raw[i].IsScalar() ? raw[i].Scalar() : "";
    if (!IsValidPartyName(name) || name == "server" || name == "project") {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ": operators[", i, "]: '", name.substr(0, 64),
          "' is not an operator's name (1-64 characters of [A-Za-z0-9._-] starting with a letter "
          "or a digit; not 'server' or 'project')"));
    }
    spec->operators.push_back(name);
  }
  return absl::OkStatus();
}

}  // namespace

bool IsValidPartyName(const std::string& name) {
  // A client id (the wire's alphabet), short enough for a tar header, starting with a letter or a
  // digit (so that no kit is named ".", "..", or like a flag).
  return wire::IsValidClientId(name) && name.size() <= 64 &&
         std::isalnum(static_cast<unsigned char>(name[0]));
}

namespace {

StatusOr<ProjectSpec> ReadProjectSpec(const std::string& path) {
  YAML::Node raw;
  try {
    raw = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": YAML syntax error: ", e.what()));
  }
  // The strict reader for everything but the operators' list (names, not mappings): it reads a
  // copy whose list is blanked, so that it still knows the key.
  const YAML::Node& in = raw;  // read only: a non-const [] may add what it asks about
  YAML::Node checked = YAML::Clone(raw);
  if (checked.IsMap() && checked["operators"]) checked["operators"] = YAML::Node();
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::From(checked, path, ""));
  ProjectSpec spec;
  HUDDLE_RETURN_IF_ERROR(top.Optional("project", &spec.project));
  if (!IsValidPartyName(spec.project)) {
    return absl::InvalidArgumentError(absl::StrCat(
        top.Where("project"), spec.project.empty() ? ": required" : ": '" + spec.project + "'",
        " (the federation's name: 1-64 characters of [A-Za-z0-9._-])"));
  }
  HUDDLE_RETURN_IF_ERROR(ReadServer(top, &spec.server));
  HUDDLE_RETURN_IF_ERROR(top.Optional("secure_aggregation", &spec.secure_aggregation));
  std::string ignored;
  HUDDLE_RETURN_IF_ERROR(top.Optional("operators", &ignored));  // the blanked list: known
  HUDDLE_RETURN_IF_ERROR(ReadOperators(path, in["operators"], &spec));
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap sites, top.Child("sites"));
  for (const std::string& name : sites.Keys()) {
    HUDDLE_RETURN_IF_ERROR(ReadSite(path, sites, name, in["sites"][name], &spec));
  }
  HUDDLE_RETURN_IF_ERROR(sites.Finish());
  HUDDLE_RETURN_IF_ERROR(top.Finish());
  // A name is one identity: its client id (or operator name), its key's id, its kit.
  std::set<std::string> names;
  for (const ProjectSite& s : spec.sites) names.insert(s.name);
  std::set<std::string> operators;
  for (const std::string& o : spec.operators) {
    if (names.count(o) || !operators.insert(o).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": operators: '", o, "' ", names.count(o) ? "is also a site" : "appears twice",
          ": a name is one identity (sites and operators together)"));
    }
  }
  std::sort(spec.sites.begin(), spec.sites.end(),
            [](const ProjectSite& a, const ProjectSite& b) { return a.name < b.name; });
  std::sort(spec.operators.begin(), spec.operators.end());
  return spec;
}

}  // namespace

StatusOr<ProjectSpec> LoadProjectSpec(const std::string& path) {
  try {
    return ReadProjectSpec(path);
  } catch (const YAML::Exception& e) {  // a node of a kind nothing above expected
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
}

}  // namespace huddle::cli
