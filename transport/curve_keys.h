// CurveZMQ keys, and the allow-lists of enrolled clients (a coordinator's, a service's agents') and
// of a service's operators.
//
// Key files are small YAML documents written by `huddle keygen`:
//
//   NAME.key (mode 0600, secret)        NAME.pub (public, for distribution)
//   role: client                         role: client
//   id: alice                            id: alice
//   public_key: "<40 Z85 characters>"    public_key: "<40 Z85 characters>"
//   secret_key: "<40 Z85 characters>"    signing_key: "<40 Z85>"
//   signing_key: "<40 Z85>"              certificate: "<80 Z85>"        (after `huddle certify`)
//   signing_seed: "<40 Z85>"             certificate_not_after: 0       (0: no expiry)
//
// An operator key (`huddle keygen operator`, role: operator) is a CurveZMQ pair with no signing
// key (operators take no part in secure aggregation): it authenticates the operator commands of
// `huddle serve` (`huddle submit`, `jobs`, ...) and is enrolled in the service's own operators'
// allow-list (security.operators), never in the clients'.
//
// A client's signing key (Ed25519) is what it signs its secure-aggregation messages with; its
// certificate is the project key's signature over its id, public_key and signing_key
// (common/member_certificate.h). A project key (`huddle keygen project`, role: project) has only
// signing_key (and signing_seed in its .key): it certifies clients and is pinned by them.
//
// Reading a secret key file refuses one that group or others can read (like ssh does), and one
// whose public half does not match its secret half.
//
// An allow-list is of one role. The clients' is either a directory of client *.pub files, or one
// YAML file `clients: {alice: "<public key>", bob: "<public key>"}`; the operators' is a directory
// of operator *.pub files, or a YAML file with an `operators:` mapping (never `clients:`: a
// mapping's entries carry no role, so the file's key says which list it is). A .pub of another
// role is not enrolled (an error naming the file and its role), so a client's .pub copied into the
// operators' directory makes no operator. Each enrolled key maps to exactly one id, and each id to
// one key: the key is the identity (docs/security.md).
//
// Thread-safety: plain values and stateless functions.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/member_certificate.h"
#include "common/signing.h"
#include "common/status.h"

namespace huddle::transport {

using CurveKey = std::array<uint8_t, 32>;

struct CurveKeyPair {
  std::string role;        // "server", "client", "operator" or "project"
  std::string id;          // client id, or the server's or project's name
  std::string public_z85;  // CurveZMQ (none for a project)
  std::string secret_z85;  // empty when only the public half is known
  // Ed25519 (clients and projects): the public key, and the seed in a .key file.
  std::string signing_public_z85;
  std::string signing_seed_z85;
  // A client's certificate by the project key (a .pub after `huddle certify`).
  std::string certificate_z85;  // the project's signature (64 bytes)
  uint64_t certificate_not_after = 0;
};

// A fresh key pair from the OS CSPRNG (libsodium via libzmq): a CurveZMQ pair for a server, a
// client or an operator, and an Ed25519 signing key for a client or a project (a project has no
// CurveZMQ pair; an operator, taking no part in secure aggregation, no signing key).
StatusOr<CurveKeyPair> GenerateKeyPair(std::string role, std::string id);

// The signing key of a client's or project's .key file; its certificate as a .pub holds it.
StatusOr<SigningKey> SigningKeyOf(const CurveKeyPair& keys, const std::string& what);
StatusOr<SigningPublicKey> SigningPublicKeyOf(const CurveKeyPair& keys, const std::string& what);
// NotFound when `keys` holds no certificate; InvalidArgument for one that does not decode.
StatusOr<MemberCertificate> CertificateOf(const CurveKeyPair& keys, const std::string& what);
// `keys` with `certificate`'s signature and expiry (what `huddle certify` writes).
CurveKeyPair WithCertificate(CurveKeyPair keys, const MemberCertificate& certificate);
// Writes DIR/NAME.pub again (a client's public file, now with its certificate), atomically.
Status RewritePublicFile(const CurveKeyPair& keys, const std::string& path);

// Decodes a 40-character Z85 key; InvalidArgument naming `what` otherwise.
StatusOr<CurveKey> DecodeZ85Key(const std::string& z85, const std::string& what);
std::string EncodeZ85Key(const CurveKey& key);

// A short, stable name for a public key in logs and on screens: "blake2b:" + 16 hex digits.
std::string Fingerprint(const CurveKey& public_key);
std::string Fingerprint(const std::string& public_z85);  // "invalid-key" if it does not decode

// Writes DIR/NAME.key (0600) and DIR/NAME.pub (0644). AlreadyExists if either exists: an existing
// secret key is never overwritten.
Status WriteKeyFiles(const CurveKeyPair& keys, const std::string& dir, const std::string& name);

// Reads a .key file (public and secret; permissions and consistency checked) or a .pub file.
StatusOr<CurveKeyPair> ReadKeyFile(const std::string& path, bool need_secret);
// ReadKeyFile, and the key must be of `role` ("server", "client", "operator" or "project").
// Errors start with `what` (the config key that named the file).
StatusOr<CurveKeyPair> ReadRoleKey(const std::string& path, const char* role, bool need_secret,
                                   const char* what);

// Which keys an allow-list enrols: client keys (the coordinator's and the service's agents) or
// operator keys (the service's operators' endpoint).
enum class AllowListRole { kClient, kOperator };
// "client" or "operator": the role: of the key files it takes.
const char* RoleName(AllowListRole role);

// Enrolled keys of one role: public key -> id (a client id, or an operator's name).
class AllowList {
 public:
  // The clients' allow-list: Load(path, AllowListRole::kClient, skipped).
  static StatusOr<AllowList> Load(const std::string& path, std::vector<Status>* skipped = nullptr);
  // From a directory of *.pub files of `role`, or a YAML file with a `clients` (kClient) or
  // `operators` (kOperator) mapping. Errors name the file and the problem (bad key, another role's
  // key, duplicate id, duplicate key, a secret key left in the directory...).
  // With `skipped`, a bad entry (a malformed .pub or YAML entry, a .key file in the directory, an
  // id or key claimed twice: then every entry claiming it) is left out and its error appended
  // there, and the rest is the list; only a source that cannot be read at all (missing, unlistable,
  // YAML that does not parse) is an error.
  static StatusOr<AllowList> Load(const std::string& path, AllowListRole role,
                                  std::vector<Status>* skipped = nullptr);

  // The id `key` is enrolled as, or nullopt.
  std::optional<std::string> Lookup(const CurveKey& key) const;
  bool HasId(const std::string& id) const;
  // Where `key` was enrolled (its .pub file, or the YAML entry), or nullopt.
  std::optional<std::string> Source(const CurveKey& key) const;
  // Every enrolled key.
  std::vector<CurveKey> Keys() const;
  // Leaves `key` out (its id too); false if it was not enrolled.
  bool Remove(const CurveKey& key);
  size_t size() const { return by_key_.size(); }
  // The certificate enrolled with `id` (its .pub's), or nullopt (not verified here: the members
  // verify it against the project key they pin).
  std::optional<MemberCertificate> Certificate(const std::string& id) const;

  // A value that changes whenever the files behind `path` change (names, sizes, mtimes), so a
  // periodic check reloads only when needed.
  static std::string Signature(const std::string& path);

 private:
  Status Add(const CurveKey& key, const std::string& id, const std::string& where);

  std::map<CurveKey, std::string> by_key_;
  std::map<std::string, CurveKey> by_id_;
  std::map<CurveKey, std::string> sources_;
  AllowListRole role_ = AllowListRole::kClient;
  std::map<std::string, MemberCertificate> certificates_;
};

}  // namespace huddle::transport
