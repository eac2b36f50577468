// The store of `huddle provision` (cli/provision.h): its manifest and the tarballs of its kits.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/provision_internal.h"
#include "cli/tar_writer.h"
#include "common/file_util.h"

namespace huddle::cli::provision {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kFormat[] = "huddle-provision-manifest-1";
constexpr uint64_t kMaxManifestBytes = 16 << 20;

json ToJson(const Identity& id) {
  json j = {{"role", id.role},
            {"origin", id.origin},
            {"fingerprint", id.fingerprint},
            {"created", id.created},
            {"rotated", id.rotated.empty() ? json(nullptr) : json(id.rotated)},
            {"retired", json::array()}};
  if (!id.signing_fingerprint.empty()) j["signing_fingerprint"] = id.signing_fingerprint;
  for (const Identity::Retired& r : id.retired) {
    j["retired"].push_back({{"fingerprint", r.fingerprint}, {"until", r.until}});
  }
  if (id.pending) j["pending"] = true;
  return j;
}

// Throws nlohmann's exceptions on a wrong type; LoadManifest turns them into an error.
Identity IdentityFromJson(const json& j) {
  Identity id;
  id.role = j.at("role").get<std::string>();
  id.origin = j.at("origin").get<std::string>();
  id.fingerprint = j.at("fingerprint").get<std::string>();
  id.signing_fingerprint = j.value("signing_fingerprint", std::string());
  id.created = j.at("created").get<std::string>();
  if (j.contains("rotated") && !j["rotated"].is_null())
    id.rotated = j["rotated"].get<std::string>();
  const json retired = j.value("retired", json::array());
  for (const json& r : retired) {
    id.retired.push_back(
        {r.at("fingerprint").get<std::string>(), r.at("until").get<std::string>()});
  }
  id.pending = j.value("pending", false);
  if (id.role != "server" && id.role != "client" && id.role != "operator" && id.role != "project") {
    throw std::invalid_argument("role '" + id.role +
                                "' is not server, client, operator or project");
  }
  return id;
}

// Refuses a path inside the store that is, or passes through, a symbolic link (a write would
// leave the store) or something other than what it should be.
Status CheckRealPath(const std::string& root, const std::string& relative, bool directory) {
  fs::path p = root;
  std::error_code ec;
  const fs::path rel(relative);
  for (auto it = rel.begin(); it != rel.end(); ++it) {
    p /= *it;
    const fs::file_status st = fs::symlink_status(p, ec);
    if (!fs::exists(st)) return absl::OkStatus();
    const bool last = std::next(it) == rel.end();
    if (fs::is_symlink(st) ||
        ((!last || directory) ? !fs::is_directory(st) : !fs::is_regular_file(st))) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", p.string(), "' is ",
                       fs::is_symlink(st) ? "a symbolic link" : "not what the kit holds",
                       " there: the store's files are its own; move it away"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<StoreLock>> StoreLock::Take(const std::string& out_dir) {
  const std::string path = out_dir + "/" + kLockFile;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open '", path, "'"));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("another `huddle provision` is running on '", out_dir, "' (", path, ")"));
  }
  return std::unique_ptr<StoreLock>(new StoreLock(fd));
}

StoreLock::~StoreLock() { ::close(fd_); }

KeyPlace KeyPlaceOf(const std::string& role, const std::string& name) {
  if (role == "server") return {"server", "keys", "server"};
  if (role == "project") return {"project", "project", "project"};
  if (role == "operator") return {"operator-" + name, "operators/" + name, name};
  return {name, "agents/" + name, name};
}

StatusOr<std::optional<Manifest>> LoadManifest(const std::string& out_dir) {
  const std::string path = out_dir + "/" + kManifestFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<Manifest>();
  StatusOr<std::string> text = ReadFile(path, kMaxManifestBytes);
  if (!text.ok()) return absl::FailedPreconditionError(text.status().message());
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": ", why,
                     " (the manifest of a store of `huddle provision`; restore it from a "
                     "backup)"));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (j.value("format", std::string()) != kFormat) {
    return bad(absl::StrCat("format is not '", kFormat, "'"));
  }
  Manifest m;
  std::string field = "project";
  try {
    m.project = j.at("project").get<std::string>();
    for (const auto& [name, entry] : j.at("identities").items()) {
      field = "identities." + name;
      m.identities[name] = IdentityFromJson(entry);
    }
    const json removed = j.value("removed", json::object());
    for (const auto& [name, entry] : removed.items()) {
      field = "removed." + name;
      m.removed[name] = {entry.at("role").get<std::string>(),
                         entry.at("fingerprint").get<std::string>(),
                         entry.at("removed").get<std::string>()};
    }
    for (const auto& [kit, files] : j.at("kits").items()) {
      field = "kits." + kit;
      std::vector<std::string>& list = m.kits[kit];
      for (const json& f : files) list.push_back(f.get<std::string>());
    }
  } catch (const std::exception& e) {
    return bad(absl::StrCat(field, ": ", e.what()));
  }
  // The kits' names and files are paths inside the store: nothing in them may lead outside it.
  for (const auto& [kit, files] : m.kits) {
    if (!IsValidPartyName(kit.rfind("operator-", 0) == 0 ? kit.substr(9) : kit)) {
      return bad(absl::StrCat("kits: '", kit, "' is not a kit's name"));
    }
    for (const std::string& f : files) {
      const fs::path p(f);
      bool escapes = f.empty() || p.is_absolute();
      for (const auto& part : p) escapes |= part == ".." || part == ".";
      if (escapes) return bad(absl::StrCat("kits.", kit, ": '", f, "' is not a relative path"));
    }
  }
  return std::optional<Manifest>(std::move(m));
}

Status SaveManifest(const std::string& out_dir, const Manifest& m, const std::string& updated) {
  json j = {{"format", kFormat},         {"project", m.project},
            {"updated", updated},        {"identities", json::object()},
            {"removed", json::object()}, {"kits", json::object()}};
  for (const auto& [name, id] : m.identities) j["identities"][name] = ToJson(id);
  for (const auto& [name, r] : m.removed) {
    j["removed"][name] = {{"role", r.role}, {"fingerprint", r.fingerprint}, {"removed", r.removed}};
  }
  for (const auto& [kit, files] : m.kits) j["kits"][kit] = files;
  return WriteFileAtomic(out_dir + "/" + kManifestFile, j.dump(2) + "\n", 0600);
}

std::map<std::string, unsigned> KitDirectories(const Kit& kit) {
  std::map<std::string, unsigned> dirs;
  auto add = [&](fs::path p) {
    for (; !p.empty(); p = p.parent_path()) {
      auto it = kit.dir_modes.find(p.string());
      dirs[p.string()] = it == kit.dir_modes.end() ? 0755 : it->second;
    }
  };
  for (const auto& [dir, mode] : kit.dir_modes) add(dir);  // an empty one too
  for (const KitFile& f : kit.files) add(fs::path(f.path).parent_path());
  return dirs;
}

StatusOr<std::string> KitTarball(const std::string& out_dir, const Kit& kit) {
  const std::string root = out_dir + "/" + kit.name;
  struct Entry {
    unsigned mode;
    bool directory;
    int64_t mtime_s = 0;
    std::string contents;
  };
  std::map<std::string, Entry> entries;  // path order: a directory before what it holds
  for (const auto& [dir, mode] : KitDirectories(kit)) entries[dir] = {mode, true};
  for (const KitFile& f : kit.files) {
    const std::string path = root + "/" + f.path;
    HUDDLE_ASSIGN_OR_RETURN(std::string contents, ReadFile(path));
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return absl::InternalError("cannot stat '" + path + "'");
    entries[f.path] = {f.mode, false, static_cast<int64_t>(st.st_mtime), std::move(contents)};
    for (fs::path p = fs::path(f.path).parent_path(); !p.empty(); p = p.parent_path()) {
      Entry& dir = entries[p.string()];
      dir.mtime_s = std::max(dir.mtime_s, static_cast<int64_t>(st.st_mtime));
    }
  }
  TarWriter tar;
  for (const auto& [path, e] : entries) {
    HUDDLE_RETURN_IF_ERROR(e.directory ? tar.AddDirectory(path, e.mode, e.mtime_s)
                                       : tar.AddFile(path, e.contents, e.mode, e.mtime_s));
  }
  return Gzip(tar.Finish());
}

Status CheckStoreOwnsPaths(const std::string& out_dir, const Manifest& old_manifest,
                           const std::vector<Kit>& kits) {
  std::set<std::string> kept;
  for (const Kit& kit : kits) {
    kept.insert(kit.name);
    const std::string root = out_dir + "/" + kit.name;
    auto old = old_manifest.kits.find(kit.name);
    std::error_code ec;
    if (old == old_manifest.kits.end()) {
      for (const std::string& p : {root, root + ".tar.gz"}) {
        if (fs::exists(fs::symlink_status(p, ec))) {
          return absl::FailedPreconditionError(absl::StrCat(
              "'", p, "' is in the way of kit '", kit.name,
              "' and is not one of this store's (manifest.json does not list it): move it away"));
        }
      }
      continue;
    }
    const std::set<std::string> ours(old->second.begin(), old->second.end());
    HUDDLE_RETURN_IF_ERROR(CheckRealPath(out_dir, kit.name, /*directory=*/true));
    HUDDLE_RETURN_IF_ERROR(CheckRealPath(out_dir, kit.name + ".tar.gz", /*directory=*/false));
    for (const auto& [dir, mode] : KitDirectories(kit)) {
      HUDDLE_RETURN_IF_ERROR(CheckRealPath(root, dir, /*directory=*/true));
    }
    for (const KitFile& f : kit.files) {
      HUDDLE_RETURN_IF_ERROR(CheckRealPath(root, f.path, /*directory=*/false));
      if (fs::exists(fs::symlink_status(root + "/" + f.path, ec)) && !ours.count(f.path)) {
        return absl::FailedPreconditionError(
            absl::StrCat("'", root, "/", f.path, "' is not a file of this store's kit '", kit.name,
                         "' (manifest.json does not list it): move it away"));
      }
    }
  }
  // A kit to delete holds only what the manifest lists (and the directories of that).
  for (const auto& [name, files] : old_manifest.kits) {
    if (kept.count(name)) continue;
    const std::string root = out_dir + "/" + name;
    HUDDLE_RETURN_IF_ERROR(CheckRealPath(out_dir, name, /*directory=*/true));
    HUDDLE_RETURN_IF_ERROR(CheckRealPath(out_dir, name + ".tar.gz", /*directory=*/false));
    const std::set<std::string> ours(files.begin(), files.end());
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(root, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      const std::string rel = it->path().lexically_relative(root).string();
      const fs::file_status st = it->symlink_status(ec);
      if (fs::is_directory(st) || (fs::is_regular_file(st) && ours.count(rel))) continue;
      return absl::FailedPreconditionError(
          absl::StrCat("'", it->path().string(), "' would be deleted with kit '", name,
                       "', but is not one of its files (manifest.json): move it away first"));
    }
  }
  return absl::OkStatus();
}

StatusOr<bool> WriteKit(const std::string& out_dir, const Manifest& old_manifest, const Kit& kit) {
  const std::string root = out_dir + "/" + kit.name;
  std::error_code ec;
  HUDDLE_RETURN_IF_ERROR(MakeDirs(root));
  fs::permissions(root, fs::perms::owner_all, ec);
  const auto dirs = KitDirectories(kit);
  for (const auto& [dir, mode] : dirs) {
    HUDDLE_RETURN_IF_ERROR(MakeDirs(root + "/" + dir));
    fs::permissions(root + "/" + dir, static_cast<fs::perms>(mode), ec);
  }
  std::set<std::string> now;
  for (const KitFile& f : kit.files) {
    const std::string path = root + "/" + f.path;
    now.insert(f.path);
    if (f.from != path) {
      std::string contents = f.text;
      if (!f.from.empty()) {
        HUDDLE_ASSIGN_OR_RETURN(contents, ReadFile(f.from));
      }
      StatusOr<std::string> existing = ReadFile(path);
      if (!existing.ok() || *existing != contents) {
        HUDDLE_RETURN_IF_ERROR(WriteFileAtomic(path, contents, f.mode));
      }
    }
    fs::permissions(path, static_cast<fs::perms>(f.mode), ec);
  }
  auto old = old_manifest.kits.find(kit.name);
  if (old != old_manifest.kits.end()) {
    for (const std::string& f : old->second) {
      if (now.count(f)) continue;
      fs::remove(root + "/" + f, ec);
      for (fs::path d = fs::path(f).parent_path(); !d.empty() && !dirs.count(d.string());
           d = d.parent_path()) {
        fs::remove(root + "/" + d.string(), ec);  // only if empty
      }
    }
  }
  HUDDLE_ASSIGN_OR_RETURN(std::string tarball, KitTarball(out_dir, kit));
  const std::string path = root + ".tar.gz";
  StatusOr<std::string> existing = ReadFile(path);
  const bool changed = !existing.ok() || *existing != tarball;
  if (changed) HUDDLE_RETURN_IF_ERROR(WriteFileAtomic(path, tarball, 0600));
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write, ec);
  return changed;
}

}  // namespace huddle::cli::provision
