// One run of `huddle provision` (cli/provision.h):
//   1. the directories and --out checked (OUT outside the installed trees and any other store),
//      OUT locked, its manifest read (a directory without one must be empty);
//   2. the parties planned from project.yaml, the manifest and the action, and every kept key
//      read back and checked against the manifest's fingerprint;
//   3. every kit laid out in memory, and every path it writes or deletes checked to be the
//      store's own (no foreign file is overwritten or deleted, no symbolic link followed);
//   4. the manifest written with the new keys marked pending, then the keys, the public files
//      (certified with the project key under secure aggregation), the kits (only the files whose
//      bytes change) and their tarballs, the deleted kits, and the manifest again, final.
// A run stopped anywhere leaves a store the next run completes: a pending key that is missing or
// not the manifest's is made again (it was never shipped).
#include "cli/provision.h"

#include <filesystem>
#include <memory>
#include <set>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/provision_internal.h"
#include "common/file_util.h"
#include "common/member_certificate.h"
#include "common/signing.h"
#include "common/time_format.h"
#include "transport/curve_keys.h"

namespace huddle::cli {
namespace {

namespace fs = std::filesystem;
using provision::Identity;
using provision::Kit;
using provision::KitFile;
using provision::Manifest;

// One identity of this run.
struct Party {
  std::string name;
  std::string role;    // server | client | operator | project
  std::string origin;  // project.yaml | add-site
  ProjectSite site;    // sites: the project.yaml entry (a bare name for an added site)
  provision::KeyPlace place;
  transport::CurveKeyPair keys;
  enum class Key { kKept, kNew, kRotated } key = Key::kKept;
  std::string old_fingerprint;  // kRotated
  bool resumed = false;         // its manifest entry was pending
};

// The key's name in the manifest and the READMEs: the CurveZMQ key's fingerprint, or the
// signing key's for the project (it has no CurveZMQ key).
std::string FingerprintOf(const transport::CurveKeyPair& keys) {
  if (keys.role != "project") return transport::Fingerprint(keys.public_z85);
  auto signing = transport::SigningPublicKeyOf(keys, keys.id);
  return signing.ok() ? SigningFingerprint(*signing) : "invalid-key";
}

// Whether `inner` is `outer` or lies inside it, symbolic links resolved.
bool IsWithin(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(inner, ec), b = fs::weakly_canonical(outer, ec);
  auto ai = a.begin();
  for (auto bi = b.begin(); bi != b.end(); ++bi, ++ai) {
    if (bi->empty()) continue;  // a trailing '/'
    if (ai == a.end() || *ai != *bi) return false;
  }
  return true;
}

std::string Absolute(const std::string& path) {
  std::string p = fs::absolute(path).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

class ProvisionRun {
 public:
  explicit ProvisionRun(const ProvisionOptions& o) : o_(o) {}
  StatusOr<ProvisionResult> Run();

 private:
  Status OpenStore();
  Status PlanParties();
  Status ApplyAction();
  Status CheckOutEntries() const;
  Status LoadOrMakeKeys();
  std::vector<Kit> Layout() const;
  Status WriteKeys();
  Manifest NextManifest(bool pending, const std::vector<Kit>& kits) const;
  std::string StorePath(const Party& p, bool secret) const {
    return absl::StrCat(out_, "/", p.place.kit, "/", secret ? p.place.key() : p.place.pub());
  }
  std::string Shown(const std::string& kit) const {  // as the user named OUT
    return (fs::path(o_.out_dir) / kit).lexically_normal().string();
  }

  ProvisionOptions o_;
  provision::Dirs dirs_;
  std::string out_;
  ProjectSpec spec_;
  std::unique_ptr<provision::StoreLock> lock_;
  Manifest old_;
  std::map<std::string, Party> parties_;  // by name
  std::map<std::string, provision::Removed> removed_now_;
  std::string now_;
  ProvisionResult result_;
};

Status ProvisionRun::OpenStore() {
  for (const auto& [flag, dir] :
       {std::pair{"--etc-dir", &o_.etc_dir}, std::pair{"--state-dir", &o_.state_dir}}) {
    if (!fs::path(*dir).is_absolute()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", *dir, "' must be an absolute path (it goes into the configs)"));
    }
  }
  dirs_.etc = Absolute(o_.etc_dir);
  dirs_.state = Absolute(o_.state_dir);
  if (o_.out_dir.empty()) return absl::InvalidArgumentError("--out: required");
  out_ = Absolute(o_.out_dir);
  for (const auto& [flag, dir] :
       {std::pair{"--etc-dir", dirs_.etc}, std::pair{"--state-dir", dirs_.state}}) {
    if (IsWithin(out_, dir)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--out '", o_.out_dir, "' is inside ", flag, " '", dir,
          "': the store holds every party's secret key; keep it outside the installed trees (and "
          "off the coordinator host)"));
    }
  }
  for (fs::path p = fs::path(out_).parent_path(); p != p.root_path(); p = p.parent_path()) {
    std::error_code ec;
    if (fs::exists(p / provision::kManifestFile, ec) && fs::exists(p / provision::kLockFile, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--out '", o_.out_dir, "' is inside '", p.string(),
                       "', a store of `huddle provision`: choose a directory outside it"));
    }
  }
  std::error_code ec;
  const fs::file_status st = fs::status(out_, ec);  // OUT itself may be a link to a directory
  if (fs::exists(st) && !fs::is_directory(st)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--out '", o_.out_dir, "' is not a directory"));
  }
  HUDDLE_RETURN_IF_ERROR(MakeDirs(out_));
  fs::permissions(out_, fs::perms::owner_all, ec);  // 0700: every secret key is in it
  HUDDLE_ASSIGN_OR_RETURN(lock_, provision::StoreLock::Take(out_));
  HUDDLE_ASSIGN_OR_RETURN(std::optional<Manifest> manifest, provision::LoadManifest(out_));
  if (!manifest) {
    for (const auto& entry : fs::directory_iterator(out_, ec)) {
      if (entry.path().filename() == provision::kLockFile) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "--out '", o_.out_dir, "' holds '", entry.path().filename().string(),
          "' but no manifest.json: it is not a store of `huddle provision`; give an empty or new "
          "directory"));
    }
    return absl::OkStatus();
  }
  if (manifest->project != spec_.project) {
    return absl::FailedPreconditionError(
        absl::StrCat("--out '", o_.out_dir, "' is the store of project '", manifest->project,
                     "' (manifest.json); ", o_.project_file, " is project '", spec_.project,
                     "': give another --out"));
  }
  old_ = *std::move(manifest);
  return absl::OkStatus();
}

Status ProvisionRun::PlanParties() {
  auto add = [&](const std::string& name, const std::string& role, const std::string& origin,
                 ProjectSite site) -> Status {
    auto old = old_.identities.find(name);
    if (old != old_.identities.end() && old->second.role != role) {
      return absl::InvalidArgumentError(
          absl::StrCat(o_.project_file, ": '", name, "' is enrolled as ",
                       old->second.role == "client" ? "a site" : "an operator",
                       " (manifest.json): a name is one identity; choose another name"));
    }
    site.name = name;
    parties_[name] = Party{name, role, origin, std::move(site), provision::KeyPlaceOf(role, name)};
    return absl::OkStatus();
  };
  HUDDLE_RETURN_IF_ERROR(add("server", "server", "project.yaml", {}));
  if (spec_.secure_aggregation || old_.identities.count("project")) {
    HUDDLE_RETURN_IF_ERROR(add("project", "project", "project.yaml", {}));
  }
  const bool adding = o_.action == ProvisionOptions::Action::kAddSite;
  for (const ProjectSite& site : spec_.sites) {
    auto removed = old_.removed.find(site.name);
    if (removed != old_.removed.end() && removed->second.role == "client" &&
        !(adding && o_.target == site.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(o_.project_file, ": sites.", site.name, ": revoked by --remove-site on ",
                       removed->second.removed,
                       ": delete it from project.yaml, or enrol it again with "
                       "--add-site ",
                       site.name, " (a new key)"));
    }
    HUDDLE_RETURN_IF_ERROR(add(site.name, "client", "project.yaml", site));
  }
  for (const auto& [name, id] : old_.identities) {
    if (id.role != "client" || parties_.count(name)) continue;
    const bool removing = o_.action == ProvisionOptions::Action::kRemoveSite && o_.target == name;
    if (id.origin != "add-site" && !removing) {
      return absl::InvalidArgumentError(absl::StrCat(
          o_.project_file, ": sites: '", name, "' is enrolled (manifest.json: key ", id.fingerprint,
          ", created ", id.created,
          ") but no longer in project.yaml: put it back, or revoke it with --remove-site ", name));
    }
    HUDDLE_RETURN_IF_ERROR(add(name, "client", id.origin, {}));
  }
  for (const std::string& name : spec_.operators) {
    HUDDLE_RETURN_IF_ERROR(add(name, "operator", "project.yaml", {}));
  }
  for (const auto& [name, id] : old_.identities) {
    if (id.role == "operator" && !parties_.count(name)) {
      removed_now_[name] = {"operator", id.fingerprint, now_};
      result_.lines.push_back(absl::StrCat("operator ", name, ": no longer in project.yaml: ",
                                           "revoked (its key leaves keys/operators; ",
                                           Shown("operator-" + name), " deleted)"));
    }
  }
  return ApplyAction();
}

Status ProvisionRun::ApplyAction() {
  const std::string& t = o_.target;
  std::vector<std::string> sites;
  for (const auto& [name, p] : parties_) {
    if (p.role == "client" && old_.identities.count(name)) sites.push_back(name);
  }
  const std::string known =
      absl::StrCat("sites: ", sites.empty() ? "none" : absl::StrJoin(sites, ", "));
  switch (o_.action) {
    case ProvisionOptions::Action::kNone:
      return absl::OkStatus();
    case ProvisionOptions::Action::kAddSite: {
      if (!IsValidPartyName(t) || t == "server" || t == "project") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--add-site: '", t,
            "' is not a site's name (1-64 characters of [A-Za-z0-9._-] starting with a letter "
            "or a digit; not 'server' or 'project')"));
      }
      auto old = old_.identities.find(t);
      if (old != old_.identities.end()) {
        return absl::AlreadyExistsError(
            absl::StrCat("--add-site ", t, ": already enrolled as ",
                         old->second.role == "client" ? "a site" : "an operator", " (key ",
                         old->second.fingerprint, ", manifest.json)"));
      }
      auto p = parties_.find(t);
      if (p != parties_.end() && p->second.role != "client") {
        return absl::AlreadyExistsError(
            absl::StrCat("--add-site ", t, ": an operator of project.yaml has that name"));
      }
      if (p == parties_.end()) {
        ProjectSite site;
        site.name = t;
        parties_[t] = Party{t, "client", "add-site", site, provision::KeyPlaceOf("client", t)};
      }
      return absl::OkStatus();
    }
    case ProvisionOptions::Action::kRotate:
      if (!parties_.count(t) || !old_.identities.count(t)) {
        return absl::NotFoundError(absl::StrCat(
            "--rotate ", t, ": ",
            parties_.count(t) ? "it has no key yet (this run makes its first)"
                              : absl::StrCat("no such identity in '", o_.out_dir, "' (", known,
                                             "; the operators of project.yaml; server",
                                             parties_.count("project") ? ", project)" : ")")));
      }
      return absl::OkStatus();
    case ProvisionOptions::Action::kRemoveSite: {
      auto p = parties_.find(t);
      if (p == parties_.end() || p->second.role != "client" || !old_.identities.count(t)) {
        return absl::NotFoundError(absl::StrCat("--remove-site ", t, ": no enrolled site '", t,
                                                "' in '", o_.out_dir, "' (", known, ")"));
      }
      removed_now_[t] = {"client", old_.identities.at(t).fingerprint, now_};
      parties_.erase(p);
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

// Every name in OUT is one thing: a kit's directory, a tarball, the manifest, the lock.
Status ProvisionRun::CheckOutEntries() const {
  std::map<std::string, std::string> owner = {{provision::kManifestFile, "the manifest"},
                                              {provision::kLockFile, "the lock"}};
  for (const auto& [name, p] : parties_) {
    const std::string who =
        absl::StrCat(p.role == "client" ? std::string("site") : p.role, " ", name);
    for (const std::string& entry : {p.place.kit, p.place.kit + ".tar.gz"}) {
      auto [it, fresh] = owner.emplace(entry, who);
      if (!fresh) {
        return absl::InvalidArgumentError(
            absl::StrCat(o_.project_file, ": ", who, "'s kit would be ", Shown(entry),
                         ", which is ", it->second, "'s: rename one of them"));
      }
    }
  }
  return absl::OkStatus();
}

Status ProvisionRun::LoadOrMakeKeys() {
  for (auto& [name, p] : parties_) {
    auto old = old_.identities.find(name);
    const bool rotate = o_.action == ProvisionOptions::Action::kRotate && o_.target == name;
    if (old != old_.identities.end() && !rotate) {
      const Identity& id = old->second;
      const std::string path = StorePath(p, true);
      auto read = transport::ReadKeyFile(path, /*need_secret=*/true);
      const bool matches = read.ok() && read->role == p.role && read->id == name &&
                           FingerprintOf(*read) == id.fingerprint;
      if (matches) {
        p.keys = *std::move(read);
        continue;
      }
      if (!id.pending) {
        return absl::FailedPreconditionError(absl::StrCat(
            read.ok() ? absl::StrCat("'", path, "' holds ", read->role, " '", read->id, "' key ",
                                     FingerprintOf(*read))
                      : std::string(read.status().message()),
            "; manifest.json records ", name, "'s key ", id.fingerprint, " (created ", id.created,
            "): restore the file (this directory is the store of every key), or make a new key "
            "with --rotate ",
            name));
      }
      // Recorded by a run that stopped before writing it: never shipped, made again.
      p.resumed = true;
      p.key = id.retired.empty() ? Party::Key::kNew : Party::Key::kRotated;
      if (!id.retired.empty()) p.old_fingerprint = id.retired.back().fingerprint;
    } else if (rotate) {
      p.key = Party::Key::kRotated;
      p.old_fingerprint = old->second.fingerprint;
    } else {
      p.key = Party::Key::kNew;
    }
    HUDDLE_ASSIGN_OR_RETURN(p.keys, transport::GenerateKeyPair(p.role, name));
  }
  return absl::OkStatus();
}

std::vector<Kit> ProvisionRun::Layout() const {
  provision::Fingerprints keys;
  for (const auto& [name, p] : parties_) {
    const std::string fp = FingerprintOf(p.keys);
    keys[p.role == "client"     ? "site:" + name
         : p.role == "operator" ? "operator:" + name
                                : name] = fp;
  }
  auto self = [&](const Party& p, const std::string& dir) {
    return std::vector<KitFile>{{dir + "/" + p.place.base + ".key", 0600, "", StorePath(p, true)},
                                {dir + "/" + p.place.base + ".pub", 0644, "", StorePath(p, false)}};
  };
  const Party& server = parties_.at("server");
  Kit server_kit{
      "server", self(server, "keys"), {{"keys/allowed", 0755}, {"keys/operators", 0755}}};
  server_kit.files.push_back({"server.yaml", 0644, provision::ServerYaml(spec_, dirs_), ""});
  server_kit.files.push_back({"README.md", 0644, provision::ServerReadme(spec_, dirs_, keys), ""});
  std::vector<Kit> kits;
  for (const auto& [name, p] : parties_) {
    if (p.role == "client") {
      server_kit.files.push_back({"keys/allowed/" + name + ".pub", 0644, "", StorePath(p, false)});
      const std::string dir = p.place.dir;
      Kit kit{p.place.kit, self(p, dir), {}};
      kit.files.push_back(
          {dir + "/agent.yaml", 0644, provision::AgentYaml(spec_, p.site, dirs_), ""});
      kit.files.push_back(
          {dir + "/README.md", 0644, provision::SiteReadme(spec_, p.site, dirs_, keys), ""});
      kit.files.push_back({dir + "/server.pub", 0644, "", StorePath(server, false)});
      if (spec_.secure_aggregation) {
        kit.files.push_back(
            {dir + "/project.pub", 0644, "", StorePath(parties_.at("project"), false)});
      }
      kits.push_back(std::move(kit));
    } else if (p.role == "operator") {
      server_kit.files.push_back(
          {"keys/operators/" + name + ".pub", 0644, "", StorePath(p, false)});
      const std::string dir = p.place.dir;
      Kit kit{p.place.kit, self(p, dir), {{dir, 0700}}};
      kit.files.push_back(
          {dir + "/README.md", 0644, provision::OperatorReadme(spec_, name, dirs_, keys), ""});
      kit.files.push_back({dir + "/server.pub", 0644, "", StorePath(server, false)});
      kits.push_back(std::move(kit));
    } else if (p.role == "project") {
      Kit kit{"project", self(p, "project"), {{"project", 0700}}};
      kit.files.push_back({"project/README.md", 0644, provision::ProjectReadme(spec_, keys), ""});
      kits.push_back(std::move(kit));
    }
  }
  kits.insert(kits.begin(), std::move(server_kit));
  for (Kit& kit : kits) {
    std::sort(kit.files.begin(), kit.files.end(),
              [](const KitFile& a, const KitFile& b) { return a.path < b.path; });
  }
  return kits;
}

// A client's certificate by the project key (common/member_certificate.h), no expiry: its id,
// transport key and signing key.
StatusOr<transport::CurveKeyPair> Certified(const transport::CurveKeyPair& keys,
                                            const SigningKey& project) {
  HUDDLE_ASSIGN_OR_RETURN(MemberCertificate c, CertificateFor(keys, /*not_after=*/0));
  return transport::WithCertificate(keys, Certify(c, project));
}

Status ProvisionRun::WriteKeys() {
  std::error_code ec;
  for (auto& [name, p] : parties_) {
    if (p.key == Party::Key::kKept) continue;
    fs::remove(StorePath(p, true), ec);  // a rotated key's old pair, or a pending one's
    fs::remove(StorePath(p, false), ec);
    HUDDLE_RETURN_IF_ERROR(transport::WriteKeyFiles(
        p.keys, absl::StrCat(out_, "/", p.place.kit, "/", p.place.dir), p.place.base));
  }
  std::optional<SigningKey> project;
  if (spec_.secure_aggregation) {
    HUDDLE_ASSIGN_OR_RETURN(
        SigningKey key, transport::SigningKeyOf(parties_.at("project").keys, "the project key"));
    project = key;
  }
  // Each public file as it should be: certified by the project key under secure aggregation
  // (the allow-list's copy is what the members' certificates come from), plain otherwise.
  for (auto& [name, p] : parties_) {
    fs::permissions(StorePath(p, true), fs::perms::owner_read | fs::perms::owner_write, ec);
    transport::CurveKeyPair pub = p.keys;
    pub.certificate_z85.clear();
    pub.certificate_not_after = 0;
    if (p.role == "client" && project) {
      HUDDLE_ASSIGN_OR_RETURN(pub, Certified(pub, *project));
    }
    auto now = transport::ReadKeyFile(StorePath(p, false), /*need_secret=*/false);
    const bool same = now.ok() && now->role == pub.role && now->id == pub.id &&
                      now->public_z85 == pub.public_z85 &&
                      now->signing_public_z85 == pub.signing_public_z85 &&
                      now->certificate_z85 == pub.certificate_z85 &&
                      now->certificate_not_after == pub.certificate_not_after &&
                      now->secret_z85.empty() && now->signing_seed_z85.empty();
    if (!same) HUDDLE_RETURN_IF_ERROR(transport::RewritePublicFile(pub, StorePath(p, false)));
  }
  return absl::OkStatus();
}

Manifest ProvisionRun::NextManifest(bool pending, const std::vector<Kit>& kits) const {
  Manifest m;
  m.project = spec_.project;
  m.removed = old_.removed;
  for (const auto& [name, r] : removed_now_) m.removed[name] = r;
  for (const auto& [name, p] : parties_) {
    m.removed.erase(name);  // enrolled again
    auto old = old_.identities.find(name);
    Identity id = old == old_.identities.end() ? Identity{} : old->second;
    id.role = p.role;
    id.origin = p.origin;
    if (p.key == Party::Key::kNew) {
      id = Identity{p.role, p.origin};
      id.created = now_;
    } else if (p.key == Party::Key::kRotated) {
      if (!p.resumed) id.retired.push_back({p.old_fingerprint, now_});
      id.rotated = now_;
    }
    id.fingerprint = FingerprintOf(p.keys);
    if (p.role == "client") {
      auto signing = transport::SigningPublicKeyOf(p.keys, name);
      id.signing_fingerprint = signing.ok() ? SigningFingerprint(*signing) : "";
    }
    id.pending = pending && p.key != Party::Key::kKept;
    m.identities[name] = std::move(id);
  }
  if (pending) m.kits = old_.kits;  // until the run ends, what it may delete stays the store's
  for (const Kit& kit : kits) {
    std::set<std::string> files(m.kits[kit.name].begin(), m.kits[kit.name].end());
    for (const KitFile& f : kit.files) files.insert(f.path);
    m.kits[kit.name].assign(files.begin(), files.end());
  }
  return m;
}

StatusOr<ProvisionResult> ProvisionRun::Run() {
  now_ = Iso8601Utc(o_.clock->WallMs());
  HUDDLE_ASSIGN_OR_RETURN(spec_, LoadProjectSpec(o_.project_file));
  HUDDLE_RETURN_IF_ERROR(OpenStore());
  HUDDLE_RETURN_IF_ERROR(PlanParties());
  HUDDLE_RETURN_IF_ERROR(CheckOutEntries());
  HUDDLE_RETURN_IF_ERROR(LoadOrMakeKeys());
  const std::vector<Kit> kits = Layout();
  HUDDLE_RETURN_IF_ERROR(provision::CheckStoreOwnsPaths(out_, old_, kits));
  HUDDLE_RETURN_IF_ERROR(SaveManifest(out_, NextManifest(/*pending=*/true, kits), now_));
  HUDDLE_RETURN_IF_ERROR(WriteKeys());
  std::map<std::string, bool> changed;
  for (const Kit& kit : kits) {
    HUDDLE_ASSIGN_OR_RETURN(changed[kit.name], provision::WriteKit(out_, old_, kit));
  }
  std::error_code ec;
  for (const auto& [name, files] : old_.kits) {
    if (changed.count(name)) continue;
    fs::remove_all(out_ + "/" + name, ec);
    fs::remove(out_ + "/" + name + ".tar.gz", ec);
  }
  HUDDLE_RETURN_IF_ERROR(SaveManifest(out_, NextManifest(/*pending=*/false, kits), now_));

  for (const auto& [name, r] : removed_now_) {
    if (r.role != "client") continue;
    result_.lines.push_back(absl::StrCat("site ", name, ": removed: its key ", r.fingerprint,
                                         " leaves the allow-list; ", Shown(name), " deleted"));
    for (const ProjectSite& s : spec_.sites) {
      if (s.name == name) {
        result_.warnings.push_back(
            absl::StrCat("site ", name, " is still in ", o_.project_file,
                         ": delete it there (the next run refuses a revoked site it lists)"));
      }
    }
  }
  std::vector<const Party*> order;  // server, project, sites, operators
  for (const char* role : {"server", "project", "client", "operator"}) {
    for (const auto& [name, p] : parties_) {
      if (p.role == role) order.push_back(&p);
    }
  }
  for (const Party* party : order) {
    const Party& p = *party;
    const std::string& name = p.name;
    const char* what = p.key == Party::Key::kKept  ? "kept"
                       : p.key == Party::Key::kNew ? "new"
                                                   : "rotated";
    const std::string kind = p.role == "client" ? "site" : p.role;
    result_.lines.push_back(absl::StrCat(
        kind, name == kind ? "" : " " + name, ": ", Shown(p.place.kit + ".tar.gz"),
        changed[p.place.kit] ? " written" : " unchanged", "; key ", FingerprintOf(p.keys), " ",
        what, p.key == Party::Key::kRotated ? " (was " + p.old_fingerprint + ")" : ""));
    if (p.role == "client" && p.site.datasets_yaml.empty() && changed[p.place.kit]) {
      result_.warnings.push_back(
          absl::StrCat("site ", name,
                       ": its agent.yaml declares no data set yet: the site edits "
                       "it before starting the agent (its README.md says so)"));
    }
  }
  if (!spec_.secure_aggregation && parties_.count("project")) {
    result_.warnings.push_back(
        "the project key is kept (secure_aggregation is off): the sites no longer pin it");
  }
  result_.lines.push_back(absl::StrCat(
      "ship each kit written to its host (its README.md says what to run there); after a site "
      "is added, rotated or removed, install the server's new allow-list (",
      Shown("server/README.md"), ")"));
  return result_;
}

}  // namespace

StatusOr<ProvisionResult> Provision(const ProvisionOptions& options) {
  try {
    ProvisionRun run(options);
    return run.Run();
  } catch (const std::exception& e) {  // std::filesystem's, yaml-cpp's: an error, never an abort
    return absl::InternalError(absl::StrCat("provision: ", e.what()));
  }
}

bool IsProvisionUsageError(const Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
      return true;
    default:
      return false;
  }
}

}  // namespace huddle::cli
