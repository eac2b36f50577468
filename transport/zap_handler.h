// The coordinator's ZAP handler (ZeroMQ Authentication Protocol, RFC 27), and the one of a
// service's operators' endpoint: decides, during each CurveZMQ handshake, whether the peer's public
// key is enrolled.
//
// libzmq admits *any* CURVE client key unless a ZAP handler answers at inproc://zeromq.zap.01 in
// the socket's context, so the coordinator starts this handler before it binds. Each request is
// answered from the current AllowList: 200 with the enrolled client id as the ZAP User-Id (which
// ZeroMQ then attaches to every message of that connection, see zmq_transport.cc), or 400. Every
// refusal is counted; the first after a quiet period is logged with the key's fingerprint and the
// peer's address, the rest as one summary line per log_period_ms (a flood of fresh keys costs
// O(1) log lines). An enrolled key gets at most handshake_burst handshakes at once and
// handshakes_per_s after that; beyond, its handshakes are refused for now (kZapRetryLater, which
// the client retries without giving up), so one key cannot open connections faster than that.
//
// The allow-list is reloaded, without a restart, when its files change (checked every
// reload_interval_ms, and before refusing a key that is not enrolled: unknown_key_recheck_ms) or
// when *reload_requests changes (the CLI bumps it on SIGHUP). A reload fails
// safe: removals always apply; a bad entry (a malformed .pub, a .key file, an id or key claimed
// twice) is skipped, not enrolled, with an error naming its file; an allow-list that cannot be read
// at all (missing, unlistable, YAML that does not parse) admits nobody until it loads again.
//
// An allow-list is of one role (ZapOptions::role): the clients' takes only client keys, a
// service's operators' only operator keys, and a .pub of the other role is skipped naming its file
// and role. The role in a .pub is only what its file says, so with conflicting_path (a service
// sets each list's as the other's) a key enrolled in the other role's list is refused here too,
// whatever its file here says: one key is one role, so a client's key never acts as an operator,
// even with its .pub relabelled and copied into the operators' directory. Such a key is logged as
// an error naming both files at each (re)load; the other list is reloaded with this one (a change
// to either's files, or SIGHUP), and while it cannot be read, the keys last read from it stay
// refused here.
//
// Thread-safety: the handler runs on its own thread; the public methods are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "transport/curve_keys.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace huddle::transport {

struct ZapOptions {
  std::string allow_list_path;
  int64_t reload_interval_ms = 2000;
  const std::atomic<uint64_t>* reload_requests = nullptr;  // a change triggers a reload
  int64_t log_period_ms = 10'000;  // refused handshakes: at most one log line per period
  // Handshakes per enrolled key (a token bucket): past it, the handshake is refused for now
  // (kZapRetryLater; the client retries), so one key cannot churn connections (0: unlimited).
  double handshakes_per_s = 2;
  double handshake_burst = 16;
  // A handshake from a key that is not enrolled first checks whether the allow-list's files
  // changed (at most once per this interval, so a flood of strange keys costs one directory scan
  // per interval) and reloads them if so: a client enrolled a moment ago is admitted at once, not
  // refused until the next periodic check.
  int64_t unknown_key_recheck_ms = 100;
  // Which keys allow_list_path enrols: files of another role are skipped, naming them.
  AllowListRole role = AllowListRole::kClient;
  // The other role's allow-list (empty: none): a key enrolled there is never admitted here.
  std::string conflicting_path;
};

// One ZAP request (RFC 27: version, request id, domain, address, identity, mechanism,
// credentials), read whole from a handler's socket, at most 16 frames kept. `curve_key` is set for
// a well-formed CURVE request with a 32-byte client key.
struct ZapRequest {
  bool well_formed = false;  // version "1.0" and at least the seven frames above
  std::string request_id;
  std::string address;
  std::string mechanism;
  std::optional<CurveKey> curve_key;
};
ZapRequest ReadZapRequest(zmq::socket_t& socket);
// The ZAP status of a handshake refused for now (the peer may retry): "500", not RFC 27's "300"
// (temporary error), because libzmq answers 300 as RFC 26 puts it, without an ERROR command, and
// then leaves the connection open and silent until the handshake timeout (30 s by default), so
// the client could tell nothing and waited that long. A 500 reaches the client at once as a
// failed handshake with that status (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH), the server closes the
// connection, and libzmq reconnects after its reconnect interval. This handler sends 500 for
// nothing else.
inline constexpr uint32_t kZapRetryLater = 500;

// The reply to `request`: "200" (admitted as `user_id`, which ZeroMQ attaches to every message of
// the connection, with the admitted key's Z85 as the property kZapKeyProperty), "400" (refused) or
// kZapRetryLater (`retry_later`: refused for now), with `text`.
void SendZapReply(zmq::socket_t& socket, const ZapRequest& request, bool admit,
                  const std::string& text, const std::string& user_id, bool retry_later = false);
// A job-key gate: a ROUTER that admits only holders of one key pair (the rendezvous store's and
// the parameter servers' sockets, whose clients all hold the job's key). libzmq admits any CURVE
// client unless a ZAP handler answers in the socket's context, so `*zap` is bound there (a REP
// socket, `timeout_ms` for its sends and receives) before `router` is set as the CURVE server of
// `domain` with the key's secret half (`router` not bound yet). zmq::error_t on failure.
void OpenJobKeyGate(zmq::context_t& context, zmq::socket_t* zap, zmq::socket_t& router,
                    const std::string& secret_z85, const char* domain, int timeout_ms);
// Answers one handshake on the gate's `zap`: admitted (as "rank") iff its CURVE key is
// `job_key`. True when admitted.
bool AnswerJobKeyZap(zmq::socket_t& zap, const CurveKey& job_key);

// The ZAP metadata property that names the key a connection was admitted with (zmq_msg_gets): a
// live connection stays only while that key, not just its id, is enrolled, so rotating a client's
// key cuts the connections the old key holds.
inline constexpr const char* kZapKeyProperty = "X-Huddle-Key";

class ZapHandler {
 public:
  // Loads the allow-list (an error if it does not load), binds the ZAP endpoint in `context` and
  // starts serving. The handler must outlive every CURVE server socket of the context.
  static StatusOr<std::unique_ptr<ZapHandler>> Start(zmq::context_t& context, ZapOptions options);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // Reloads now (same rules as the periodic reload) and returns its outcome.
  Status Reload() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `id` is still enrolled with the key `key_z85` (the connection's kZapKeyProperty):
  // false once that key has been removed or replaced (a rotated key) and the list reloaded. An
  // empty `key_z85` (a connection without the property) asks for the id alone.
  bool IsEnrolled(const std::string& id, const std::string& key_z85) const;
  // Handshakes refused so far (throttled ones included).
  uint64_t rejections() const { return rejections_.load(); }
  // Handshakes of enrolled keys refused for now, over handshakes_per_s.
  uint64_t throttled() const { return throttled_.load(); }
  size_t enrolled() const;
  // Changes at every reload (whatever its outcome): IsEnrolled's answers cannot have changed while
  // this did not (the transport looks its live connections up again only then).
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

 private:
  explicit ZapHandler(ZapOptions options) : options_(std::move(options)) {}
  void Serve(zmq::socket_t& socket);
  void MaybeReload(int64_t now_ms) ABSL_LOCKS_EXCLUDED(mu_);
  // `key` is not enrolled in the list as loaded: reloads it if its files changed since (at most
  // once per unknown_key_recheck_ms) and looks the key up again.
  std::optional<std::string> RecheckUnknown(const CurveKey& key, int64_t now_ms)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The files behind both lists (a change to either reloads).
  std::string CurrentSignature() const;
  // The conflicting list as it reads now; nullopt when there is none or it cannot be read.
  std::optional<AllowList> LoadConflicting() const;
  // Leaves out of `list` every key enrolled in conflicting_, logging each; records them in
  // conflicts_.
  void DropConflicts(AllowList* list) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `key` is refused when it is enrolled in both lists, or nullopt.
  std::optional<std::string> ConflictOf(const CurveKey& key) const ABSL_LOCKS_EXCLUDED(mu_);

  ZapOptions options_;
  mutable absl::Mutex mu_;
  AllowList list_ ABSL_GUARDED_BY(mu_);
  std::string signature_ ABSL_GUARDED_BY(mu_);
  AllowList conflicting_ ABSL_GUARDED_BY(mu_);  // the other role's list, as last read
  std::map<CurveKey, std::string> conflicts_ ABSL_GUARDED_BY(mu_);  // key -> why it is refused
  uint64_t seen_requests_ = 0;
  int64_t next_check_ms_ = 0;
  int64_t last_recheck_ms_ = INT64_MIN / 2;
  std::atomic<uint64_t> rejections_{0};
  std::atomic<uint64_t> throttled_{0};
  std::atomic<uint64_t> generation_{0};  // bumped by every reload, under mu_
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace huddle::transport
