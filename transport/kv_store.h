// The rendezvous key-value store of the datacenter mode: ranks publish their addresses (and NCCL's
// unique id) under keys and wait for each other's. Two kinds, chosen by URL:
//
//   tcp://HOST:PORT   a KvServer (below) that the first host, or the launcher, serves over ZeroMQ;
//   file:///DIR       one file per key in a directory every rank can see (one host, or a shared
//                     file system). Use a fresh directory per launch: keys left by an earlier
//                     launch would be read as this one's.
//
// Values are opaque bytes; keys are at most kMaxKeyBytes of printable ASCII. The store is for
// rendezvous, not data: the server bounds what one key and the whole table may hold. It is not
// authenticated (docs/datacenter.md: the datacenter mode assumes a trusted cluster network).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
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

// Opens the store at `url` (tcp://HOST:PORT or file:///DIR; the directory is created if missing).
// Opening does not contact a tcp:// server: an unreachable one shows up as Get/Set timing out.
StatusOr<std::unique_ptr<KvStore>> OpenKvStore(
    std::string_view url, std::chrono::milliseconds request_timeout = std::chrono::seconds(30));

// Limits on what a KvServer holds, against a misbehaving client.
struct KvServerLimits {
  size_t max_keys = 1 << 16;
  size_t max_total_bytes = 64u << 20;
};

// Serves a KvStore over ZeroMQ (a ROUTER socket, one thread) until destroyed.
class KvServer {
 public:
  // Binds `endpoint` ("tcp://0.0.0.0:29500"; port 0 picks a free port, see url()).
  static StatusOr<std::unique_ptr<KvServer>> Start(std::string_view endpoint,
                                                   KvServerLimits limits = {});
  virtual ~KvServer() = default;
  // tcp://HOST:PORT that a client on this host can connect to (the bound port, 127.0.0.1 for a
  // wildcard address).
  virtual std::string url() const = 0;
};

}  // namespace huddle::transport
