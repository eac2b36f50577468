// `huddle provision project.yaml --out kits/` (issue 35, "Site kits"): from one file describing a
// federation, the kits that install it, one per party, each a directory and a tarball
// (OUT/NAME/ and OUT/NAME.tar.gz, cli/tar_writer.h) whose tree is relative to the etc directory
// (/etc/huddle), so that every kit installs with
//   sudo mkdir -p /etc/huddle && sudo tar -xzf KIT.tar.gz -C /etc/huddle --no-same-owner
//
//   OUT/server/    server.yaml, keys/server.{key,pub}, keys/allowed/SITE.pub (the allow-list),
//                  keys/operators/NAME.pub, README.md                       (huddle.service)
//   OUT/SITE/      agents/SITE/{agent.yaml, SITE.key, SITE.pub, server.pub, [project.pub],
//                  README.md}                                    (huddle-agent@SITE.service)
//   OUT/operator-NAME/  operators/NAME/{NAME.key, NAME.pub, server.pub, README.md}
//   OUT/project/   project/{project.key, project.pub, README.md}: with secure aggregation only,
//                  for the privacy owner; it certifies every site's .pub
//   OUT/manifest.json   every identity: role, public-key fingerprint, created, rotated, retired
//                  keys; the removed sites; each kit's files
//
// A party's secret key is in its own kit only (0600; every other file 0644, directories 0755 or,
// for an operator's and the project's, 0700; the store's kit directories and tarballs are 0700
// and 0600). OUT is the provisioning authority's store: a run keeps every key it holds, makes
// keys for new identities, and rewrites every kit from project.yaml and the manifest (only the
// files whose bytes change), so a re-run with nothing new changes nothing.
//
// Thread-safety: Provision takes an exclusive lock on OUT (OUT/.provision.lock) for its run; a
// second run on the same store at once is refused.
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace huddle::cli {

// project.yaml (docs/deployment.md, "Provisioning sites"). Unknown keys and bad values are
// errors naming the file and the key.
struct ProjectServer {
  std::string address;                // what the sites connect to (required)
  int64_t port = 5555;                // the agents' endpoint
  std::string bind_host = "0.0.0.0";  // service.bind: tcp://BIND_HOST:PORT
  std::string operator_bind = "tcp://127.0.0.1:5556";
  std::string http_bind = "127.0.0.1:9464";  // Prometheus, /healthz, /readyz
  std::string state_dir;                     // empty: STATE_DIR/service
};

struct ProjectSite {
  std::string name;
  // The site's own sections of its agent.yaml, as block-style YAML mappings (empty: absent):
  std::string datasets_yaml;            // `datasets:` (any `data:` keys; absolute paths)
  std::string privacy_yaml;             // `privacy:` its policy; provision sets its ledger
  std::string secure_aggregation_yaml;  // `secure_aggregation:` its own assumptions
  std::string device;                   // `device:` (empty: the agent's default, auto)
};

struct ProjectSpec {
  std::string project;  // names the federation in the kits and the manifest
  ProjectServer server;
  std::vector<ProjectSite> sites;      // sorted by name
  std::vector<std::string> operators;  // sorted
  bool secure_aggregation = false;     // a project key certifies the sites; sites pin it
};

// 1-64 characters of [A-Za-z0-9._-], the first a letter or a digit: a site's or an operator's
// name, which is also its client id, its key's id and a path component of its kit.
bool IsValidPartyName(const std::string& name);

StatusOr<ProjectSpec> LoadProjectSpec(const std::string& path);

struct ProvisionOptions {
  std::string project_file;
  std::string out_dir;
  std::string etc_dir = "/etc/huddle";        // where the kits are installed: every config path
  std::string state_dir = "/var/lib/huddle";  // the service's and the agents' state
  // At most one per run. kAddSite: enrol `target` (not in project.yaml; kept on later runs),
  // kRotate: a new key pair for `target` (a site, an operator, the server or the project),
  // kRemoveSite: revoke site `target` (its key leaves the allow-list, its kit is deleted).
  enum class Action { kNone, kAddSite, kRotate, kRemoveSite };
  Action action = Action::kNone;
  std::string target;
  const Clock* clock = SteadyClock::Get();  // the manifest's times
};

struct ProvisionResult {
  std::vector<std::string> lines;     // what the run did, one line per identity, for stdout
  std::vector<std::string> warnings;  // for stderr
};

// One run (above). Errors name what and where: InvalidArgument (project.yaml, flags),
// FailedPrecondition (a foreign file, a store that does not match, a missing key), NotFound and
// AlreadyExists (the action's target) are the caller's to fix; anything else is an I/O failure.
StatusOr<ProvisionResult> Provision(const ProvisionOptions& options);

// Whether Provision's error is the caller's to fix (exit 2) rather than a failure (exit 1).
bool IsProvisionUsageError(const Status& status);

}  // namespace huddle::cli
