// A hostile CurveZMQ client written against the wire, not through libzmq: ZMTP 3.0 greeting, the
// CurveZMQ handshake (RFC 26: HELLO, WELCOME, INITIATE, READY) with a real client key pair, then
// whatever MESSAGE frames the caller asks for, including frames with MORE set forever. libzmq
// cannot be made to do that (it flushes a multipart message to the wire only once its last frame
// is queued), and that is exactly what a hostile peer does not follow.
//
// Blocking I/O: a write blocks while the coordinator does not read (TCP backpressure, up to 5 s),
// and fails once the coordinator has cut the connection. For tests and bench/hostile_peer.cc only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/curve_keys.h"

namespace huddle::transport::testing {

class RawCurvePeer {
 public:
  RawCurvePeer() = default;
  ~RawCurvePeer() { Close(); }
  RawCurvePeer(const RawCurvePeer&) = delete;
  RawCurvePeer& operator=(const RawCurvePeer&) = delete;

  // Connects to 127.0.0.1:`port` and completes the handshake as `client` (public and secret
  // z85) against the server's public key. PermissionDenied if the server refuses the key.
  Status Connect(int port, const std::string& server_public_z85, const CurveKeyPair& client) {
    if (sodium_init() < 0) return absl::InternalError("libsodium init failed");
    HUDDLE_ASSIGN_OR_RETURN(CurveKey server, DecodeZ85Key(server_public_z85, "server key"));
    HUDDLE_ASSIGN_OR_RETURN(CurveKey pub, DecodeZ85Key(client.public_z85, "client key"));
    HUDDLE_ASSIGN_OR_RETURN(CurveKey sec, DecodeZ85Key(client.secret_z85, "client secret"));
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return absl::UnavailableError(absl::StrCat("connect to port ", port, ": ", strerror(errno)));
    }
    // No call waits forever: a server that stops reading for 5 s counts as gone.
    const timeval timeout{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    // Greeting: signature, version 3.0, mechanism CURVE, as-server 0.
    uint8_t greeting[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0};
    std::memcpy(greeting + 12, "CURVE", 5);
    HUDDLE_RETURN_IF_ERROR(Write(greeting, sizeof(greeting)));
    uint8_t server_greeting[64];
    HUDDLE_RETURN_IF_ERROR(Read(server_greeting, sizeof(server_greeting)));

    uint8_t cn_public[32], cn_secret[32];
    crypto_box_keypair(cn_public, cn_secret);
    // HELLO: C', and Box[64 zeros](C' -> S).
    std::vector<uint8_t> hello(200, 0);
    std::memcpy(hello.data(), "\x05HELLO\x01\x00", 8);
    std::memcpy(hello.data() + 80, cn_public, 32);
    uint8_t nonce[24];
    std::memcpy(nonce, "CurveZMQHELLO---", 16);
    PutNonce(nonce + 16, hello.data() + 112);
    const uint8_t zeros[64] = {};
    if (crypto_box_easy(hello.data() + 120, zeros, 64, nonce, server.data(), cn_secret) != 0) {
      return absl::InternalError("HELLO box");
    }
    HUDDLE_RETURN_IF_ERROR(WriteFrame(hello, /*command=*/true));

    // WELCOME: Box[S' + cookie](S -> C').
    HUDDLE_ASSIGN_OR_RETURN(std::vector<uint8_t> welcome, ReadFrame());
    if (welcome.size() != 168 || std::memcmp(welcome.data(), "\x07WELCOME", 8) != 0) {
      return IsError(welcome) ? absl::PermissionDeniedError("refused at WELCOME")
                              : absl::InternalError("expected WELCOME");
    }
    std::memcpy(nonce, "WELCOME-", 8);
    std::memcpy(nonce + 8, welcome.data() + 8, 16);
    uint8_t welcome_plain[128];
    if (crypto_box_open_easy(welcome_plain, welcome.data() + 24, 144, nonce, server.data(),
                             cn_secret) != 0) {
      return absl::InternalError("WELCOME did not decrypt");
    }
    const uint8_t* cn_server = welcome_plain;
    const uint8_t* cookie = welcome_plain + 32;  // 96 bytes
    if (crypto_box_beforenm(precom_, cn_server, cn_secret) != 0) {
      return absl::InternalError("precomputation");
    }

    // INITIATE: cookie, Box[C + vouch + metadata](C' -> S'), vouch = Box[C' + S](C -> S').
    uint8_t vouch_nonce[24] = {};
    std::memcpy(vouch_nonce, "VOUCH---", 8);
    randombytes_buf(vouch_nonce + 8, 16);
    uint8_t vouch_plain[64];
    std::memcpy(vouch_plain, cn_public, 32);
    std::memcpy(vouch_plain + 32, server.data(), 32);
    uint8_t vouch[80];
    if (crypto_box_easy(vouch, vouch_plain, 64, vouch_nonce, cn_server, sec.data()) != 0) {
      return absl::InternalError("vouch box");
    }
    const std::string metadata = std::string("\x0bSocket-Type\x00\x00\x00\x06", 16) + "DEALER";
    std::vector<uint8_t> plain(32 + 16 + 80);
    std::memcpy(plain.data(), pub.data(), 32);
    std::memcpy(plain.data() + 32, vouch_nonce + 8, 16);
    std::memcpy(plain.data() + 48, vouch, 80);
    plain.insert(plain.end(), metadata.begin(), metadata.end());
    std::vector<uint8_t> initiate(113 + 16 + plain.size());
    std::memcpy(initiate.data(), "\x08INITIATE", 9);
    std::memcpy(initiate.data() + 9, cookie, 96);
    std::memcpy(nonce, "CurveZMQINITIATE", 16);
    PutNonce(nonce + 16, initiate.data() + 105);
    if (crypto_box_easy(initiate.data() + 113, plain.data(), plain.size(), nonce, cn_server,
                        cn_secret) != 0) {
      return absl::InternalError("INITIATE box");
    }
    HUDDLE_RETURN_IF_ERROR(WriteFrame(initiate, /*command=*/true));

    // READY (or ERROR when the key is not enrolled).
    HUDDLE_ASSIGN_OR_RETURN(std::vector<uint8_t> ready, ReadFrame());
    if (IsError(ready)) return absl::PermissionDeniedError("the server refused this key");
    if (ready.size() < 6 || std::memcmp(ready.data(), "\x05READY", 6) != 0) {
      return absl::InternalError("expected READY");
    }
    return absl::OkStatus();
  }

  // Sends one frame (`more`: another frame of the same message follows). An error once the
  // connection is gone.
  Status SendFrame(const void* data, size_t size, bool more) {
    plain_.resize(1 + size);
    plain_[0] = more ? 1 : 0;
    std::memcpy(plain_.data() + 1, data, size);
    box_.resize(16 + 16 + plain_.size());
    std::memcpy(box_.data(), "\x07MESSAGE", 8);
    uint8_t nonce[24];
    std::memcpy(nonce, "CurveZMQMESSAGEC", 16);
    PutNonce(nonce + 16, box_.data() + 8);
    if (crypto_box_easy_afternm(box_.data() + 16, plain_.data(), plain_.size(), nonce, precom_) !=
        0) {
      return absl::InternalError("MESSAGE box");
    }
    return WriteFrame(box_, /*command=*/false);
  }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  uint64_t bytes_written() const { return written_; }
  // Whether the server still holds the connection open (no end of stream or reset seen), without
  // sending anything; the server never sends unasked, so any readable byte is not expected.
  bool Alive() const {
    if (fd_ < 0) return false;
    char byte;
    const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

 private:
  static bool IsError(const std::vector<uint8_t>& cmd) {
    return cmd.size() >= 6 && std::memcmp(cmd.data(),
                                          "\x05"
                                          "ERROR",
                                          6) == 0;
  }
  // The next short nonce, big-endian, into the full nonce's tail and the command's field.
  void PutNonce(uint8_t* nonce_tail, uint8_t* field) {
    ++nonce_;
    for (int i = 0; i < 8; ++i) nonce_tail[i] = static_cast<uint8_t>(nonce_ >> (56 - 8 * i));
    std::memcpy(field, nonce_tail, 8);
  }
  Status Write(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (size > 0) {
      const ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL);
      if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
      p += n;
      size -= static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }
  Status Read(void* data, size_t size) {
    auto* p = static_cast<uint8_t*>(data);
    while (size > 0) {
      const ssize_t n = ::recv(fd_, p, size, 0);
      if (n <= 0) return absl::UnavailableError("connection closed by the server");
      p += n;
      size -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  Status WriteFrame(const std::vector<uint8_t>& body, bool command) {
    uint8_t header[9];
    size_t header_size = 2;
    header[0] = command ? 0x04 : 0x00;
    if (body.size() > 255) {
      header[0] |= 0x02;
      for (int i = 0; i < 8; ++i) header[1 + i] = static_cast<uint8_t>(body.size() >> (56 - 8 * i));
      header_size = 9;
    } else {
      header[1] = static_cast<uint8_t>(body.size());
    }
    HUDDLE_RETURN_IF_ERROR(Write(header, header_size));
    return Write(body.data(), body.size());
  }
  StatusOr<std::vector<uint8_t>> ReadFrame() {
    uint8_t flags, size8[8];
    HUDDLE_RETURN_IF_ERROR(Read(&flags, 1));
    uint64_t size = 0;
    if (flags & 0x02) {
      HUDDLE_RETURN_IF_ERROR(Read(size8, 8));
      for (int i = 0; i < 8; ++i) size = (size << 8) | size8[i];
    } else {
      HUDDLE_RETURN_IF_ERROR(Read(size8, 1));
      size = size8[0];
    }
    if (size > (1 << 20)) return absl::InternalError("oversized handshake frame");
    std::vector<uint8_t> body(size);
    HUDDLE_RETURN_IF_ERROR(Read(body.data(), body.size()));
    return body;
  }

  int fd_ = -1;
  uint64_t nonce_ = 0;
  uint64_t written_ = 0;
  uint8_t precom_[crypto_box_BEFORENMBYTES] = {};
  std::vector<uint8_t> plain_, box_;
};

}  // namespace huddle::transport::testing
