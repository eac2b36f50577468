// The rendezvous key-value store of the datacenter mode: ranks publish their addresses (and NCCL's
// unique id) under keys and wait for each other's. Two kinds, chosen by URL:
//
//   tcp://HOST:PORT   a KvServer (below) that the first host, or the launcher, serves over ZeroMQ;
//   file:///DIR       one file per key in a directory every rank can see (one host, or a shared
//                     file system). Use a fresh directory per launch: keys left by an earlier
//                     launch would be read as this one's.
//
// Values are opaque bytes; keys are at most kMaxKeyBytes of printable ASCII. The store is for
// rendezvous, not data: the server bounds what one key and the whole table may hold.
//
// Authentication (KvAuth): a tcp:// server and its clients can share one CurveZMQ key pair, the
// job's. The server then speaks CURVE only and admits, through its own ZAP check, only clients
// that prove they hold that same key pair; everyone else's handshake fails and their requests
// time out unanswered. Knowing the key file is membership of the job: every rank is equally
// trusted (any rank could serve), so one pair for all is as strong as separate server and
// client keys and there is one secret to hand out. Traffic is encrypted too. A file:// store
// is protected by its directory's permissions only.
//
// Every wait is bounded: a client request by its timeout, the server's receives by a poll and a
// receive timeout, so a malformed or half-sent message never stalls the server or its
// destructor.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace huddle::transport {

inline constexpr size_t kMaxKeyBytes = 512;
inline constexpr size_t kMaxValueBytes = 1 << 20;

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Sets `key` (overwriting any earlier value).
  virtual Status Set(std::string_view key, std::string_view value) = 0;
  // The value of `key`, waiting up to `timeout` for some rank to set it; DeadlineExceeded naming
  // the key and the store when it does not appear in time.
  virtual StatusOr<std::string> Get(std::string_view key, std::chrono::milliseconds timeout) = 0;
  // Where the store is, for error messages ("tcp://10.0.0.1:29500").
  virtual std::string url() const = 0;
};

// The job's CurveZMQ key pair (40-character Z85 halves, transport/curve_keys.h).
struct KvAuth {
  std::string public_z85;
  std::string secret_z85;
};

// Reads a rendezvous key file: a secret key file of `huddle keygen` (transport/curve_keys.h's
// NAME.key, any role; refused when group or others can read it, or its halves do not match).
StatusOr<KvAuth> ReadKvAuthFile(const std::string& path);
// A fresh key pair from the OS CSPRNG.
StatusOr<KvAuth> GenerateKvAuth();

// Opens the store at `url` (tcp://HOST:PORT or file:///DIR; the directory is created if missing).
// Opening does not contact a tcp:// server: an unreachable one shows up as Get/Set timing out.
// `auth`: the job's key pair, for a server started with the same (tcp:// only; InvalidArgument
// with a file:// URL).
StatusOr<std::unique_ptr<KvStore>> OpenKvStore(
    std::string_view url, std::chrono::milliseconds request_timeout = std::chrono::seconds(30),
    const std::optional<KvAuth>& auth = std::nullopt);

// The endpoint a server for the rendezvous `url` (tcp://HOST:PORT) binds: that host's address
// and port, never a wildcard (an explicit "*" or "0.0.0.0" in the URL is refused: name the
// interface). InvalidArgument naming the URL otherwise.
StatusOr<std::string> KvServerEndpointFor(std::string_view url);

// Limits on what a KvServer holds, against a misbehaving client.
struct KvServerLimits {
  size_t max_keys = 1 << 16;
  size_t max_total_bytes = 64u << 20;
};

// Serves a KvStore over ZeroMQ (a ROUTER socket, one thread) until destroyed. A malformed
// message (any number of frames, any sizes) is answered with an error or dropped, and the server
// goes on; the destructor returns within about 100 ms.
class KvServer {
 public:
  // Binds `endpoint` ("tcp://10.0.0.1:29500"; port 0 picks a free port, see url()). With `auth`
  // only clients holding that key pair are admitted (CURVE, checked by a ZAP handler of the
  // server's own).
  static StatusOr<std::unique_ptr<KvServer>> Start(std::string_view endpoint,
                                                   KvServerLimits limits = {},
                                                   std::optional<KvAuth> auth = std::nullopt);
  virtual ~KvServer() = default;
  // CURVE handshakes refused so far (clients without the job's key pair).
  virtual uint64_t refused_handshakes() const = 0;
  // tcp://HOST:PORT that a client on this host can connect to (the bound port, 127.0.0.1 for a
  // wildcard address).
  virtual std::string url() const = 0;
};

}  // namespace huddle::transport
