// Internals of `huddle provision` shared by its files (cli/provision*.cc); nothing outside them
// and their tests includes this. The contract is cli/provision.h.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/provision.h"
#include "common/status.h"

namespace huddle::cli::provision {

// Where the kits install (every path in a config or a README is under these), absolute.
struct Dirs {
  std::string etc = "/etc/huddle";
  std::string state = "/var/lib/huddle";
};

// What each kit's README says about the keys: public-key fingerprints by identity, keyed
// "server", "project" (its signing key's), "site:NAME" and "operator:NAME".
using Fingerprints = std::map<std::string, std::string>;

// The texts of the kits' generated files (cli/provision_kits.cc): pure functions of the project
// and the directories.
std::string ServerYaml(const ProjectSpec& spec, const Dirs& dirs);
std::string AgentYaml(const ProjectSpec& spec, const ProjectSite& site, const Dirs& dirs);
std::string ServerReadme(const ProjectSpec& spec, const Dirs& dirs, const Fingerprints& keys);
std::string SiteReadme(const ProjectSpec& spec, const ProjectSite& site, const Dirs& dirs,
                       const Fingerprints& keys);
std::string OperatorReadme(const ProjectSpec& spec, const std::string& name, const Dirs& dirs,
                           const Fingerprints& keys);
std::string ProjectReadme(const ProjectSpec& spec, const Fingerprints& keys);
// The service's operators' endpoint as an operator on another host dials it (or the server
// host itself, for a loopback bind), e.g. tcp://127.0.0.1:5556.
std::string OperatorEndpoint(const ProjectSpec& spec);
// `host` as it goes into a tcp:// endpoint (an IPv6 literal in brackets).
std::string EndpointHost(const std::string& host);

// Where an identity's key pair lives: kit K holds DIR/BASE.key and DIR/BASE.pub (relative to
// the kit's root, so also to the etc directory).
struct KeyPlace {
  std::string kit;
  std::string dir;
  std::string base;
  std::string key() const { return dir + "/" + base + ".key"; }
  std::string pub() const { return dir + "/" + base + ".pub"; }
};
// role: "server", "client" (a site), "operator" or "project".
KeyPlace KeyPlaceOf(const std::string& role, const std::string& name);

// One identity in the manifest.
struct Identity {
  std::string role;    // server | client | operator | project
  std::string origin;  // sites: "project.yaml" or "add-site"; others: "project.yaml"
  std::string fingerprint;
  std::string signing_fingerprint;  // clients and the project
  std::string created;              // ISO-8601 UTC
  std::string rotated;              // empty: never
  struct Retired {
    std::string fingerprint;
    std::string until;
  };
  std::vector<Retired> retired;  // keys it held before, oldest first
  // Recorded before its key is written: a run that stopped in between left a key that was never
  // shipped, and the next run makes it again.
  bool pending = false;
};

// A revoked identity: a site (--remove-site) or an operator (left out of project.yaml).
struct Removed {
  std::string role;
  std::string fingerprint;
  std::string removed;  // ISO-8601 UTC
};

struct Manifest {
  std::string project;
  std::map<std::string, Identity> identities;            // by name
  std::map<std::string, Removed> removed;                // revoked identities, by name
  std::map<std::string, std::vector<std::string>> kits;  // kit -> its files, relative, sorted
};

inline constexpr char kManifestFile[] = "manifest.json";
inline constexpr char kLockFile[] = ".provision.lock";

// An exclusive lock on the store (flock on OUT/.provision.lock) for a run; released when
// destroyed. FailedPrecondition when another run holds it.
class StoreLock {
 public:
  static StatusOr<std::unique_ptr<StoreLock>> Take(const std::string& out_dir);
  ~StoreLock();
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;

 private:
  explicit StoreLock(int fd) : fd_(fd) {}
  int fd_;
};

// OUT/manifest.json, or nullopt when there is none. FailedPrecondition naming the file and the
// field when it is not one of ours.
StatusOr<std::optional<Manifest>> LoadManifest(const std::string& out_dir);
Status SaveManifest(const std::string& out_dir, const Manifest& manifest,
                    const std::string& updated);

// One file of a kit: its text, or the bytes of a file in the store (`from`, absolute: a key
// file, written by the key step, or a copy of another party's public key).
struct KitFile {
  std::string path;  // relative to the kit's root
  unsigned mode = 0644;
  std::string text;
  std::string from;
};
struct Kit {
  std::string name;  // OUT/NAME/ and OUT/NAME.tar.gz
  std::vector<KitFile> files;
  // Directories that are in the kit even when empty, or whose mode is not 0755.
  std::map<std::string, unsigned> dir_modes;
};

// The kit's directories (those of dir_modes and every parent of a file), sorted, with their
// modes.
std::map<std::string, unsigned> KitDirectories(const Kit& kit);

// The gzipped tarball of `kit` as it is in OUT/NAME/: its directories and files in path order
// (a directory before what it holds), each file's bytes and modification time read from the
// store, a directory's time its newest file's.
StatusOr<std::string> KitTarball(const std::string& out_dir, const Kit& kit);

// Whether every path the kits write, and every file of a kit of `old_manifest` they drop (to be
// deleted with it), is the store's own: FailedPrecondition naming the first file or symbolic link
// in the way that the manifest does not list (nothing foreign is overwritten or deleted, no
// link followed out of the store).
Status CheckStoreOwnsPaths(const std::string& out_dir, const Manifest& old_manifest,
                           const std::vector<Kit>& kits);

// Writes OUT/NAME/: its directories with their modes (the kit's root 0700), the files whose
// bytes differ (atomically; a `from` that is the file itself, a key, is left as it is), each
// with its mode; deletes the files `old_manifest` listed that it no longer has; then writes
// OUT/NAME.tar.gz (0600) when its bytes differ. Whether the tarball changed.
StatusOr<bool> WriteKit(const std::string& out_dir, const Manifest& old_manifest, const Kit& kit);

}  // namespace huddle::cli::provision
