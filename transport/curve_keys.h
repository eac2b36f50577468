// CurveZMQ keys and the coordinator's allow-list of enrolled clients.
//
// Key files are small YAML documents written by `huddle keygen`:
//
//   NAME.key (mode 0600, secret)        NAME.pub (public, for distribution)
//   role: client                         role: client
//   id: alice                            id: alice
//   public_key: "<40 Z85 characters>"    public_key: "<40 Z85 characters>"
//   secret_key: "<40 Z85 characters>"
//
// Reading a secret key file refuses one that group or others can read (like ssh does), and one
// whose public half does not match its secret half.
//
// The allow-list is either a directory of client *.pub files, or one YAML file
// `clients: {alice: "<public key>", bob: "<public key>"}`. Each enrolled key maps to exactly one
// client id, and each id to one key: the key is the identity (docs/security.md).
//
// Thread-safety: plain values and stateless functions.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"

namespace huddle::transport {

using CurveKey = std::array<uint8_t, 32>;

struct CurveKeyPair {
  std::string role;  // "server" or "client"
  std::string id;    // client id, or the server's name
  std::string public_z85;
  std::string secret_z85;  // empty when only the public half is known
};

// A fresh key pair from the OS CSPRNG (libsodium via libzmq).
StatusOr<CurveKeyPair> GenerateKeyPair(std::string role, std::string id);

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
// ReadKeyFile, and the key must be of `role` ("server" or "client"). Errors start with `what`
// (the config key that named the file).
StatusOr<CurveKeyPair> ReadRoleKey(const std::string& path, const char* role, bool need_secret,
                                   const char* what);

// Enrolled clients: public key -> client id.
class AllowList {
 public:
  // From a directory of *.pub files or a YAML file with a `clients` mapping. Errors name the file
  // and the problem (bad key, duplicate id, duplicate key, a secret key left in the directory...).
  static StatusOr<AllowList> Load(const std::string& path);

  // The id `key` is enrolled as, or nullopt.
  std::optional<std::string> Lookup(const CurveKey& key) const;
  bool HasId(const std::string& id) const;
  size_t size() const { return by_key_.size(); }

  // A value that changes whenever the files behind `path` change (names, sizes, mtimes), so a
  // periodic check reloads only when needed.
  static std::string Signature(const std::string& path);

 private:
  Status Add(const CurveKey& key, const std::string& id, const std::string& where);

  std::map<CurveKey, std::string> by_key_;
  std::map<std::string, CurveKey> by_id_;
};

}  // namespace huddle::transport
