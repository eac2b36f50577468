#include "transport/zmq_socket.h"

#include <cstring>
#include <memory>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "transport/connection_guard.h"
#include "transport/zap_handler.h"

namespace huddle::transport::zmq_internal {
namespace {

// Frees a zero-copy frame: drops the payload owner's reference.
void ReleaseOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

// A frame referencing `chunk` (part of p's bytes) that keeps p's owner alive until sent.
zmq::message_t ZeroCopyFrame(const wire::TensorPayload& p, std::span<const std::byte> chunk) {
  if (chunk.empty()) return zmq::message_t();
  auto* hint = new std::shared_ptr<const void>(p.owner);
  return zmq::message_t(const_cast<std::byte*>(chunk.data()), chunk.size(), &ReleaseOwner, hint);
}

}  // namespace

StatusOr<size_t> SendFrames(zmq::socket_t& socket, const std::string* routing_id,
                            const wire::Message& msg) {
  const std::string header = wire::EncodeHeader(msg);
  size_t bytes = header.size();
  try {
    if (routing_id != nullptr) {
      auto sent = socket.send(zmq::buffer(*routing_id),
                              zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      if (!sent) return absl::UnavailableError("peer's send queue is full");
    }
    const bool more = !msg.tensors.empty();
    auto sent =
        socket.send(zmq::buffer(header), more ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                              : zmq::send_flags::dontwait);
    if (!sent) return absl::UnavailableError("send queue is full or no connection");
    for (size_t i = 0; i < msg.tensors.size(); ++i) {
      const std::vector<std::span<const std::byte>> chunks = wire::Chunks(msg.tensors[i].bytes);
      for (size_t c = 0; c < chunks.size(); ++c) {
        const bool last = i + 1 == msg.tensors.size() && c + 1 == chunks.size();
        zmq::message_t frame = ZeroCopyFrame(msg.tensors[i], chunks[c]);
        bytes += frame.size();
        socket.send(frame, last ? zmq::send_flags::dontwait
                                : zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      }
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return absl::NotFoundError("peer is not connected");
    return absl::UnavailableError(absl::StrCat("zmq send: ", e.what()));
  }
  return bytes;
}

int64_t SteadyNowMs() { return SteadyClock::Get()->NowMs(); }

zmq::socket_t StartMonitor(zmq::context_t& context, zmq::socket_t& socket, int events,
                           const char* role) {
  static std::atomic<uint64_t> monitors{0};
  const std::string endpoint =
      absl::StrCat("inproc://huddle-", role, "-monitor-", monitors.fetch_add(1));
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), events) != 0) throw zmq::error_t();
  zmq::socket_t monitor(context, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::linger, 0);
  monitor.connect(endpoint);
  return monitor;
}

std::optional<MonitorEvent> NextMonitorEvent(zmq::socket_t& monitor) {
  while (true) {
    zmq::message_t event, address;
    if (!monitor.recv(event, zmq::recv_flags::dontwait)) return std::nullopt;
    if (event.more()) (void)monitor.recv(address, zmq::recv_flags::none);
    if (event.size() < 6) continue;
    MonitorEvent e;
    std::memcpy(&e.id, event.data(), 2);
    std::memcpy(&e.value, static_cast<const char*>(event.data()) + 2, 4);
    return e;
  }
}

RawMessage RecvRaw(zmq::socket_t& socket, bool has_prefix, const wire::CodecLimits& limits,
                   bool curve) {
  RawMessage out;
  bool first = true;
  while (true) {
    auto msg = std::make_shared<zmq::message_t>();
    auto got = socket.recv(*msg, zmq::recv_flags::none);
    (void)got;  // a poll said readable; parts of a multipart message arrive together
    out.bytes += msg->size();
    const bool more = msg->more();
    if (first && has_prefix) {
      out.prefix.assign(static_cast<const char*>(msg->data()), msg->size());
    } else {
      out.wire_bytes += WireBytes(msg->size(), curve);
      if (out.source_fd < 0) out.source_fd = msg->get(ZMQ_SRCFD);
      if (!out.user_id) {
        // Set by the ZAP handler at the handshake; ZeroMQ attaches it to every message.
        if (const char* uid = zmq_msg_gets(msg->handle(), "User-Id"); uid != nullptr) {
          out.user_id = uid;
          if (const char* key = zmq_msg_gets(msg->handle(), kZapKeyProperty); key != nullptr) {
            out.auth_key = key;
          }
        }
      }
      if (out.frames.size() < limits.max_frames) {
        auto bytes =
            std::span<const std::byte>(static_cast<const std::byte*>(msg->data()), msg->size());
        out.frames.push_back(wire::Frame{msg, bytes});
      } else {
        out.too_many = true;
      }
    }
    first = false;
    if (!more) break;
  }
  return out;
}

StatusOr<wire::Message> DecodeRaw(const RawMessage& raw, const wire::CodecLimits& limits) {
  if (raw.too_many) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: more than ", limits.max_frames, " frames"));
  }
  return wire::Decode(raw.frames, limits);
}

void SetCommonOptions(zmq::socket_t& s, const ZmqOptions& o) {
  s.set(zmq::sockopt::maxmsgsize, o.max_frame_bytes);
  s.set(zmq::sockopt::sndhwm, o.send_hwm);
  s.set(zmq::sockopt::rcvhwm, o.recv_hwm);
}

}  // namespace huddle::transport::zmq_internal
