#include "transport/kv_store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <zmq.hpp>

#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "transport/curve_keys.h"
#include "transport/zap_handler.h"

namespace huddle::transport {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Status CheckKey(std::string_view key) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        fmt::format("rendezvous key of {} bytes (1 to {} allowed)", key.size(), kMaxKeyBytes));
  }
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          fmt::format("rendezvous key '{}' has a byte that is not printable ASCII", key));
    }
  }
  return absl::OkStatus();
}

Status CheckValue(std::string_view key, std::string_view value) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        fmt::format("rendezvous value of key '{}' has {} bytes (at most {})", key, value.size(),
                    kMaxValueBytes));
  }
  return absl::OkStatus();
}

// Polls for a key with a backoff from 2 ms to 50 ms: rendezvous waits are short and rare.
class Backoff {
 public:
  void Sleep(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    std::this_thread::sleep_for(std::max(milliseconds(0), std::min(milliseconds(delay_ms_), left)));
    delay_ms_ = std::min(delay_ms_ * 2, 50);
  }

 private:
  int delay_ms_ = 2;
};

Status NotThere(std::string_view key, const std::string& url, milliseconds timeout) {
  return absl::DeadlineExceededError(
      fmt::format("rendezvous key '{}' did not appear in {} within {} ms (has every rank started, "
                  "with the same rendezvous and world size?)",
                  key, url, timeout.count()));
}

// ---- file:///DIR
// ---------------------------------------------------------------------------------

// A key becomes a file name: bytes outside [A-Za-z0-9_.-] (and a leading '.') are %XX-escaped.
std::string FileName(std::string_view key) {
  std::string out = "kv-";
  for (char c : key) {
    bool plain = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
    if (plain) {
      out.push_back(c);
    } else {
      out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    }
  }
  return out;
}

class FileKvStore final : public KvStore {
 public:
  explicit FileKvStore(std::string dir) : dir_(std::move(dir)) {}

  Status Set(std::string_view key, std::string_view value) override {
    HUDDLE_RETURN_IF_ERROR(CheckKey(key));
    HUDDLE_RETURN_IF_ERROR(CheckValue(key, value));
    // Written whole under a temporary name, then renamed: a reader never sees a partial value.
    // Not fsync'd: a rendezvous does not outlive the launch.
    std::string path = dir_ + "/" + FileName(key);
    std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter_++);
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      out.close();
      if (!out) {
        return absl::UnavailableError(fmt::format("cannot write rendezvous key '{}' to {}: {}", key,
                                                  tmp, std::strerror(errno)));
      }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      std::remove(tmp.c_str());
      return absl::UnavailableError(
          fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
    }
    return absl::OkStatus();
  }

  StatusOr<std::string> Get(std::string_view key, milliseconds timeout) override {
    HUDDLE_RETURN_IF_ERROR(CheckKey(key));
    std::string path = dir_ + "/" + FileName(key);
    auto deadline = Clock::now() + timeout;
    Backoff backoff;
    for (;;) {
      StatusOr<std::string> value = ReadFile(path);
      if (value.ok()) return value;
      if (!absl::IsNotFound(value.status())) return value.status();
      if (Clock::now() >= deadline) return NotThere(key, url(), timeout);
      backoff.Sleep(deadline);
    }
  }

  std::string url() const override { return "file://" + dir_; }

 private:
  std::string dir_;
  std::atomic<uint64_t> counter_{0};
};

// ---- tcp://HOST:PORT: the protocol
// ---------------------------------------------------------------- Request  (DEALER -> ROUTER):
// [seq (8 bytes)] [op: "S" set | "G" get] [key] [value, set only] Reply    (ROUTER -> DEALER):
// [seq] [status: "O" ok | "M" missing | "E" error] [value or message] `seq` pairs a reply with its
// request, so a reply that arrives after its request timed out is recognised and dropped.

constexpr size_t kSeqBytes = 8;
// A bound on any one receive: the parts of a message arrive together, so this only matters if
// libzmq ever hands over a part late; no receive can block for good.
constexpr int kReceiveTimeoutMs = 1000;

// One whole message from `socket` (after a poll said one is there): its first `keep` frames, the
// rest received and dropped. Ends at the last part (or when a receive times out), so the next
// receive starts at the next message whatever this one's shape: 0 frames, 1, 7 or 10,000.
std::vector<zmq::message_t> ReceiveMessage(zmq::socket_t& socket, size_t keep) {
  std::vector<zmq::message_t> frames;
  for (;;) {
    zmq::message_t part;
    if (!socket.recv(part, zmq::recv_flags::none).has_value()) break;  // timed out
    const bool more = part.more();
    if (frames.size() < keep) frames.push_back(std::move(part));
    if (!more) break;
  }
  return frames;
}

class ZmqKvStore final : public KvStore {
 public:
  ZmqKvStore(std::string url, milliseconds request_timeout, std::optional<KvAuth> auth)
      : url_(std::move(url)),
        request_timeout_(request_timeout),
        auth_(std::move(auth)),
        context_(1) {}

  Status Set(std::string_view key, std::string_view value) override {
    HUDDLE_RETURN_IF_ERROR(CheckKey(key));
    HUDDLE_RETURN_IF_ERROR(CheckValue(key, value));
    HUDDLE_ASSIGN_OR_RETURN(Reply reply, Request("S", key, value, request_timeout_));
    if (reply.status != 'O') {
      return absl::FailedPreconditionError(
          fmt::format("rendezvous server {} refused key '{}': {}", url_, key, reply.value));
    }
    return absl::OkStatus();
  }

  StatusOr<std::string> Get(std::string_view key, milliseconds timeout) override {
    HUDDLE_RETURN_IF_ERROR(CheckKey(key));
    auto deadline = Clock::now() + timeout;
    Backoff backoff;
    for (;;) {
      // The server answers at once when it is up: each request gets at least a second (or the
      // whole request timeout), however little of the wait is left.
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      milliseconds answer_within = std::min(request_timeout_, std::max(left, milliseconds(1000)));
      HUDDLE_ASSIGN_OR_RETURN(Reply reply, Request("G", key, {}, answer_within));
      if (reply.status == 'O') return std::move(reply.value);
      if (reply.status != 'M') {
        return absl::FailedPreconditionError(
            fmt::format("rendezvous server {} refused key '{}': {}", url_, key, reply.value));
      }
      if (Clock::now() >= deadline) return NotThere(key, url_, timeout);
      backoff.Sleep(deadline);
    }
  }

  std::string url() const override { return url_; }

 private:
  struct Reply {
    char status = 0;
    std::string value;
  };

  Status Connect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (socket_.handle() != nullptr) return absl::OkStatus();
    try {
      socket_ = zmq::socket_t(context_, zmq::socket_type::dealer);
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxValueBytes + 4096));
      socket_.set(zmq::sockopt::rcvtimeo, kReceiveTimeoutMs);
      if (auth_) {
        socket_.set(zmq::sockopt::curve_serverkey, auth_->public_z85);
        socket_.set(zmq::sockopt::curve_publickey, auth_->public_z85);
        socket_.set(zmq::sockopt::curve_secretkey, auth_->secret_z85);
      }
      socket_.connect(url_);
    } catch (const zmq::error_t& e) {
      socket_.close();
      return absl::InvalidArgumentError(
          fmt::format("cannot connect to rendezvous server {}: {}", url_, e.what()));
    }
    return absl::OkStatus();
  }

  StatusOr<Reply> Request(std::string_view op, std::string_view key, std::string_view value,
                          milliseconds timeout) {
    absl::MutexLock lock(&mu_);  // one request in flight per handle; waits poll between requests
    HUDDLE_RETURN_IF_ERROR(Connect());
    uint64_t seq = ++seq_;
    try {
      auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
      bool sent = socket_.send(zmq::buffer(&seq, kSeqBytes), more).has_value() &&
                  socket_.send(zmq::buffer(op.data(), op.size()), more).has_value();
      if (op == "S") {
        sent = sent && socket_.send(zmq::buffer(key.data(), key.size()), more).has_value() &&
               socket_.send(zmq::buffer(value.data(), value.size()), zmq::send_flags::dontwait)
                   .has_value();
      } else {
        sent = sent && socket_.send(zmq::buffer(key.data(), key.size()), zmq::send_flags::dontwait)
                           .has_value();
      }
      if (!sent) {
        // Nothing queued can leave (the server has never been reached): start over next time.
        socket_.close();
        return Unreachable(timeout);
      }
      auto deadline = Clock::now() + timeout;
      for (;;) {
        auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        if (left <= milliseconds(0)) break;
        zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, left) == 0) break;
        std::vector<zmq::message_t> frames = ReceiveMessage(socket_, 3);
        uint64_t got = 0;
        if (frames.size() < 2 || frames[0].size() != kSeqBytes || frames[1].size() != 1) continue;
        std::memcpy(&got, frames[0].data(), kSeqBytes);
        if (got != seq) continue;  // the late reply to a request that timed out
        Reply reply{*frames[1].data<char>(), {}};
        if (frames.size() > 2) reply.value = frames[2].to_string();
        return reply;
      }
    } catch (const zmq::error_t& e) {
      socket_.close();
      return absl::UnavailableError(fmt::format("rendezvous server {}: {}", url_, e.what()));
    }
    // Drop what is queued so that a server that comes up later does not see stale requests.
    socket_.close();
    return Unreachable(timeout);
  }

  Status Unreachable(milliseconds timeout) const {
    return absl::UnavailableError(fmt::format(
        "no answer from the rendezvous server {} within {} ms (is it running and reachable?)", url_,
        timeout.count()));
  }

  std::string url_;
  milliseconds request_timeout_;
  std::optional<KvAuth> auth_;
  absl::Mutex mu_;
  zmq::context_t context_;
  zmq::socket_t socket_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
};

class ZmqKvServer final : public KvServer {
 public:
  ZmqKvServer(KvServerLimits limits, std::optional<KvAuth> auth)
      : limits_(limits), auth_(std::move(auth)), context_(1) {}
  ~ZmqKvServer() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  Status Bind(std::string_view endpoint) {
    try {
      if (auth_) {
        HUDDLE_ASSIGN_OR_RETURN(CurveKey key, DecodeZ85Key(auth_->public_z85, "rendezvous key"));
        job_key_ = key;
      }
      socket_ = zmq::socket_t(context_, zmq::socket_type::router);
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxValueBytes + 4096));
      socket_.set(zmq::sockopt::rcvtimeo, kReceiveTimeoutMs);
      if (auth_) {
        // Served on the server's own thread (Serve).
        OpenJobKeyGate(context_, &zap_, socket_, auth_->secret_z85, "huddle-rendezvous",
                       kReceiveTimeoutMs);
      }
      socket_.bind(std::string(endpoint));
      std::string bound = socket_.get(zmq::sockopt::last_endpoint);
      // "tcp://0.0.0.0:PORT" -> "tcp://127.0.0.1:PORT" for clients on this host.
      constexpr std::string_view kWildcard = "tcp://0.0.0.0:";
      if (bound.starts_with(kWildcard)) bound = "tcp://127.0.0.1:" + bound.substr(kWildcard.size());
      url_ = bound;
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(
          fmt::format("cannot serve the rendezvous store on {}: {}", endpoint, e.what()));
    }
    thread_ = std::thread([this] { Serve(); });
    return absl::OkStatus();
  }

  std::string url() const override { return url_; }
  uint64_t refused_handshakes() const override { return refused_.load(); }

 private:
  void Serve() {
    while (!stop_) {
      try {
        zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                                   {zap_.handle(), 0, ZMQ_POLLIN, 0}};
        const int count = zap_.handle() != nullptr ? 2 : 1;
        if (zmq::poll(items, count, milliseconds(50)) == 0) continue;
        if (count == 2 && (items[1].revents & ZMQ_POLLIN)) AnswerZap();
        if (items[0].revents & ZMQ_POLLIN) {
          std::vector<zmq::message_t> frames = ReceiveMessage(socket_, 6);
          Answer(frames);
        }
      } catch (const zmq::error_t&) {
        // A peer's misbehaviour never stops the server; the next poll carries on.
      }
    }
  }

  // RFC 27: [version "1.0"] [request id] [domain] [address] [identity] [mechanism] [client key];
  // admitted: CURVE with the job's public key (which proves the client holds its secret half).
  void AnswerZap() {
    if (!AnswerJobKeyZap(zap_, job_key_)) refused_++;
  }

  // frames: [routing id] [seq] [op] [key] [value]
  void Answer(std::vector<zmq::message_t>& frames) {
    // Not ours (no routing id, sequence number, op and key): dropped.
    if (frames.size() < 4 || frames[1].size() != kSeqBytes) return;
    std::string_view op(frames[2].data<char>(), frames[2].size());
    std::string key = frames[3].to_string();
    char status = 'E';
    std::string value;
    if (Status s = CheckKey(key); !s.ok()) {
      value = std::string(s.message());
    } else if (op == "G" && frames.size() == 4) {
      auto it = table_.find(key);
      if (it == table_.end()) {
        status = 'M';
      } else {
        status = 'O';
        value = it->second;
      }
    } else if (op == "S" && frames.size() == 5) {
      std::string v = frames[4].to_string();
      auto it = table_.find(key);
      size_t old = it == table_.end() ? 0 : key.size() + it->second.size();
      if (it == table_.end() && table_.size() >= limits_.max_keys) {
        value = fmt::format("the store already holds {} keys", table_.size());
      } else if (total_bytes_ - old + key.size() + v.size() > limits_.max_total_bytes) {
        value = fmt::format("the store would exceed {} bytes", limits_.max_total_bytes);
      } else {
        total_bytes_ = total_bytes_ - old + key.size() + v.size();
        table_[key] = std::move(v);
        status = 'O';
      }
    } else {
      value = "malformed request";
    }
    auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    socket_.send(frames[0], more);
    socket_.send(frames[1], more);
    socket_.send(zmq::buffer(&status, 1), more);
    socket_.send(zmq::buffer(value), zmq::send_flags::dontwait);
  }

  KvServerLimits limits_;
  std::optional<KvAuth> auth_;
  CurveKey job_key_{};
  zmq::context_t context_;
  zmq::socket_t zap_;  // with auth_: the ZAP handler's socket (before socket_: outlives it)
  zmq::socket_t socket_;
  std::string url_;
  std::map<std::string, std::string> table_;
  size_t total_bytes_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace

StatusOr<KvAuth> ReadKvAuthFile(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(CurveKeyPair keys, ReadKeyFile(path, /*need_secret=*/true));
  return KvAuth{keys.public_z85, keys.secret_z85};
}

StatusOr<KvAuth> GenerateKvAuth() {
  HUDDLE_ASSIGN_OR_RETURN(CurveKeyPair keys, GenerateKeyPair("server", "rendezvous"));
  return KvAuth{keys.public_z85, keys.secret_z85};
}

StatusOr<std::string> KvServerEndpointFor(std::string_view url) {
  const size_t colon = url.rfind(':');
  const bool ok =
      url.starts_with("tcp://") && colon != std::string_view::npos && colon > 6 &&
      colon + 1 < url.size() &&
      std::all_of(url.begin() + colon + 1, url.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!ok) {
    return absl::InvalidArgumentError(
        fmt::format("rendezvous '{}': a server needs tcp://HOST:PORT", url));
  }
  const std::string_view host = url.substr(6, colon - 6);
  if (host == "*" || host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::InvalidArgumentError(fmt::format(
        "rendezvous '{}': name the address to serve on (this host's address that the other "
        "ranks reach), not a wildcard",
        url));
  }
  return std::string(url);
}

StatusOr<std::unique_ptr<KvStore>> OpenKvStore(std::string_view url, milliseconds request_timeout,
                                               const std::optional<KvAuth>& auth) {
  if (url.starts_with("file://")) {
    if (auth) {
      return absl::InvalidArgumentError(fmt::format(
          "rendezvous '{}': a file store cannot be authenticated with a key (its directory's "
          "permissions protect it); use tcp://HOST:PORT",
          url));
    }
    std::string dir(url.substr(7));
    if (dir.empty() || dir[0] != '/') {
      return absl::InvalidArgumentError(fmt::format(
          "rendezvous '{}': a file store needs an absolute directory, file:///path/to/dir", url));
    }
    HUDDLE_RETURN_IF_ERROR(MakeDirs(dir));
    return std::unique_ptr<KvStore>(std::make_unique<FileKvStore>(dir));
  }
  if (url.starts_with("tcp://")) {
    std::string_view rest = url.substr(6);
    size_t colon = rest.rfind(':');
    bool port_ok = colon != std::string_view::npos && colon > 0 && colon + 1 < rest.size() &&
                   std::all_of(rest.begin() + colon + 1, rest.end(),
                               [](char c) { return c >= '0' && c <= '9'; });
    if (!port_ok) {
      return absl::InvalidArgumentError(
          fmt::format("rendezvous '{}': expected tcp://HOST:PORT", url));
    }
    return std::unique_ptr<KvStore>(
        std::make_unique<ZmqKvStore>(std::string(url), request_timeout, auth));
  }
  return absl::InvalidArgumentError(fmt::format(
      "rendezvous '{}': expected tcp://HOST:PORT (a rendezvous server) or file:///DIR", url));
}

StatusOr<std::unique_ptr<KvServer>> KvServer::Start(std::string_view endpoint,
                                                    KvServerLimits limits,
                                                    std::optional<KvAuth> auth) {
  auto server = std::make_unique<ZmqKvServer>(limits, std::move(auth));
  HUDDLE_RETURN_IF_ERROR(server->Bind(endpoint));
  return std::unique_ptr<KvServer>(std::move(server));
}

}  // namespace huddle::transport
