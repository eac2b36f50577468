#include "transport/zmq_transport.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <zmq.hpp>

namespace huddle::transport {
namespace {

// Frees a zero-copy frame: drops the payload owner's reference.
void ReleaseOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

zmq::message_t ZeroCopyFrame(const wire::TensorPayload& p) {
  if (p.bytes.empty()) return zmq::message_t();
  auto* hint = new std::shared_ptr<const void>(p.owner);
  return zmq::message_t(const_cast<std::byte*>(p.bytes.data()), p.bytes.size(), &ReleaseOwner,
                        hint);
}

// Sends header + payload frames, after `prefix` frames (the routing id on the ROUTER).
// Returns bytes sent, Unavailable if the queue is full, NotFound if the peer is unknown.
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
      const bool last = i + 1 == msg.tensors.size();
      zmq::message_t frame = ZeroCopyFrame(msg.tensors[i]);
      bytes += frame.size();
      socket.send(frame, last ? zmq::send_flags::dontwait
                              : zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return absl::NotFoundError("peer is not connected");
    return absl::UnavailableError(absl::StrCat("zmq send: ", e.what()));
  }
  return bytes;
}

// Receives one multipart message. `skip` leading frames are returned in *prefix (routing id).
// Keeps at most max_frames frames; the rest are drained and the message marked malformed.
struct Received {
  std::string prefix;
  StatusOr<wire::Message> message = absl::UnknownError("unset");
  size_t bytes = 0;
};

Received RecvFrames(zmq::socket_t& socket, bool has_prefix, const wire::CodecLimits& limits) {
  Received out;
  std::vector<wire::Frame> frames;
  bool first = true;
  bool too_many = false;
  while (true) {
    auto msg = std::make_shared<zmq::message_t>();
    auto got = socket.recv(*msg, zmq::recv_flags::none);
    (void)got;  // a poll said readable; parts of a multipart message arrive together
    out.bytes += msg->size();
    const bool more = msg->more();
    if (first && has_prefix) {
      out.prefix.assign(static_cast<const char*>(msg->data()), msg->size());
    } else if (frames.size() <= limits.max_tensors) {
      auto bytes =
          std::span<const std::byte>(static_cast<const std::byte*>(msg->data()), msg->size());
      frames.push_back(wire::Frame{msg, bytes});
    } else {
      too_many = true;
    }
    first = false;
    if (!more) break;
  }
  if (too_many) {
    out.message = absl::InvalidArgumentError(
        absl::StrCat("malformed message: more than ", limits.max_tensors + 1, " frames"));
  } else {
    out.message = wire::Decode(frames, limits);
  }
  return out;
}

void SetCommonOptions(zmq::socket_t& s, const ZmqOptions& o) {
  s.set(zmq::sockopt::maxmsgsize, o.max_frame_bytes);
  s.set(zmq::sockopt::sndhwm, o.send_hwm);
  s.set(zmq::sockopt::rcvhwm, o.recv_hwm);
}

class ZmqServer final : public ServerTransport {
 public:
  explicit ZmqServer(const ZmqOptions& options) : options_(options), context_(options.io_threads) {}

  Status Bind(const std::string& endpoint) {
    try {
      socket_ = zmq::socket_t(context_, zmq::socket_type::router);
      SetCommonOptions(socket_, options_);
      socket_.set(zmq::sockopt::router_mandatory, 1);
      socket_.set(zmq::sockopt::linger, 2000);
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinator socket options for '", endpoint, "': ", e.what()));
    }
    try {
      socket_.bind(endpoint);
    } catch (const zmq::error_t& e) {
      const std::string text =
          absl::StrCat("cannot bind coordinator to '", endpoint, "': ", e.what());
      if (e.num() == EINVAL || e.num() == EPROTONOSUPPORT || e.num() == ENOCOMPATPROTO) {
        return absl::InvalidArgumentError(text);
      }
      return absl::UnavailableError(text);
    }
    return absl::OkStatus();
  }

  Status Send(const PeerId& peer, const wire::Message& msg) override {
    HUDDLE_ASSIGN_OR_RETURN(size_t n, SendFrames(socket_, &peer, msg));
    bytes_out_ += n;
    return absl::OkStatus();
  }

  StatusOr<std::optional<Inbound>> Receive(int64_t timeout_ms) override {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
      if (!(item.revents & ZMQ_POLLIN)) return std::optional<Inbound>();
      Received r = RecvFrames(socket_, /*has_prefix=*/true, options_.codec);
      bytes_in_ += r.bytes;
      Inbound in;
      in.peer = std::move(r.prefix);
      in.message = std::move(r.message);
      in.wire_bytes = r.bytes;
      return std::optional<Inbound>(std::move(in));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return std::optional<Inbound>();
      return absl::InternalError(absl::StrCat("zmq receive: ", e.what()));
    }
  }

  uint64_t bytes_in() const override { return bytes_in_; }
  uint64_t bytes_out() const override { return bytes_out_; }

 private:
  ZmqOptions options_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
};

class ZmqClient final : public ClientTransport {
 public:
  ZmqClient(std::string endpoint, const ZmqOptions& options)
      : endpoint_(std::move(endpoint)), options_(options), context_(options.io_threads) {}

  Status Connect() {
    try {
      socket_ = zmq::socket_t(context_, zmq::socket_type::dealer);
      SetCommonOptions(socket_, options_);
      socket_.set(zmq::sockopt::immediate, 1);
      socket_.set(zmq::sockopt::linger, 1000);
      socket_.set(zmq::sockopt::reconnect_ivl, options_.reconnect_ivl_ms);
      socket_.set(zmq::sockopt::reconnect_ivl_max, options_.reconnect_ivl_max_ms);
      socket_.connect(endpoint_);
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot connect to coordinator '", endpoint_, "': ", e.what()));
    }
    return absl::OkStatus();
  }

  Status Send(const wire::Message& msg) override {
    return SendFrames(socket_, nullptr, msg).status();
  }

  StatusOr<std::optional<StatusOr<wire::Message>>> Receive(int64_t timeout_ms) override {
    using Result = std::optional<StatusOr<wire::Message>>;
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
      if (!(item.revents & ZMQ_POLLIN)) return Result();
      Received r = RecvFrames(socket_, /*has_prefix=*/false, options_.codec);
      return Result(std::move(r.message));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return Result();
      return absl::InternalError(absl::StrCat("zmq receive: ", e.what()));
    }
  }

  Status Reconnect() override {
    try {
      socket_.set(zmq::sockopt::linger, 0);
      socket_.close();
    } catch (const zmq::error_t& e) {
      spdlog::warn("closing the old connection: {}", e.what());
    }
    return Connect();
  }

 private:
  std::string endpoint_;
  ZmqOptions options_;
  zmq::context_t context_;
  zmq::socket_t socket_;
};

}  // namespace

StatusOr<std::unique_ptr<ServerTransport>> BindZmqServer(const std::string& endpoint,
                                                         const ZmqOptions& options) {
  auto server = std::make_unique<ZmqServer>(options);
  HUDDLE_RETURN_IF_ERROR(server->Bind(endpoint));
  return std::unique_ptr<ServerTransport>(std::move(server));
}

StatusOr<std::unique_ptr<ClientTransport>> ConnectZmqClient(const std::string& endpoint,
                                                            const ZmqOptions& options) {
  auto client = std::make_unique<ZmqClient>(endpoint, options);
  HUDDLE_RETURN_IF_ERROR(client->Connect());
  return std::unique_ptr<ClientTransport>(std::move(client));
}

std::string PeerName(const PeerId& peer) {
  bool printable = !peer.empty();
  for (unsigned char c : peer) printable &= (c >= 0x21 && c < 0x7f);
  if (printable) return peer;
  static const char* kHex = "0123456789abcdef";
  std::string out = "0x";
  for (unsigned char c : peer) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace huddle::transport
