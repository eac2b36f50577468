// The parameter-server mode's messages and its two ZeroMQ socket roles (docs/datacenter.md,
// "Parameter-server mode", for the message sequence).
//
// A message is ONE frame (after the ROUTER's identity frame): a fixed 128-byte little-endian
// header (magic "HPS1", type, the job tag, then the fields of Msg below) and a payload of float32
// values (kParams, kPush, kShardState, kRestore) or UTF-8 text (kError). A frame whose size does
// not match its header, with a wrong magic or job tag, an unknown type or more values than the
// receiver allows, is a typed error, never an abort; the sockets' maximum message size bounds what
// libzmq buffers per message.
//
// Security: with the job's key (transport::KvAuth, the rendezvous's) every socket speaks CURVE;
// a server admits, through its own ZAP handler, only peers that hold the same key pair, as the
// rendezvous server does (transport/kv_store.h). Without it, plain TCP (the log says so).
//
// Thread-safety: a socket object is used by one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "transport/kv_store.h"

namespace huddle::datacenter {

enum class MsgType : uint16_t {
  kPull = 1,        // worker -> server k: the shard's parameters, please
  kParams = 2,      // server k -> worker: version, values
  kPush = 3,        // worker -> server k: gradient (version = base, rows, need), values
  kPushed = 4,      // server k -> worker: flags 1 accepted, staleness, version after
  kNext = 5,        // worker -> server 0: done (batch >= 0: epoch, batch, version, loss...), next?
  kTask = 6,        // server 0 -> worker: flags = Task::Kind; epoch, batch, version, need
  kSnapshot = 7,    // server 0 -> server k: the shard, please
  kShardState = 8,  // server k -> server 0: version, dropped, values = params then velocity
  kRestore = 9,     // server 0 -> server k (resume): version, values = params then velocity
  kAck = 10,
  kPing = 11,   // server 0 -> server k: still there (server k ends when server 0 goes silent)
  kStop = 12,   // server 0 -> server k: the job is over
  kError = 13,  // text
};

struct Msg {
  MsgType type = MsgType::kError;
  uint16_t flags = 0;
  int64_t worker = -1, seq = 0;
  int64_t epoch = 0, batch = -1, version = 0, need = 0, rows = 0;
  int64_t staleness = 0, correct = 0, dropped = 0;
  double loss_sum = 0;
  std::vector<float> values;
  std::string text;  // kError only
};

std::string EncodeMsg(const Msg& m, uint64_t job_tag);
// InvalidArgument saying what is wrong with the frame.
StatusOr<Msg> DecodeMsg(std::string_view frame, uint64_t job_tag, int64_t max_values);
// A well-formed header of another configuration (the magic and a known type, a job tag other
// than `job_tag`): that tag and the request's seq, so that the answer can reach its sender (which
// decodes only its own tag). nullopt for anything else.
struct ForeignHeader {
  uint64_t job_tag = 0;
  int64_t seq = 0;
};
std::optional<ForeignHeader> PeekForeignHeader(std::string_view frame, uint64_t job_tag);

// A server's ROUTER on HOST:0 (a free port), with the ZAP handler when authenticated. A request of
// a rank configured differently (another job tag) is answered with kError under the sender's tag,
// carrying `job_description` (this server's configuration), so that the rank fails naming both
// configurations instead of waiting out its timeout; Receive then returns InvalidArgument as for
// any foreign message.
class PsRouter {
 public:
  static StatusOr<std::unique_ptr<PsRouter>> Bind(const std::string& host,
                                                  const std::optional<transport::KvAuth>& auth,
                                                  uint64_t job_tag, int64_t max_values,
                                                  std::string job_description = {});
  virtual ~PsRouter() = default;
  virtual std::string url() const = 0;
  // Waits up to `wait` for a message (answering ZAP handshakes meanwhile). Nothing arrived:
  // NotFound. A malformed one: InvalidArgument (the caller logs it and goes on; *peer is set).
  virtual StatusOr<Msg> Receive(std::chrono::milliseconds wait, std::string* peer) = 0;
  virtual Status Send(const std::string& peer, const Msg& m) = 0;
};

// A client's DEALER to one server: one request at a time, answered within a deadline.
class PsDealer {
 public:
  static StatusOr<std::unique_ptr<PsDealer>> Connect(const std::string& url,
                                                     const std::optional<transport::KvAuth>& auth,
                                                     uint64_t job_tag, int64_t max_values);
  virtual ~PsDealer() = default;
  // Sends `m` (its seq set here). Receive takes the reply to the last request sent (older ones
  // are dropped); DeadlineExceeded naming the server when none came in time; a kError reply is
  // FailedPrecondition with its text.
  virtual Status Send(Msg m) = 0;
  virtual StatusOr<Msg> Receive(std::chrono::milliseconds timeout) = 0;
  StatusOr<Msg> Request(Msg m, std::chrono::milliseconds timeout) {
    HUDDLE_RETURN_IF_ERROR(Send(std::move(m)));
    return Receive(timeout);
  }
};

}  // namespace huddle::datacenter
