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
  if (keys.role == "project") {
    std::string text = absl::StrCat(
        "# Huddle project key '", keys.id, "'",
        with_secret ? ": it certifies the members of secure aggregation.\n# SECRET: the privacy "
                      "owner keeps this file; never on the coordinator's machine. Mode 0600.\n"
                    : ".\n# Clients pin it: security.project_public_key in their config.\n",
        "role: project\nid: \"", keys.id, "\"\nsigning_key: \"", keys.signing_public_z85, "\"\n");
    if (with_secret) absl::StrAppend(&text, "signing_seed: \"", keys.signing_seed_z85, "\"\n");
    return text;
  }
  const std::string fp = Fingerprint(keys.public_z85);
  std::string text;
  if (with_secret) {
    text =
        absl::StrCat("# Huddle CurveZMQ key pair of ", keys.role, " '", keys.id, "' (", fp, ").\n",
                     keys.role == "operator"
                         ? "# It authenticates operator commands (`huddle submit --key`, ...); "
                           "its .pub goes in the\n# service's security.operators directory.\n"
                         : "",
                     "# SECRET: keep this file on this machine, mode 0600. Share only the "
                     ".pub file.\n");
  } else {
    text = absl::StrCat(
        "# Huddle CurveZMQ public key of ", keys.role, " '", keys.id, "' (", fp, ").\n",
        keys.role == "client"
            ? "# Enroll it by copying this file into the coordinator's allow-list "
              "directory.\n"
        : keys.role == "operator"
            ? "# An operator of `huddle serve` (submit, jobs, stop...): enroll it by "
              "copying this file into\n# the service's security.operators "
              "directory (never into its clients' allow-list).\n"
            : "# Clients pin it: security.server_public_key in their config.\n");
  }
  // Z85 never contains '"' or '\\', so double quotes are always safe.
  absl::StrAppend(&text, "role: ", keys.role, "\nid: \"", keys.id, "\"\npublic_key: \"",
                  keys.public_z85, "\"\n");
  if (with_secret) absl::StrAppend(&text, "secret_key: \"", keys.secret_z85, "\"\n");
  if (!keys.signing_public_z85.empty()) {
    absl::StrAppend(&text, "signing_key: \"", keys.signing_public_z85, "\"\n");
  }
  if (with_secret && !keys.signing_seed_z85.empty()) {
    absl::StrAppend(&text, "signing_seed: \"", keys.signing_seed_z85, "\"\n");
  }
  if (!with_secret && !keys.certificate_z85.empty()) {
    absl::StrAppend(&text, "certificate: \"", keys.certificate_z85,
                    "\"\ncertificate_not_after: ", keys.certificate_not_after, "\n");
  }
  return text;
}

// Z85 of 32 or 64 bytes.
template <size_t N>
std::string EncodeZ85(const std::array<uint8_t, N>& bytes) {
  char out[N * 5 / 4 + 1];
  zmq_z85_encode(out, bytes.data(), N);
  return std::string(out, N * 5 / 4);
}
template <size_t N>
StatusOr<std::array<uint8_t, N>> DecodeZ85(const std::string& z85, const std::string& what) {
  std::array<uint8_t, N> out{};
  if (z85.size() != N * 5 / 4 || zmq_z85_decode(out.data(), z85.c_str()) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be ", N * 5 / 4, " Z85 characters (", N, " bytes)"));
  }
  return out;
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
  std::string signing_public, signing_seed;
  if (role == "client" || role == "project") {
    SigningKey key = SigningKey::Generate();
    signing_public = EncodeZ85(key.public_key());
    signing_seed = EncodeZ85(key.seed());
  }
  if (role == "project") {
    CurveKeyPair keys{std::move(role), std::move(id), "", "", signing_public, signing_seed};
    sodium_memzero(signing_seed.data(), signing_seed.size());
    return keys;
  }
  char pub[kZ85KeyChars + 1];
  char sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot generate a CurveZMQ key pair: ", zmq_strerror(zmq_errno()),
                     " (libzmq built without CURVE?)"));
  }
  CurveKeyPair keys{std::move(role), std::move(id), pub, sec, signing_public, signing_seed};
  sodium_memzero(sec, sizeof(sec));
  sodium_memzero(signing_seed.data(), signing_seed.size());
  return keys;
}

StatusOr<SigningKey> SigningKeyOf(const CurveKeyPair& keys, const std::string& what) {
  if (keys.signing_seed_z85.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        " holds no signing key (a key file from before secure aggregation's certificates, "
        "or a .pub): make a new one with `huddle keygen ",
        keys.role, "`"));
  }
  HUDDLE_ASSIGN_OR_RETURN(auto seed, DecodeZ85<32>(keys.signing_seed_z85, what + ": signing_seed"));
  SigningKey key = SigningKey::FromSeed(seed);
  sodium_memzero(seed.data(), seed.size());
  HUDDLE_ASSIGN_OR_RETURN(SigningPublicKey pub, SigningPublicKeyOf(keys, what));
  if (pub != key.public_key()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": signing_key does not belong to signing_seed (a corrupted or edited "
                     "key file)"));
  }
  return key;
}

StatusOr<SigningPublicKey> SigningPublicKeyOf(const CurveKeyPair& keys, const std::string& what) {
  if (keys.signing_public_z85.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " holds no signing_key (make a new key with `huddle keygen ", keys.role, "`)"));
  }
  return DecodeZ85<32>(keys.signing_public_z85, what + ": signing_key");
}

StatusOr<MemberCertificate> CertificateOf(const CurveKeyPair& keys, const std::string& what) {
  if (keys.certificate_z85.empty()) {
    return absl::NotFoundError(absl::StrCat(what, " holds no certificate (`huddle certify`)"));
  }
  MemberCertificate c;
  c.id = keys.id;
  HUDDLE_ASSIGN_OR_RETURN(c.transport_key, DecodeZ85Key(keys.public_z85, what + ": public_key"));
  HUDDLE_ASSIGN_OR_RETURN(c.signing_key, SigningPublicKeyOf(keys, what));
  c.not_after = keys.certificate_not_after;
  HUDDLE_ASSIGN_OR_RETURN(c.signature, DecodeZ85<64>(keys.certificate_z85, what + ": certificate"));
  return c;
}

CurveKeyPair WithCertificate(CurveKeyPair keys, const MemberCertificate& certificate) {
  keys.certificate_z85 = EncodeZ85(certificate.signature);
  keys.certificate_not_after = certificate.not_after;
  return keys;
}

Status RewritePublicFile(const CurveKeyPair& keys, const std::string& path) {
  return WriteFileAtomic(path, KeyFileText(keys, false), 0644);
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
  HUDDLE_RETURN_IF_ERROR(
      map.OptionalChoice("role", &keys.role, {"server", "client", "operator", "project"}));
  HUDDLE_RETURN_IF_ERROR(map.Optional("id", &keys.id));
  HUDDLE_RETURN_IF_ERROR(map.Optional("public_key", &keys.public_z85));
  HUDDLE_RETURN_IF_ERROR(map.Optional("secret_key", &keys.secret_z85));
  HUDDLE_RETURN_IF_ERROR(map.Optional("signing_key", &keys.signing_public_z85));
  HUDDLE_RETURN_IF_ERROR(map.Optional("signing_seed", &keys.signing_seed_z85));
  HUDDLE_RETURN_IF_ERROR(map.Optional("certificate", &keys.certificate_z85));
  int64_t not_after = 0;
  HUDDLE_RETURN_IF_ERROR(map.Optional("certificate_not_after", &not_after, 0, INT64_MAX));
  keys.certificate_not_after = static_cast<uint64_t>(not_after);
  HUDDLE_RETURN_IF_ERROR(map.Finish());
  if (!keys.signing_seed_z85.empty()) HUDDLE_RETURN_IF_ERROR(CheckNotReadableByOthers(path));
  if (keys.role == "project") {
    if (keys.signing_public_z85.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a project key file needs signing_key (`huddle keygen project`)"));
    }
    if (need_secret) HUDDLE_RETURN_IF_ERROR(SigningKeyOf(keys, path).status());
    if (need_secret && keys.signing_seed_z85.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " holds only the project's public key; this needs its .key file"));
    }
    return keys;
  }
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

namespace {

// One enrolment as read from its file (or YAML entry), before conflicts are checked.
struct Enrolment {
  CurveKey key;
  std::string id;
  std::string where;
  std::optional<MemberCertificate> certificate;
};

// "clients'" or "operators'": whose allow-list, in messages.
const char* ListName(AllowListRole role) {
  return role == AllowListRole::kOperator ? "operators'" : "clients'";
}

// An enrolment from a directory's .pub file.
StatusOr<Enrolment> ReadEnrolment(const fs::path& f, AllowListRole role) {
  HUDDLE_ASSIGN_OR_RETURN(CurveKeyPair k, ReadKeyFile(f.string(), /*need_secret=*/false));
  if (k.role != RoleName(role)) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.string(), ": role is '", k.role, "'; the ", ListName(role), " allow-list takes only ",
        RoleName(role), " keys (`huddle keygen ", RoleName(role), "`)"));
  }
  Enrolment e;
  HUDDLE_ASSIGN_OR_RETURN(e.key, DecodeZ85Key(k.public_z85, f.string()));
  e.id = k.id;
  e.where = f.string();
  StatusOr<MemberCertificate> certificate = CertificateOf(k, f.string());
  if (certificate.ok()) {
    e.certificate = *std::move(certificate);
  } else if (!absl::IsNotFound(certificate.status())) {
    return certificate.status();
  }
  return e;
}

// What a Load() that skips bad entries does with one: fails (strict) or records it.
Status Skip(Status error, std::vector<Status>* skipped) {
  if (skipped == nullptr) return error;
  skipped->push_back(std::move(error));
  return absl::OkStatus();
}

}  // namespace

const char* RoleName(AllowListRole role) {
  return role == AllowListRole::kOperator ? "operator" : "client";
}

Status AllowList::Add(const CurveKey& key, const std::string& id, const std::string& where) {
  const char* role = RoleName(role_);
  if (!wire::IsValidClientId(id)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", role, " id '", id,
                                                   "' must be 1-128 characters of [A-Za-z0-9._-]"));
  }
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": key ", Fingerprint(key),
                                                   " is already enrolled as '", it->second,
                                                   "'; one key is one ", role));
  }
  if (by_id_.count(id) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", role, " id '", id, "' is enrolled twice with different keys"));
  }
  by_key_.emplace(key, id);
  by_id_.emplace(id, key);
  sources_.emplace(key, where);
  return absl::OkStatus();
}

StatusOr<AllowList> AllowList::Load(const std::string& path, std::vector<Status>* skipped) {
  return Load(path, AllowListRole::kClient, skipped);
}

StatusOr<AllowList> AllowList::Load(const std::string& path, AllowListRole role,
                                    std::vector<Status>* skipped) {
  const char* role_name = RoleName(role);
  std::vector<Enrolment> enrolments;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      const fs::path& p = entry.path();
      if (p.extension() == ".key") {
        HUDDLE_RETURN_IF_ERROR(Skip(
            absl::FailedPreconditionError(absl::StrCat(
                ListName(role), " allow-list directory '", path, "' contains the secret key file '",
                p.string(), "': it belongs on its ",
                role == AllowListRole::kOperator ? "operator's machine" : "client",
                " only (copy the .pub file instead) and must be removed from here, and the key "
                "pair replaced")),
            skipped));
      }
      if (p.extension() == ".pub" && entry.is_regular_file()) files.push_back(p);
    }
    if (ec) {
      return absl::UnavailableError(absl::StrCat(
          "cannot list ", ListName(role), " allow-list directory '", path, "': ", ec.message()));
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      StatusOr<Enrolment> e = ReadEnrolment(f, role);
      if (e.ok()) {
        enrolments.push_back(*std::move(e));
      } else {
        HUDDLE_RETURN_IF_ERROR(Skip(e.status(), skipped));
      }
    }
  } else {
    if (!fs::exists(path, ec)) {
      return absl::NotFoundError(absl::StrCat(ListName(role), " allow-list '", path,
                                              "' does not exist (a directory of ", role_name,
                                              " .pub files, or a YAML file)"));
    }
    // A mapping's entries carry no role: the file's top-level key says which list it is.
    const char* mapping = role == AllowListRole::kOperator ? "operators" : "clients";
    const char* other = role == AllowListRole::kOperator ? "clients" : "operators";
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::LoadFile(path));
    if (!top.Has(mapping)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": the ", ListName(role), " allow-list, as a YAML file, needs ",
          role == AllowListRole::kOperator ? "an `" : "a `", mapping, ":` mapping of ", role_name,
          " id -> public key",
          top.Has(other) ? absl::StrCat("; its `", other, ":` mapping is the ", other,
                                        "' allow-list, whose keys are never ", role_name, " keys")
                         : std::string(),
          role == AllowListRole::kOperator ? " (or make it a directory of operator .pub files)"
                                           : ""));
    }
    HUDDLE_ASSIGN_OR_RETURN(YAML::Node root, [&]() -> StatusOr<YAML::Node> {
      try {
        return YAML::LoadFile(path);
      } catch (const YAML::Exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
      }
    }());
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap entries, top.Child(mapping));
    for (const auto& kv : root[mapping]) {
      const std::string id = kv.first.as<std::string>();
      std::string z85;
      StatusOr<CurveKey> key = [&]() -> StatusOr<CurveKey> {
        HUDDLE_RETURN_IF_ERROR(entries.Optional(id, &z85));
        return DecodeZ85Key(z85, entries.Where(id));
      }();
      if (key.ok()) {
        enrolments.push_back({*key, id, entries.Where(id), std::nullopt});
      } else {
        HUDDLE_RETURN_IF_ERROR(Skip(key.status(), skipped));
      }
    }
    HUDDLE_RETURN_IF_ERROR(entries.Finish());
    HUDDLE_RETURN_IF_ERROR(top.Finish());
  }
  // Strict: the first conflict is the error. Skipping: an id or key claimed by two entries is
  // enrolled by neither (which of them the operator meant cannot be known).
  std::map<std::string, int> ids;
  std::map<CurveKey, int> keys;
  for (const Enrolment& e : enrolments) {
    ids[e.id]++;
    keys[e.key]++;
  }
  AllowList list;
  list.role_ = role;
  for (Enrolment& e : enrolments) {
    if (skipped != nullptr && (ids[e.id] > 1 || keys[e.key] > 1)) {
      skipped->push_back(absl::InvalidArgumentError(absl::StrCat(
          e.where, ": ",
          ids[e.id] > 1 ? absl::StrCat(role_name, " id '", e.id, "'") : "key " + Fingerprint(e.key),
          " is claimed by another entry too; neither is enrolled (one key is one ", role_name,
          ")")));
      continue;
    }
    HUDDLE_RETURN_IF_ERROR(list.Add(e.key, e.id, e.where));
    if (e.certificate) list.certificates_[e.id] = *std::move(e.certificate);
  }
  return list;
}

std::optional<std::string> AllowList::Lookup(const CurveKey& key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

bool AllowList::HasId(const std::string& id) const { return by_id_.count(id) != 0; }

std::optional<std::string> AllowList::Source(const CurveKey& key) const {
  auto it = sources_.find(key);
  if (it == sources_.end()) return std::nullopt;
  return it->second;
}

std::vector<CurveKey> AllowList::Keys() const {
  std::vector<CurveKey> out;
  out.reserve(by_key_.size());
  for (const auto& [key, id] : by_key_) out.push_back(key);
  return out;
}

bool AllowList::Remove(const CurveKey& key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return false;
  certificates_.erase(it->second);
  by_id_.erase(it->second);
  sources_.erase(key);
  by_key_.erase(it);
  return true;
}

std::optional<MemberCertificate> AllowList::Certificate(const std::string& id) const {
  auto it = certificates_.find(id);
  if (it == certificates_.end()) return std::nullopt;
  return it->second;
}

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
    auto a = [](const std::string& r) { return r == "operator" ? "an " : "a "; };
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is ", a(keys->role),
                                                   keys->role, " key; expected ", a(role), role,
                                                   " key"));
  }
  return keys;
}

}  // namespace huddle::transport
