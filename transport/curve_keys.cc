#include "transport/curve_keys.h"

#include <fmt/format.h>
#include <sodium.h>
#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "common/config_reader.h"
#include "common/file_util.h"
#include "proto/messages.h"

namespace huddle::transport {
namespace {

namespace fs = std::filesystem;

constexpr size_t kZ85KeyChars = 40;

std::string KeyFileText(const CurveKeyPair& keys, bool with_secret) {
  const std::string fp = Fingerprint(keys.public_z85);
  std::string text;
  if (with_secret) {
    text = absl::StrCat("# Huddle CurveZMQ key pair of ", keys.role, " '", keys.id, "' (", fp,
                        ").\n# SECRET: keep this file on this machine, mode 0600. Share only the "
                        ".pub file.\n");
  } else {
    text = absl::StrCat("# Huddle CurveZMQ public key of ", keys.role, " '", keys.id, "' (", fp,
                        ").\n",
                        keys.role == "client"
                            ? "# Enroll it by copying this file into the coordinator's allow-list "
                              "directory.\n"
                            : "# Clients pin it: security.server_public_key in their config.\n");
  }
  // Z85 never contains '"' or '\\', so double quotes are always safe.
  absl::StrAppend(&text, "role: ", keys.role, "\nid: \"", keys.id, "\"\npublic_key: \"",
                  keys.public_z85, "\"\n");
  if (with_secret) absl::StrAppend(&text, "secret_key: \"", keys.secret_z85, "\"\n");
  return text;
}

Status CheckNotReadableByOthers(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot stat key file '", path, "'"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(fmt::format(
        "secret key file '{}' is accessible by group or others (mode {:04o}); run: chmod 600 {}",
        path, st.st_mode & 0777, path));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<CurveKeyPair> GenerateKeyPair(std::string role, std::string id) {
  char pub[kZ85KeyChars + 1];
  char sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot generate a CurveZMQ key pair: ", zmq_strerror(zmq_errno()),
                     " (libzmq built without CURVE?)"));
  }
  CurveKeyPair keys{std::move(role), std::move(id), pub, sec};
  sodium_memzero(sec, sizeof(sec));
  return keys;
}

StatusOr<CurveKey> DecodeZ85Key(const std::string& z85, const std::string& what) {
  if (z85.size() != kZ85KeyChars) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be ", kZ85KeyChars, " Z85 characters; got ", z85.size()));
  }
  CurveKey key{};
  if (zmq_z85_decode(key.data(), z85.c_str()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid Z85"));
  }
  return key;
}

std::string EncodeZ85Key(const CurveKey& key) {
  char out[kZ85KeyChars + 1];
  zmq_z85_encode(out, key.data(), key.size());
  return std::string(out, kZ85KeyChars);
}

std::string Fingerprint(const CurveKey& public_key) {
  uint8_t hash[crypto_generichash_BYTES];
  crypto_generichash(hash, sizeof(hash), public_key.data(), public_key.size(), nullptr, 0);
  static const char* kHex = "0123456789abcdef";
  std::string out = "blake2b:";
  for (int i = 0; i < 8; ++i) {
    out.push_back(kHex[hash[i] >> 4]);
    out.push_back(kHex[hash[i] & 15]);
  }
  return out;
}

std::string Fingerprint(const std::string& public_z85) {
  auto key = DecodeZ85Key(public_z85, "key");
  return key.ok() ? Fingerprint(*key) : "invalid-key";
}

Status WriteKeyFiles(const CurveKeyPair& keys, const std::string& dir, const std::string& name) {
  HUDDLE_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string secret_path = (fs::path(dir) / (name + ".key")).string();
  const std::string public_path = (fs::path(dir) / (name + ".pub")).string();
  for (const std::string& p : {secret_path, public_path}) {
    std::error_code ec;
    if (fs::exists(p, ec)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "'", p,
          "' already exists; keygen never overwrites keys (remove it first, or use --out)"));
    }
  }
  HUDDLE_RETURN_IF_ERROR(WriteFileAtomic(secret_path, KeyFileText(keys, true), 0600));
  return WriteFileAtomic(public_path, KeyFileText(keys, false), 0644);
}

StatusOr<CurveKeyPair> ReadKeyFile(const std::string& path, bool need_secret) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap map, ConfigMap::LoadFile(path));
  CurveKeyPair keys;
  HUDDLE_RETURN_IF_ERROR(map.OptionalChoice("role", &keys.role, {"server", "client"}));
  HUDDLE_RETURN_IF_ERROR(map.Optional("id", &keys.id));
  HUDDLE_RETURN_IF_ERROR(map.Optional("public_key", &keys.public_z85));
  HUDDLE_RETURN_IF_ERROR(map.Optional("secret_key", &keys.secret_z85));
  HUDDLE_RETURN_IF_ERROR(map.Finish());
  if (keys.role.empty() || keys.public_z85.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": not a Huddle key file (needs role and public_key; make one with "
                     "`huddle keygen`)"));
  }
  HUDDLE_ASSIGN_OR_RETURN(CurveKey pub, DecodeZ85Key(keys.public_z85, map.Where("public_key")));
  if (keys.secret_z85.empty()) {
    if (need_secret) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " holds only a public key; this needs the secret .key file of the pair"));
    }
    return keys;
  }
  HUDDLE_RETURN_IF_ERROR(CheckNotReadableByOthers(path));
  HUDDLE_ASSIGN_OR_RETURN(CurveKey sec, DecodeZ85Key(keys.secret_z85, map.Where("secret_key")));
  CurveKey derived{};
  if (crypto_scalarmult_base(derived.data(), sec.data()) != 0 || derived != pub) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": public_key does not belong to secret_key (a corrupted or edited "
                     "key file)"));
  }
  sodium_memzero(sec.data(), sec.size());
  return keys;
}

Status AllowList::Add(const CurveKey& key, const std::string& id, const std::string& where) {
  if (!wire::IsValidClientId(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": client id '", id, "' must be 1-128 characters of [A-Za-z0-9._-]"));
  }
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": key ", Fingerprint(key),
                                                   " is already enrolled as '", it->second,
                                                   "'; one key is one client"));
  }
  if (by_id_.count(id) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": client id '", id, "' is enrolled twice with different keys"));
  }
  by_key_.emplace(key, id);
  by_id_.emplace(id, key);
  return absl::OkStatus();
}

StatusOr<AllowList> AllowList::Load(const std::string& path) {
  AllowList list;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      const fs::path& p = entry.path();
      if (p.extension() == ".key") {
        return absl::FailedPreconditionError(absl::StrCat(
            "allow-list directory '", path, "' contains the secret key file '", p.string(),
            "': it belongs on its client only (copy the .pub file instead) and must be removed "
            "from here, and the key pair replaced"));
      }
      if (p.extension() == ".pub" && entry.is_regular_file()) files.push_back(p);
    }
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot list allow-list directory '", path, "': ", ec.message()));
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      HUDDLE_ASSIGN_OR_RETURN(CurveKeyPair k, ReadKeyFile(f.string(), /*need_secret=*/false));
      if (k.role != "client") {
        return absl::InvalidArgumentError(
            absl::StrCat(f.string(), ": role is '", k.role, "'; only client keys are enrolled"));
      }
      HUDDLE_ASSIGN_OR_RETURN(CurveKey key, DecodeZ85Key(k.public_z85, f.string()));
      HUDDLE_RETURN_IF_ERROR(list.Add(key, k.id, f.string()));
    }
    return list;
  }
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("allow-list '", path,
                     "' does not exist (a directory of client .pub files, or a YAML file)"));
  }
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::LoadFile(path));
  if (!top.Has("clients")) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": an allow-list file needs a `clients:` mapping of client id -> public key"));
  }
  HUDDLE_ASSIGN_OR_RETURN(YAML::Node root, [&]() -> StatusOr<YAML::Node> {
    try {
      return YAML::LoadFile(path);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
    }
  }());
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap clients, top.Child("clients"));
  for (const auto& kv : root["clients"]) {
    const std::string id = kv.first.as<std::string>();
    std::string z85;
    HUDDLE_RETURN_IF_ERROR(clients.Optional(id, &z85));
    HUDDLE_ASSIGN_OR_RETURN(CurveKey key, DecodeZ85Key(z85, clients.Where(id)));
    HUDDLE_RETURN_IF_ERROR(list.Add(key, id, clients.Where(id)));
  }
  HUDDLE_RETURN_IF_ERROR(clients.Finish());
  HUDDLE_RETURN_IF_ERROR(top.Finish());
  return list;
}

std::optional<std::string> AllowList::Lookup(const CurveKey& key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

bool AllowList::HasId(const std::string& id) const { return by_id_.count(id) != 0; }

std::string AllowList::Signature(const std::string& path) {
  std::error_code ec;
  auto stamp = [](const fs::path& p) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return absl::StrCat(p.string(), ":missing;");
    return absl::StrCat(p.string(), ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                        st.st_mtim.tv_nsec, ";");
  };
  if (!fs::is_directory(path, ec)) return stamp(path);
  std::vector<std::string> parts;
  for (const auto& entry : fs::directory_iterator(path, ec)) parts.push_back(stamp(entry.path()));
  std::sort(parts.begin(), parts.end());
  std::string out;
  for (const std::string& p : parts) out += p;
  return out;
}

StatusOr<CurveKeyPair> ReadRoleKey(const std::string& path, const char* role, bool need_secret,
                                   const char* what) {
  auto keys = ReadKeyFile(path, need_secret);
  if (!keys.ok()) {
    return Status(keys.status().code(), absl::StrCat(what, ": ", keys.status().message()));
  }
  if (keys->role != role) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " is a ", keys->role, " key; expected a ", role, " key"));
  }
  return keys;
}

}  // namespace huddle::transport
