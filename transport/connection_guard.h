// Internal to transport/zmq_transport.cc: the server's per-connection bound on what libzmq
// buffers for a peer (zmq_transport.h, "Limits"). Linux only (TCP_INFO, SIOCINQ).
//
// Not thread-safe: the thread that owns the server socket calls it.
#pragma once

#include <arpa/inet.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
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
// fd reuse: libzmq may close a connection's fd and reuse the number for a new one between two
// checks. Monitor events arrive in order (the close's DISCONNECTED before the next ACCEPTED) and
// are drained right before each check, which resets the counters of a reused fd; the peer address
// recorded at ACCEPTED must still match before a connection's counters are trusted past its bound
// or it is cut. Residual risks: a
// message of a closed connection that is read after its fd was reused is credited to the new
// connection (under-counting it by at most what the old one held, itself bounded) and labels it
// with the old identity until the new connection's own first message; and a close plus reuse by
// the same peer address between the drain and the shutdown (microseconds, needing the same source
// port) would cut the new connection, whose client then reconnects. A connection that never
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
  };

  struct Connection {
    std::string address;  // the peer's ip:port at ACCEPTED
    uint64_t delivered_wire_bytes = 0;
    std::string routing_id;
    std::string auth_id;
    bool cut = false;
  };

  explicit ConnectionGuard(const ZmqOptions& options)
      : options_(options), cut_log_("connections cut", options.log_period_ms) {}

  void OnAccepted(int fd) { connections_[fd] = Connection{PeerAddress(fd)}; }
  void OnClosed(int fd) {
    auto it = connections_.find(fd);
    if (it == connections_.end()) return;
    if (!it->second.routing_id.empty()) allowances_.erase(it->second.routing_id);
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
        c->routing_id = m.routing_id;
        if (m.user_id) c->auth_id = *m.user_id;
      }
    }
    uint64_t allowance = 0;
    auto a = allowances_.find(m.routing_id);
    if (a != allowances_.end()) {
      allowance = a->second;
      a->second -= std::min<uint64_t>(a->second, m.wire_bytes);
      if (a->second == 0) allowances_.erase(a);
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
    if (bytes == 0) {
      allowances_.erase(peer);
    } else {
      allowances_[peer] = bytes;
    }
  }

  // Cuts every connection over its bound, or whose identity `enrolled` says is revoked (those are
  // appended to *revoked); then enforces the aggregate bounds (per identity, per unidentified
  // address, global; zmq_transport.h, "Limits"). True if it cut anything.
  template <typename EnrolledFn>
  bool Check(int64_t now_ms, EnrolledFn&& enrolled, std::vector<Connection>* revoked) {
    cut_log_.Flush(now_ms);
    const uint64_t cut_before = cut_;
    std::vector<Holder> live;
    live.reserve(connections_.size());
    for (auto& [fd, c] : connections_) {
      if (c.cut || c.address.empty()) continue;
      if (!c.auth_id.empty() && !enrolled(c.auth_id)) {
        if (Cut(now_ms, fd, c, "its key was revoked (removed from the allow-list)")) {
          revoked->push_back(c);
        }
        continue;
      }
      // One syscall per connection and check in the common case: received bytes over-estimate
      // what libzmq holds (they include the kernel's queue); only past a bound is it refined.
      std::optional<uint64_t> received = BytesReceived(fd);
      if (!received) {
        if (!warned_no_counters_ && PeerAddress(fd) == c.address) {
          warned_no_counters_ = true;
          spdlog::warn(
              "cannot read TCP counters of connection {} (not TCP, or kernel < 4.1): what one "
              "connection can make the coordinator buffer is not bounded",
              c.address);
        }
        continue;
      }
      // Over-credit (a peer framing unlike libzmq) must not become headroom: resynchronize.
      if (*received < c.delivered_wire_bytes) c.delivered_wire_bytes = *received;
      Holder h{fd, &c, *received - c.delivered_wire_bytes, false};
      const uint64_t bound = Bound(c);
      if (h.held > bound) {
        if (!Refine(h)) continue;
        if (h.held > bound) {
          Cut(now_ms, fd, c,
              absl::StrCat("it held ", h.held, " undelivered bytes, over its bound of ", bound,
                           " (window ", options_.connection_window_bytes, " + upload allowance ",
                           bound - options_.connection_window_bytes, ")"));
          continue;
        }
      }
      live.push_back(h);
    }
    EnforceAggregates(now_ms, live);
    return cut_ != cut_before;
  }

  uint64_t cut() const { return cut_; }

 private:
  // The window plus the upload allowance of the connection's peer.
  uint64_t Bound(const Connection& c) const {
    const auto a = allowances_.find(c.routing_id);
    return options_.connection_window_bytes + (a == allowances_.end() ? 0 : a->second);
  }

  // A live connection and what it holds: an over-estimate (received) until refined (read).
  struct Holder {
    int fd;
    Connection* c;
    uint64_t held;
    bool exact;
  };

  // Replaces h's estimate with what libzmq has read minus what was delivered. False if the fd was
  // reused or its counters are gone (then it holds nothing of this connection's).
  bool Refine(Holder& h) {
    if (h.exact) return true;
    if (PeerAddress(h.fd) != h.c->address) return false;
    std::optional<uint64_t> read = BytesRead(h.fd);
    if (!read) return false;
    if (*read < h.c->delivered_wire_bytes) h.c->delivered_wire_bytes = *read;
    h.held = *read - h.c->delivered_wire_bytes;
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

  // The bounds across connections (zmq_transport.h, "Limits").
  void EnforceAggregates(int64_t now_ms, std::vector<Holder>& live) {
    std::unordered_map<std::string, std::vector<Holder*>> groups;
    for (Holder& h : live) groups[Owner(*h.c)].push_back(&h);
    uint64_t total = 0;
    for (auto& [owner, group] : groups) {
      uint64_t bound = options_.unidentified_bytes_per_address;
      if (!group.front()->c->auth_id.empty()) {
        uint64_t allowance = 0;
        for (const Holder* h : group) allowance = std::max(allowance, Bound(*h->c));
        bound = allowance + options_.connection_window_bytes;
      }
      total += CutDownTo(now_ms, group, bound, owner);
    }
    uint64_t global = options_.max_buffered_bytes;
    for (const auto& [peer, bytes] : allowances_) global += bytes;
    if (total <= global) return;
    // Fair cuts: the largest holder of whoever holds the most, until under the global bound.
    std::unordered_map<std::string, uint64_t> held;
    total = 0;
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
};

}  // namespace huddle::transport
