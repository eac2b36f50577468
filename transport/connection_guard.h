// Internal to the ZeroMQ transport (zmq_transport.cc, zmq_socket.cc): the server's
// per-connection bound on what libzmq buffers for a peer (zmq_transport.h, "Limits"). Linux only
// (TCP_INFO, SIOCINQ).
//
// Not thread-safe: the thread that owns the server socket calls it.
#pragma once

#include <arpa/inet.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/logging.h"
#include "transport/transport.h"
#include "transport/zmq_transport.h"

namespace huddle::transport {

// What a frame of `n` bytes took on the wire: ZMTP 3 framing (a flags byte and a 1- or 8-byte
// length), and with CurveZMQ each frame boxed in a MESSAGE command (8-byte name, 8-byte nonce,
// 16-byte MAC, 1 flags byte). Exact for libzmq peers, so the per-connection accounting does not
// drift over millions of messages; a peer that frames differently only over-counts itself.
inline uint64_t WireBytes(size_t n, bool curve) {
  const uint64_t body = curve ? n + 33 : n;
  return body + (body > 255 ? 9 : 2);
}

// "ip:port" of a connected socket's peer; empty when it has none (closed, not a socket).
inline std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char ip[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    return absl::StrCat(ip, ":", ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
    return absl::StrCat("[", ip, "]:", ntohs(a->sin6_port));
  }
  return "";
}

// Bytes TCP has received on `fd` (those libzmq has read plus those still queued in the kernel).
// nullopt when unavailable (not a TCP socket, or a kernel before 4.1 without tcpi_bytes_received).
inline std::optional<uint64_t> BytesReceived(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
    return std::nullopt;
  }
  return info.tcpi_bytes_received;
}

// Bytes of `fd` that libzmq has read from the kernel: received minus still queued. Queued is read
// first, so bytes arriving between the two calls count as read (an over-estimate).
inline std::optional<uint64_t> BytesRead(int fd) {
  int queued = 0;
  if (::ioctl(fd, SIOCINQ, &queued) != 0) return std::nullopt;
  std::optional<uint64_t> received = BytesReceived(fd);
  if (!received) return std::nullopt;
  return *received - std::min<uint64_t>(*received, static_cast<uint64_t>(std::max(0, queued)));
}

// Per-connection bound. libzmq buffers whatever a peer sends: its high-water mark counts only
// complete messages, the frames of an unfinished multipart message are invisible to us until the
// last one arrives, and ZMQ_MAXMSGSIZE bounds one frame. So the server watches every connection
// itself: the socket monitor reports each accepted connection's fd (and its end); each delivered
// message carries its fd (ZMQ_SRCFD) and its ZAP User-Id; and every connection_check_ms the
// kernel's counters say how many bytes libzmq has read from the fd. Read minus delivered (each
// frame counted as on the wire, WireBytes) is what libzmq holds for the connection: an unfinished
// message, complete ones not yet read, the handshake. Past the connection's bound (the fixed
// window plus its peer's upload allowance) the connection is shut down (shutdown(2), never
// close(2): libzmq owns the fd and tears the connection down on the error), which frees what
// libzmq held for it. A connection whose key was revoked is cut the same way.
//
// What a check looks at. What a connection holds is estimated as received minus delivered (its
// tcpi_bytes_received at its last measurement: an over-estimate, it includes the kernel's queue),
// and made exact (read minus delivered, Refine) only where a bound is at stake. The estimate only
// grows when bytes arrive (delivered bytes only grow), so a connection is measured again (one
// getsockopt) only when bytes may have arrived since its last measurement. Two epoll sets watch
// every connection's fd from its ACCEPTED on (they only watch: libzmq still reads and closes the
// fd, and a closed file leaves both sets by itself):
//   - arrivals, edge-triggered on EPOLLIN | EPOLLOUT | EPOLLRDHUP: every arrival queues an event.
//     epoll reports a queued event only if the fd is still readable or writable when it is drained,
//     and libzmq has usually read the bytes by then, so EPOLLOUT is what keeps the event: a socket
//     whose send buffer has room is writable. An event is lost only on a socket that is neither
//     (libzmq drained it, and the server's sends to the peer fill its send buffer: a peer that does
//     not read what the server sends, ZMTP PONGs included);
//   - writability, level-triggered on EPOLLOUT, drained every writability_check_ms (right after
//     the arrivals): every writable socket is reported (one pass in the kernel over all of them,
//     about a microsecond each, but no syscall per connection); those it does not report are
//     measured at every check until a later pass reports them writable. A socket that was
//     unwritable when the arrivals were drained and is writable again when this set is (a few
//     microseconds later) raises an event of the first set as its buffer frees: its arrival is seen
//     at the next check.
//   So a connection is measured at every check where bytes arrived, except one that became
//   unwritable since the last writability pass (its peer stopped reading what the server sends, or
//   acknowledging it): its arrivals that libzmq read before the check may go unseen until the next
//   pass, so what it can hold beyond its bound is its rate times writability_check_ms there, not
//   connection_check_ms (zmq_transport.h, "Limits").
// Each check then looks at:
//   - the connections with an arrival event, the unwritable ones (found by the last writability
//     pass), new ones (measured first), those whose routing id or identity was just learnt (a
//     different bound and group), and those whose estimate was over their bound at the last check
//     (libzmq may read what the kernel queued without another byte arriving, so a bound at stake
//     is refined again at every check until the estimate is back under it): each against its own
//     bound;
//   - the groups (identity, or unidentified address) of those, and the groups whose estimate was
//     over their bound at the last check, against the group's bound;
//   - the total of all estimates, kept as a running sum (every delivery lowers it), against the
//     global bound: past it, every connection is refined and the largest holders cut;
//   - revocation: every identified connection is looked up in the allow-list when the allow-list
//     changed (its generation, ZapHandler::generation()), and each connection once its identity is
//     learnt; in between, nothing in the list changed, so no answer can have changed.
// Every connection and group, as above, after anything lowered a bound since the last check (an
// upload allowance lowered, spent, or dropped with its connection; a connection with an allowance
// cut): the estimates of the others are still exact, their bounds are not. A connection whose fd
// could not be added to the epoll sets (or without them at all) is measured at every check, as
// every connection was before. So an idle connection costs no syscall per check (only its share
// of the writability pass), and, but for the unwritable case above, the cuts are the ones a
// measurement of every connection at every check would make: the estimate of a connection that
// received nothing is what measuring it would give.
//
// fd reuse: libzmq may close a connection's fd and reuse the number for a new one between two
// checks. Monitor events arrive in order (the close's DISCONNECTED before the next ACCEPTED) and
// are drained right before each check, which resets the counters of a reused fd; the peer address
// recorded at ACCEPTED must still match before a connection's counters are trusted past its bound
// or it is cut. The epoll sets follow: the old file left them when libzmq closed it, and the new
// connection's file is added at its ACCEPTED, before its first measurement, so bytes it received
// before are in that measurement and bytes after raise an event; each registration carries its
// connection's serial number with the fd, so an event of another file under the same number (one
// still open elsewhere) is ignored. Residual risks: a message of a closed connection that is read
// after its fd was reused is credited to the new connection (under-counting it by at most what the
// old one held, itself bounded) and labels it with the old identity until the new connection's own
// first message; and a close plus reuse by the same peer address between the drain and the
// shutdown (microseconds, needing the same source port) would cut the new connection, whose client
// then reconnects. A connection that never
// delivered a message is only known by its fd: the window bounds it, but revocation cannot find
// it (it has no identity yet). The monitor's events travel over an inproc pipe that libzmq's I/O
// thread writes with a blocking send: events are never lost, but while Receive() is not called
// for long under a flood of connections, the I/O thread waits for them to be drained.
class ConnectionGuard {
 public:
  // One message read from the socket, as the guard needs it.
  struct Delivered {
    int source_fd = -1;  // ZMQ_SRCFD of its frames, -1 if unknown
    const std::string& routing_id;
    const std::optional<std::string>& user_id;  // ZAP User-Id
    uint64_t wire_bytes = 0;                    // its frames as on the wire (WireBytes)
    std::string_view auth_key = {};             // the key it was admitted with (Z85), if known
  };

  struct Connection {
    std::string address;  // the peer's ip:port at ACCEPTED
    uint64_t delivered_wire_bytes = 0;
    std::string routing_id;
    std::string auth_id;
    std::string auth_key;  // Z85 of the key the handshake admitted ("" when unknown)
    bool cut = false;
    // The checks' bookkeeping ("What a check looks at").
    std::string owner;        // the group it counts in (Owner()), while counted
    uint64_t received = 0;    // tcpi_bytes_received at its last measurement
    uint64_t held = 0;        // received - delivered: what it holds at most (the estimate)
    uint64_t exact_held = 0;  // read - delivered, as refined in check number `refined_in`
    uint64_t refined_in = 0;
    size_t group_index = 0;    // its place in members_[owner]
    uint32_t serial = 0;       // tells its epoll registrations from older ones under its fd
    uint64_t writable_in = 0;  // the check whose writability pass reported it
    bool counted = false;      // measured: it is in members_ and total_held_
    bool polled = false;       // in both epoll sets: bytes arriving mark it dirty
    bool unwritable = false;   // not reported by the last writability pass: measured every check
    bool dirty = true;         // bytes may have arrived since its last measurement
    bool queued = false;       // in queue_: the next check looks at it
    bool verify = false;       // its identity is to be looked up in the allow-list
    bool refined = false;      // the refinement in check `refined_in` succeeded
  };

  explicit ConnectionGuard(const ZmqOptions& options)
      : options_(options),
        cut_log_("connections cut", options.log_period_ms),
        arrivals_fd_(::epoll_create1(EPOLL_CLOEXEC)),
        writable_fd_(::epoll_create1(EPOLL_CLOEXEC)) {
    if (arrivals_fd_ < 0 || writable_fd_ < 0) {
      spdlog::warn("epoll_create1: {}: every connection is measured at every check",
                   std::strerror(errno));
    }
  }
  ~ConnectionGuard() {
    if (arrivals_fd_ >= 0) ::close(arrivals_fd_);
    if (writable_fd_ >= 0) ::close(writable_fd_);
  }
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  void OnAccepted(int fd) {
    auto [it, fresh] = connections_.try_emplace(fd);
    if (!fresh) Release(it->second);  // its end was not reported (cannot be: events are ordered)
    Connection& c = it->second;
    c = Connection{PeerAddress(fd)};
    c.serial = ++serials_;
    if (c.address.empty()) return;  // already closed, or not TCP/IP: never looked at
    c.polled = Watch(fd, c.serial);
    ++(c.polled ? polled_ : unpolled_);
    Enqueue(fd, c);  // measured at the next check
  }
  void OnClosed(int fd) {
    auto it = connections_.find(fd);
    if (it == connections_.end()) return;
    // (Its file left the epoll sets when libzmq closed it; the number may be another file's now.)
    if (!it->second.routing_id.empty() && allowances_.erase(it->second.routing_id) > 0) {
      full_ = true;  // the global bound is lower, and so may be a group's
    }
    Release(it->second);
    connections_.erase(it);
  }

  // A message read from the socket: credits its connection and spends the upload allowance of its
  // peer. False if the message alone exceeded the connection's bound (it arrived whole between
  // two checks): the connection is cut and the message must be dropped.
  bool OnDelivered(int64_t now_ms, const Delivered& m) {
    Connection* c = nullptr;
    if (m.source_fd >= 0) {
      auto it = connections_.find(m.source_fd);
      if (it != connections_.end()) {
        c = &it->second;
        c->delivered_wire_bytes += m.wire_bytes;
        if (c->counted) SetHeld(*c, Estimate(*c));
        if (c->routing_id != m.routing_id) {  // its first message: its peer's allowance counts
          c->routing_id = m.routing_id;
          Enqueue(m.source_fd, *c);
        }
        if (m.user_id && c->auth_id != *m.user_id) {  // its first message: it counts for its key
          c->auth_id = *m.user_id;
          c->auth_key = std::string(m.auth_key);
          c->verify = true;
          if (c->counted) {
            Uncount(*c);
            Count(m.source_fd, *c);
          }
          Enqueue(m.source_fd, *c);
        }
      }
    }
    uint64_t allowance = 0;
    auto a = allowances_.find(m.routing_id);
    if (a != allowances_.end()) {
      allowance = a->second;
      a->second -= std::min<uint64_t>(a->second, m.wire_bytes);
      if (a->second == 0) allowances_.erase(a);
      full_ = true;  // spent: a bound lowered
    }
    const uint64_t bound = options_.connection_window_bytes + allowance;
    if (m.wire_bytes <= bound) return true;
    if (c != nullptr && !c->cut) {
      Cut(now_ms, m.source_fd, *c,
          absl::StrCat("it sent a message of ", m.wire_bytes, " bytes, over its bound of ", bound,
                       " (window ", options_.connection_window_bytes, " + upload allowance ",
                       allowance, ")"));
    }
    return false;
  }

  void SetAllowance(const PeerId& peer, size_t bytes) {
    auto it = allowances_.find(peer);
    const uint64_t before = it == allowances_.end() ? 0 : it->second;
    if (bytes == 0) {
      if (it != allowances_.end()) allowances_.erase(it);
    } else if (it != allowances_.end()) {
      it->second = bytes;
    } else {
      allowances_.emplace(peer, bytes);
    }
    if (bytes < before) full_ = true;  // a raised bound cuts nothing
  }

  // Cuts every connection over its bound, or whose identity `enrolled` says is revoked (those are
  // appended to *revoked); then enforces the aggregate bounds (per identity, per unidentified
  // address, global; zmq_transport.h, "Limits"). Looks at what may have changed since the last
  // check only ("What a check looks at"); `allow_list_generation` changes whenever the answers of
  // `enrolled` may have. True if it cut anything.
  template <typename EnrolledFn>
  bool Check(int64_t now_ms, uint64_t allow_list_generation, EnrolledFn&& enrolled,
             std::vector<Connection>* revoked) {
    cut_log_.Flush(now_ms);
    const uint64_t cut_before = cut_;
    ++checks_;
    CollectArrivals();
    if (now_ms >= next_writability_ms_) {
      next_writability_ms_ = now_ms + std::max<int64_t>(1, options_.writability_check_ms);
      CollectUnwritable();
    }
    for (const int fd : unwritable_) {  // measured at every check until found writable
      auto it = connections_.find(fd);
      if (it == connections_.end() || !it->second.unwritable) continue;
      it->second.dirty = true;
      Enqueue(fd, it->second);
    }
    if (unpolled_ > 0) {  // not in the epoll sets: measured at every check
      for (auto& [fd, c] : connections_) {
        if (c.polled || c.address.empty()) continue;
        c.dirty = true;
        Enqueue(fd, c);
      }
    }
    const bool list_changed = !generation_ || *generation_ != allow_list_generation;
    generation_ = allow_list_generation;
    full_pass_ = full_ || list_changed;
    full_ = false;
    work_.clear();
    if (full_pass_) {
      queue_.clear();
      for (auto& [fd, c] : connections_) {
        c.queued = true;
        work_.push_back(fd);
      }
    } else {
      work_.swap(queue_);  // what comes back into queue_ is for the next check
    }
    touched_.clear();
    for (const int fd : work_) {
      auto it = connections_.find(fd);
      if (it == connections_.end() || !it->second.queued) continue;  // gone, or listed twice
      Connection& c = it->second;
      c.queued = false;
      if (c.cut || c.address.empty()) continue;
      if ((list_changed || c.verify) && !c.auth_id.empty() && !enrolled(c.auth_id, c.auth_key)) {
        if (Cut(now_ms, fd, c, "its key was revoked (removed from the allow-list)")) {
          revoked->push_back(c);
        } else {  // its fd was reused: the monitor reports its end; until then it counts nothing
          Uncount(c);
          c.verify = true;
          Enqueue(fd, c);
        }
        continue;
      }
      c.verify = false;
      Examine(now_ms, fd, c);
    }
    // The groups: all of them, or those of the connections looked at and those at stake.
    if (full_pass_) {
      touched_.clear();
      for (const auto& [owner, members] : members_) touched_.push_back(owner);
    } else {
      touched_.insert(touched_.end(), stake_owners_.begin(), stake_owners_.end());
      std::sort(touched_.begin(), touched_.end());
      touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
    }
    stake_owners_.clear();
    for (const std::string& owner : touched_) EnforceGroup(now_ms, owner);
    // The global bound, on the running total of the estimates.
    if (total_held_ > options_.max_buffered_bytes) {
      uint64_t global = options_.max_buffered_bytes;
      for (const auto& [peer, bytes] : allowances_) global += bytes;
      if (total_held_ > global) EnforceGlobal(now_ms, global);
    }
    full_pass_ = false;
    return cut_ != cut_before;
  }

  uint64_t cut() const { return cut_; }
  // Counter reads (getsockopt TCP_INFO) of the checks so far, refinements excluded (for tests).
  uint64_t measurements() const { return measurements_; }

 private:
  // The window plus the upload allowance of the connection's peer.
  uint64_t Bound(const Connection& c) const {
    const auto a = allowances_.find(c.routing_id);
    return options_.connection_window_bytes + (a == allowances_.end() ? 0 : a->second);
  }

  static uint64_t Estimate(const Connection& c) {
    return c.received > c.delivered_wire_bytes ? c.received - c.delivered_wire_bytes : 0;
  }

  // A connection and what it holds: the estimate (received) until refined (read).
  struct Holder {
    int fd;
    Connection* c;
    uint64_t held;
    bool exact;
  };
  struct Member {
    int fd;
    Connection* c;  // stable: connections_ is node-based, and a member leaves before it is erased
  };

  Holder MakeHolder(int fd, Connection& c) const {
    Holder h{fd, &c, c.held, false};
    if (c.refined_in == checks_ && c.refined) {
      h.held = c.exact_held;
      h.exact = true;
    }
    return h;
  }

  static uint64_t Tag(int fd, uint32_t serial) {
    return (uint64_t{serial} << 32) | static_cast<uint32_t>(fd);
  }
  // The connection an epoll event is about, or null (an older file under the same number).
  Connection* Tagged(uint64_t tag) {
    auto it = connections_.find(static_cast<int>(static_cast<uint32_t>(tag)));
    if (it == connections_.end() || it->second.serial != static_cast<uint32_t>(tag >> 32)) {
      return nullptr;
    }
    return &it->second;
  }

  // Adds `fd` to both epoll sets ("What a check looks at").
  bool Watch(int fd, uint32_t serial) {
    if (arrivals_fd_ < 0 || writable_fd_ < 0) return false;
    epoll_event arrivals{};
    arrivals.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET;
    arrivals.data.u64 = Tag(fd, serial);
    epoll_event writable{};
    writable.events = EPOLLOUT;
    writable.data.u64 = Tag(fd, serial);
    // EEXIST: this file is already there under this number, added when an earlier connection's
    // ACCEPTED was read after libzmq had reused its fd for this one: updated to this serial.
    auto add = [fd](int epoll_fd, epoll_event* ev) {
      return ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, ev) == 0 ||
             (errno == EEXIST && ::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, ev) == 0);
    };
    return add(arrivals_fd_, &arrivals) && add(writable_fd_, &writable);
  }

  // Marks the connections that had bytes (or their end) arrive since the last drain.
  void CollectArrivals() {
    if (arrivals_fd_ < 0) return;
    constexpr int kBatch = 256;
    epoll_event events[kBatch];
    for (size_t round = 0; round <= connections_.size() / kBatch + 1; ++round) {
      const int n = ::epoll_wait(arrivals_fd_, events, kBatch, 0);
      for (int i = 0; i < n; ++i) {
        Connection* c = Tagged(events[i].data.u64);
        if (c == nullptr) continue;
        c->dirty = true;
        Enqueue(static_cast<int>(static_cast<uint32_t>(events[i].data.u64)), *c);
      }
      if (n < kBatch && !(n < 0 && errno == EINTR)) return;
    }
  }

  // The writability pass: finds the watched connections that are not writable now (their arrival
  // events may be lost) into unwritable_. One epoll_wait reports every writable one; when that is
  // all of them, nothing else is looked at.
  void CollectUnwritable() {
    for (const int fd : unwritable_) {
      auto it = connections_.find(fd);
      if (it != connections_.end()) it->second.unwritable = false;
    }
    unwritable_.clear();
    if (writable_fd_ < 0 || polled_ == 0) return;
    size_t reported = 0;
    for (int round = 0; round < 4; ++round) {  // (what is left unreported counts as unwritable)
      writable_events_.resize(polled_ + 64);
      const int n = ::epoll_wait(writable_fd_, writable_events_.data(),
                                 static_cast<int>(writable_events_.size()), 0);
      if (n < 0 && errno == EINTR) continue;
      for (int i = 0; i < n; ++i) {
        Connection* c = Tagged(writable_events_[i].data.u64);
        if (c == nullptr || !c->polled || c->writable_in == checks_) continue;
        c->writable_in = checks_;
        ++reported;
      }
      // A full buffer may have left some out (they come first in the next call).
      if (n < static_cast<int>(writable_events_.size()) || reported >= polled_) break;
    }
    if (reported >= polled_) return;
    for (auto& [fd, c] : connections_) {
      if (!c.polled || c.address.empty() || c.cut || c.writable_in == checks_) continue;
      c.unwritable = true;
      unwritable_.push_back(fd);
    }
  }

  void Enqueue(int fd, Connection& c) {
    if (c.queued) return;
    c.queued = true;
    queue_.push_back(fd);
  }

  // Into its group and the running total (measured).
  void Count(int fd, Connection& c) {
    c.owner = Owner(c);
    std::vector<Member>& members = members_[c.owner];
    c.group_index = members.size();
    members.push_back({fd, &c});
    c.counted = true;
    total_held_ += c.held;
  }
  void Uncount(Connection& c) {
    if (!c.counted) return;
    auto g = members_.find(c.owner);
    std::vector<Member>& members = g->second;
    members[c.group_index] = members.back();
    members[c.group_index].c->group_index = c.group_index;
    members.pop_back();
    if (members.empty()) members_.erase(g);
    total_held_ -= c.held;
    c.counted = false;
  }
  void SetHeld(Connection& c, uint64_t held) {
    if (c.counted) total_held_ = total_held_ - c.held + held;
    c.held = held;
  }
  // Before its record is dropped or reused.
  void Release(Connection& c) {
    Uncount(c);
    if (!c.address.empty()) --(c.polled ? polled_ : unpolled_);
  }

  // Reads the connection's received counter (one getsockopt).
  void Measure(int fd, Connection& c) {
    c.dirty = false;
    ++measurements_;
    std::optional<uint64_t> received = BytesReceived(fd);
    if (!received) {
      if (!warned_no_counters_ && PeerAddress(fd) == c.address) {
        warned_no_counters_ = true;
        spdlog::warn(
            "cannot read TCP counters of connection {} (not TCP, or kernel < 4.1): what one "
            "connection can make the coordinator buffer is not bounded",
            c.address);
      }
      Uncount(c);
      return;
    }
    c.received = *received;
    if (!c.counted) Count(fd, c);
  }

  // One connection against its own bound (measured first if bytes arrived).
  void Examine(int64_t now_ms, int fd, Connection& c) {
    if (c.dirty || !c.counted) Measure(fd, c);
    if (!c.counted) return;
    // Over-credit (a peer framing unlike libzmq) must not become headroom: resynchronize.
    if (c.received < c.delivered_wire_bytes) c.delivered_wire_bytes = c.received;
    SetHeld(c, c.received - c.delivered_wire_bytes);
    if (!full_pass_) touched_.push_back(c.owner);
    const uint64_t bound = Bound(c);
    if (c.held <= bound) return;
    Holder h = MakeHolder(fd, c);
    if (Refine(h) && h.held > bound) {
      Cut(now_ms, fd, c,
          absl::StrCat("it held ", h.held, " undelivered bytes, over its bound of ", bound,
                       " (window ", options_.connection_window_bytes, " + upload allowance ",
                       bound - options_.connection_window_bytes, ")"));
      return;
    }
    // At stake: what the kernel queued may reach libzmq without another byte arriving.
    Enqueue(fd, c);
  }

  // Replaces h's estimate with what libzmq has read minus what was delivered (once per check and
  // connection). False if the fd was reused or its counters are gone (then it holds nothing of
  // this connection's).
  bool Refine(Holder& h) {
    if (h.exact) return true;
    Connection& c = *h.c;
    if (c.refined_in != checks_) {
      c.refined_in = checks_;
      c.refined = false;
      if (PeerAddress(h.fd) != c.address) return false;
      std::optional<uint64_t> read = BytesRead(h.fd);
      if (!read) return false;
      if (*read < c.delivered_wire_bytes) {
        c.delivered_wire_bytes = *read;
        SetHeld(c, Estimate(c));  // a higher estimate: looked at again at the next check
        Enqueue(h.fd, c);
      }
      c.exact_held = *read - c.delivered_wire_bytes;
      c.refined = true;
    }
    if (!c.refined) return false;
    h.held = c.exact_held;
    h.exact = true;
    return true;
  }

  // Who a connection counts against: its identity, or, before its first delivered message, its
  // IP address.
  static std::string Owner(const Connection& c) {
    if (!c.auth_id.empty()) return "client '" + c.auth_id + "'";
    const size_t colon = c.address.rfind(':');
    return "address " + (colon == std::string::npos ? c.address : c.address.substr(0, colon));
  }

  // Cuts the largest of `group` until it holds at most `bound`; returns what it still holds.
  uint64_t CutDownTo(int64_t now_ms, std::vector<Holder*>& group, uint64_t bound,
                     const std::string& what) {
    uint64_t total = 0;
    for (const Holder* h : group) total += h->held;
    if (total <= bound) return total;
    total = 0;
    for (Holder* h : group) {
      if (!Refine(*h)) h->held = 0;
      total += h->held;
    }
    std::sort(group.begin(), group.end(),
              [](const Holder* a, const Holder* b) { return a->held > b->held; });
    for (Holder* h : group) {
      if (total <= bound || h->held == 0) break;
      const uint64_t before = total;
      if (Cut(now_ms, h->fd, *h->c,
              absl::StrCat(what, " held ", before, " undelivered bytes over ", group.size(),
                           " connections, over its bound of ", bound, "; this one held ",
                           h->held))) {
        total -= h->held;
        h->held = 0;
      }
    }
    return total;
  }

  // One group (an identity, or an unidentified address) against its bound (zmq_transport.h,
  // "Limits"): at most two windows plus its largest upload allowance, or
  // unidentified_bytes_per_address.
  void EnforceGroup(int64_t now_ms, const std::string& owner) {
    auto g = members_.find(owner);
    if (g == members_.end()) return;
    const bool identified = !g->second.front().c->auth_id.empty();
    uint64_t estimate = 0;
    uint64_t bound = options_.unidentified_bytes_per_address;
    if (identified) {
      uint64_t allowance = 0;
      for (const Member& m : g->second) allowance = std::max(allowance, Bound(*m.c));
      bound = allowance + options_.connection_window_bytes;
    }
    for (const Member& m : g->second) estimate += m.c->held;
    if (estimate <= bound) return;
    std::vector<Holder> holders;
    holders.reserve(g->second.size());
    for (const Member& m : g->second) holders.push_back(MakeHolder(m.fd, *m.c));
    std::vector<Holder*> group;
    for (Holder& h : holders) group.push_back(&h);
    CutDownTo(now_ms, group, bound, owner);
    // Still over as estimated (what is left holds at most its bound, but libzmq may read the rest
    // of what the kernel queued): looked at again at the next check.
    uint64_t left = 0;
    for (const Holder& h : holders) left += h.c->cut ? 0 : h.c->held;
    if (left > bound) stake_owners_.push_back(owner);
  }

  // Past the global bound (the running total of the estimates says so): every connection refined,
  // then the largest holder of whoever holds the most is cut, until under the bound.
  void EnforceGlobal(int64_t now_ms, uint64_t global) {
    size_t n = 0;
    for (const auto& [owner, members] : members_) n += members.size();
    std::vector<Holder> holders;
    holders.reserve(n);  // no reallocation: groups point into it
    std::unordered_map<std::string, std::vector<Holder*>> groups;
    for (const auto& [owner, members] : members_) {
      std::vector<Holder*>& group = groups[owner];
      for (const Member& m : members) {
        holders.push_back(MakeHolder(m.fd, *m.c));
        group.push_back(&holders.back());
      }
    }
    // Fair cuts: the largest holder of whoever holds the most, until under the global bound.
    std::unordered_map<std::string, uint64_t> held;
    uint64_t total = 0;
    for (auto& [owner, group] : groups) {
      for (Holder* h : group) {
        if (h->held > 0 && !Refine(*h)) h->held = 0;
        held[owner] += h->held;
        total += h->held;
      }
    }
    while (total > global) {
      auto top = std::max_element(held.begin(), held.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
      if (top == held.end() || top->second == 0) break;
      std::vector<Holder*>& group = groups[top->first];
      Holder* largest =
          *std::max_element(group.begin(), group.end(),
                            [](const Holder* a, const Holder* b) { return a->held < b->held; });
      const uint64_t freed = largest->held;
      if (freed == 0) {  // nothing left to cut there (cannot happen: held sums the group)
        top->second = 0;
        continue;
      }
      Cut(now_ms, largest->fd, *largest->c,
          absl::StrCat("all connections held ", total, " undelivered bytes, over the bound of ",
                       global, ", and ", top->first, " held the most (", top->second,
                       "); this one held ", freed));
      largest->held = 0;  // cut, or its fd reused: either way no longer this connection's
      top->second -= freed;
      total -= freed;
    }
  }

  // Whether it was cut (not if already closed: the fd was reused, and the monitor will tell).
  bool Cut(int64_t now_ms, int fd, Connection& c, const std::string& why) {
    if (PeerAddress(fd) != c.address) return false;
    ::shutdown(fd, SHUT_RDWR);
    c.cut = true;
    cut_++;
    // It no longer counts; a group whose bound was its allowance has a lower one now.
    Uncount(c);
    if (allowances_.count(c.routing_id) > 0) full_ = true;
    const std::string who = c.auth_id.empty() ? c.address : c.auth_id;
    cut_log_.Add(now_ms, who, [&] {
      return absl::StrCat("cut the connection of ",
                          c.auth_id.empty() ? "an unidentified peer" : "client '" + c.auth_id + "'",
                          " from ", c.address,
                          c.routing_id.empty() ? "" : " (peer " + PeerName(c.routing_id) + ")",
                          ": ", why, " (", cut_, " connections cut so far)");
    });
    return true;
  }

  const ZmqOptions& options_;                        // the server's
  std::unordered_map<int, Connection> connections_;  // by fd
  std::unordered_map<PeerId, uint64_t> allowances_;  // by routing id
  uint64_t cut_ = 0;
  bool warned_no_counters_ = false;
  LogSummary cut_log_;
  int arrivals_fd_ = -1;  // epoll: the connections' fds, edge-triggered on arrivals (-1: none)
  int writable_fd_ = -1;  // epoll: the same, level-triggered on EPOLLOUT (-1: none)
  std::vector<epoll_event> writable_events_;
  std::vector<int> unwritable_;  // found by the last writability pass (may be gone since)
  int64_t next_writability_ms_ = 0;
  // The counted connections (measured, not cut) by owner, and the sum of their estimates.
  std::unordered_map<std::string, std::vector<Member>> members_;
  uint64_t total_held_ = 0;
  std::vector<int> queue_;                 // fds the next check looks at (may repeat, or be gone)
  std::vector<int> work_;                  // the current check's
  std::vector<std::string> touched_;       // owners whose group the current check looks at
  std::vector<std::string> stake_owners_;  // groups over their bound as estimated, last check
  std::optional<uint64_t> generation_;     // the allow-list's at the last check
  size_t polled_ = 0;                      // connections (with an address) in both epoll sets
  size_t unpolled_ = 0;                    // those not
  uint32_t serials_ = 0;
  uint64_t checks_ = 0;
  uint64_t measurements_ = 0;
  bool full_ = false;       // a bound lowered since the last check: the next looks at everything
  bool full_pass_ = false;  // the current check looks at everything
};

}  // namespace huddle::transport
