#include "datacenter/ps_wire.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "transport/curve_keys.h"
#include "transport/zap_handler.h"

namespace huddle::datacenter {
namespace {

using std::chrono::milliseconds;
using SteadyTime = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x31535048;  // "HPS1" little-endian
constexpr size_t kHeaderBytes = 128;
constexpr int kReceiveTimeoutMs = 1000;

void Put64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t Get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

bool HasValues(MsgType t) {
  return t == MsgType::kParams || t == MsgType::kPush || t == MsgType::kShardState ||
         t == MsgType::kRestore;
}

int64_t MaxMessageBytes(int64_t max_values) {
  return static_cast<int64_t>(kHeaderBytes) + 4 * max_values + 4096;
}

}  // namespace

std::string EncodeMsg(const Msg& m, uint64_t job_tag) {
  std::string out;
  const size_t payload = HasValues(m.type)           ? m.values.size() * sizeof(float)
                         : m.type == MsgType::kError ? m.text.size()
                                                     : 0;
  out.reserve(kHeaderBytes + payload);
  Put64(&out, uint64_t{kMagic} | (uint64_t{static_cast<uint16_t>(m.type)} << 32) |
                  (uint64_t{m.flags} << 48));
  Put64(&out, job_tag);
  for (int64_t v : {m.worker, m.seq, m.epoch, m.batch, m.version, m.need, m.rows, m.staleness,
                    m.correct, m.dropped}) {
    Put64(&out, static_cast<uint64_t>(v));
  }
  uint64_t loss_bits = 0;
  std::memcpy(&loss_bits, &m.loss_sum, sizeof loss_bits);
  Put64(&out, loss_bits);
  Put64(&out, payload);
  out.resize(kHeaderBytes, '\0');
  if (HasValues(m.type)) {
    for (float f : m.values) {
      uint32_t bits = 0;
      std::memcpy(&bits, &f, sizeof bits);
      for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
    }
  } else if (m.type == MsgType::kError) {
    out += m.text;
  }
  return out;
}

StatusOr<Msg> DecodeMsg(std::string_view frame, uint64_t job_tag, int64_t max_values) {
  if (frame.size() < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a message of ", frame.size(), " bytes (the header alone has ", kHeaderBytes, ")"));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(frame.data());
  const uint64_t first = Get64(p);
  if ((first & 0xffffffffu) != kMagic) {
    return absl::InvalidArgumentError("a message without the parameter-server magic");
  }
  Msg m;
  const auto type = static_cast<uint16_t>((first >> 32) & 0xffff);
  if (type < 1 || type > static_cast<uint16_t>(MsgType::kError)) {
    return absl::InvalidArgumentError(absl::StrCat("a message of unknown type ", type));
  }
  m.type = static_cast<MsgType>(type);
  m.flags = static_cast<uint16_t>(first >> 48);
  if (Get64(p + 8) != job_tag) {
    return absl::InvalidArgumentError(
        "a message of another job (or of a rank with a different model, data size or "
        "parameter_server section)");
  }
  int64_t* fields[] = {&m.worker, &m.seq,  &m.epoch,     &m.batch,   &m.version,
                       &m.need,   &m.rows, &m.staleness, &m.correct, &m.dropped};
  size_t at = 16;
  for (int64_t* f : fields) {
    *f = static_cast<int64_t>(Get64(p + at));
    at += 8;
  }
  const uint64_t loss_bits = Get64(p + at);
  std::memcpy(&m.loss_sum, &loss_bits, sizeof loss_bits);
  const uint64_t payload = Get64(p + at + 8);
  if (payload != frame.size() - kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a message announcing ", payload, " payload bytes carries ", frame.size() - kHeaderBytes));
  }
  if (HasValues(m.type)) {
    if (payload % 4 != 0 || payload / 4 > static_cast<uint64_t>(max_values)) {
      return absl::InvalidArgumentError(absl::StrCat("a payload of ", payload, " bytes (at most ",
                                                     max_values, " float32 values)"));
    }
    m.values.resize(payload / 4);
    std::memcpy(m.values.data(), p + kHeaderBytes, payload);  // little-endian hosts only
  } else if (m.type == MsgType::kError) {
    m.text.assign(frame.substr(kHeaderBytes, std::min<size_t>(payload, 4096)));
  } else if (payload != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a message of type ", type, " with a payload"));
  }
  return m;
}

std::optional<ForeignHeader> PeekForeignHeader(std::string_view frame, uint64_t job_tag) {
  if (frame.size() < kHeaderBytes) return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(frame.data());
  const uint64_t first = Get64(p);
  const auto type = static_cast<uint16_t>((first >> 32) & 0xffff);
  if ((first & 0xffffffffu) != kMagic || type < 1 ||
      type > static_cast<uint16_t>(MsgType::kError) || Get64(p + 8) == job_tag) {
    return std::nullopt;
  }
  return ForeignHeader{Get64(p + 8), static_cast<int64_t>(Get64(p + 24))};
}

namespace {

class ZmqPsRouter final : public PsRouter {
 public:
  ZmqPsRouter(std::optional<transport::KvAuth> auth, uint64_t job_tag, int64_t max_values,
              std::string job_description)
      : auth_(std::move(auth)),
        job_tag_(job_tag),
        max_values_(max_values),
        job_description_(std::move(job_description)),
        context_(1) {}

  Status Bind(const std::string& host) {
    try {
      if (auth_) {
        HUDDLE_ASSIGN_OR_RETURN(job_key_, transport::DecodeZ85Key(auth_->public_z85, "job key"));
      }
      socket_ = zmq::socket_t(context_, zmq::socket_type::router);
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::maxmsgsize, MaxMessageBytes(max_values_));
      socket_.set(zmq::sockopt::rcvtimeo, kReceiveTimeoutMs);
      socket_.set(zmq::sockopt::sndtimeo, kReceiveTimeoutMs);
      if (auth_) {
        transport::OpenJobKeyGate(context_, &zap_, socket_, auth_->secret_z85,
                                  "huddle-parameter-server", kReceiveTimeoutMs);
      }
      socket_.bind(fmt::format("tcp://{}:0", host));
      url_ = socket_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(
          fmt::format("cannot serve parameters on {}: {}", host, e.what()));
    }
    return absl::OkStatus();
  }

  std::string url() const override { return url_; }

  StatusOr<Msg> Receive(milliseconds wait, std::string* peer) override {
    const auto deadline = SteadyTime::now() + wait;
    try {
      for (;;) {
        zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                                   {zap_.handle(), 0, ZMQ_POLLIN, 0}};
        const int count = zap_.handle() != nullptr ? 2 : 1;
        auto left = std::chrono::duration_cast<milliseconds>(deadline - SteadyTime::now());
        zmq::poll(items, static_cast<size_t>(count), std::max(left, milliseconds(0)));
        if (count == 2 && (items[1].revents & ZMQ_POLLIN)) {
          transport::AnswerJobKeyZap(zap_, job_key_);
        }
        if (items[0].revents & ZMQ_POLLIN) {
          std::vector<zmq::message_t> frames;
          for (;;) {
            zmq::message_t part;
            if (!socket_.recv(part, zmq::recv_flags::none).has_value()) break;
            const bool more = part.more();
            if (frames.size() < 3) frames.push_back(std::move(part));
            if (!more) break;
          }
          if (frames.size() != 2) {
            return absl::InvalidArgumentError(
                absl::StrCat("a message of ", frames.size(), " frames (1 expected)"));
          }
          *peer = frames[0].to_string();
          if (auto foreign = PeekForeignHeader(frames[1].to_string_view(), job_tag_)) {
            // A rank configured differently: tell it, under its own tag, what this job is.
            Msg error;
            error.type = MsgType::kError;
            error.seq = foreign->seq;
            error.text = absl::StrCat(
                "this rank is configured differently from the parameter server's job (",
                job_description_, "): every rank must run the same job file, data and world size");
            const std::string bytes = EncodeMsg(error, foreign->job_tag);
            // Best effort (a peer gone or slow loses it, as any reply).
            if (socket_.send(zmq::buffer(*peer),
                             zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
              (void)socket_.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
            }
          }
          return DecodeMsg(frames[1].to_string_view(), job_tag_, max_values_);
        }
        if (SteadyTime::now() >= deadline) return absl::NotFoundError("nothing arrived");
      }
    } catch (const zmq::error_t& e) {
      // A signal (a stop): the caller's loop looks at its stop flag.
      if (e.num() == EINTR) return absl::NotFoundError("interrupted by a signal");
      return absl::UnavailableError(fmt::format("parameter server {}: {}", url_, e.what()));
    }
  }

  Status Send(const std::string& peer, const Msg& m) override {
    const std::string frame = EncodeMsg(m, job_tag_);
    try {
      // A peer that is gone: ROUTER drops the message (no error), which is what we want.
      if (!socket_.send(zmq::buffer(peer), zmq::send_flags::sndmore).has_value() ||
          !socket_.send(zmq::buffer(frame), zmq::send_flags::none).has_value()) {
        return absl::UnavailableError("a reply could not be queued within 1 s");
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(fmt::format("parameter server {}: {}", url_, e.what()));
    }
    return absl::OkStatus();
  }

 private:
  std::optional<transport::KvAuth> auth_;
  uint64_t job_tag_;
  int64_t max_values_;
  std::string job_description_;
  transport::CurveKey job_key_{};
  std::string url_;
  zmq::context_t context_;
  zmq::socket_t zap_;  // before socket_: outlives it
  zmq::socket_t socket_;
};

class ZmqPsDealer final : public PsDealer {
 public:
  ZmqPsDealer(std::string url, uint64_t job_tag, int64_t max_values)
      : url_(std::move(url)), job_tag_(job_tag), max_values_(max_values), context_(1) {}

  Status Connect(const std::optional<transport::KvAuth>& auth) {
    try {
      socket_ = zmq::socket_t(context_, zmq::socket_type::dealer);
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::maxmsgsize, MaxMessageBytes(max_values_));
      socket_.set(zmq::sockopt::rcvtimeo, kReceiveTimeoutMs);
      if (auth) {
        socket_.set(zmq::sockopt::curve_serverkey, auth->public_z85);
        socket_.set(zmq::sockopt::curve_publickey, auth->public_z85);
        socket_.set(zmq::sockopt::curve_secretkey, auth->secret_z85);
      }
      socket_.connect(url_);
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(
          fmt::format("cannot connect to the parameter server {}: {}", url_, e.what()));
    }
    return absl::OkStatus();
  }

  Status Send(Msg m) override {
    m.seq = ++seq_;
    const std::string frame = EncodeMsg(m, job_tag_);
    try {
      if (!socket_.send(zmq::buffer(frame), zmq::send_flags::dontwait).has_value()) {
        return absl::UnavailableError(
            fmt::format("the parameter server {} takes no more requests (unreachable?)", url_));
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(fmt::format("parameter server {}: {}", url_, e.what()));
    }
    return absl::OkStatus();
  }

  StatusOr<Msg> Receive(milliseconds timeout) override {
    const auto deadline = SteadyTime::now() + timeout;
    try {
      for (;;) {
        auto left = std::chrono::duration_cast<milliseconds>(deadline - SteadyTime::now());
        if (left <= milliseconds(0)) break;
        zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, left) == 0) break;
        zmq::message_t frame;
        if (!socket_.recv(frame, zmq::recv_flags::none).has_value()) continue;
        while (frame.more()) {  // not ours: drain it
          zmq::message_t rest;
          if (!socket_.recv(rest, zmq::recv_flags::none).has_value() || !rest.more()) break;
        }
        auto m = DecodeMsg(frame.to_string_view(), job_tag_, max_values_);
        if (!m.ok()) {
          return Status(m.status().code(), fmt::format("from the parameter server {}: {}", url_,
                                                       m.status().message()));
        }
        if (m->seq != seq_) continue;  // the reply to a request given up on
        if (m->type == MsgType::kError) {
          return absl::FailedPreconditionError(
              fmt::format("the parameter server {} refused: {}", url_, m->text));
        }
        return m;
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return absl::CancelledError("interrupted by a signal");
      return absl::UnavailableError(fmt::format("parameter server {}: {}", url_, e.what()));
    }
    return absl::DeadlineExceededError(
        fmt::format("no answer from the parameter server {} within {} ms (did it stop?)", url_,
                    timeout.count()));
  }

 private:
  std::string url_;
  uint64_t job_tag_;
  int64_t max_values_;
  int64_t seq_ = 0;
  zmq::context_t context_;
  zmq::socket_t socket_;
};

}  // namespace

StatusOr<std::unique_ptr<PsRouter>> PsRouter::Bind(const std::string& host,
                                                   const std::optional<transport::KvAuth>& auth,
                                                   uint64_t job_tag, int64_t max_values,
                                                   std::string job_description) {
  auto router =
      std::make_unique<ZmqPsRouter>(auth, job_tag, max_values, std::move(job_description));
  HUDDLE_RETURN_IF_ERROR(router->Bind(host));
  return std::unique_ptr<PsRouter>(std::move(router));
}

StatusOr<std::unique_ptr<PsDealer>> PsDealer::Connect(const std::string& url,
                                                      const std::optional<transport::KvAuth>& auth,
                                                      uint64_t job_tag, int64_t max_values) {
  auto dealer = std::make_unique<ZmqPsDealer>(url, job_tag, max_values);
  HUDDLE_RETURN_IF_ERROR(dealer->Connect(auth));
  return std::unique_ptr<PsDealer>(std::move(dealer));
}

}  // namespace huddle::datacenter
