#include "transport/kv_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>
#include <zmq.hpp>

namespace huddle::transport {
namespace {

using std::chrono::milliseconds;

std::string FreshDir(const std::string& name) {
  std::string dir =
      (std::filesystem::temp_directory_path() / fmt::format("huddle-kv-{}-{}", name, ::getpid()))
          .string();
  std::filesystem::remove_all(dir);
  return dir;
}

// The same behaviour from both kinds of store.
void ExpectStoreBehaves(KvStore& store) {
  ASSERT_TRUE(store.Set("a/b", "one").ok());
  auto got = store.Get("a/b", milliseconds(100));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "one");
  ASSERT_TRUE(store.Set("a/b", std::string("t\0wo", 4)).ok());
  EXPECT_EQ(*store.Get("a/b", milliseconds(100)), std::string("t\0wo", 4));
  ASSERT_TRUE(store.Set("empty", "").ok());
  EXPECT_EQ(*store.Get("empty", milliseconds(100)), "");

  auto start = std::chrono::steady_clock::now();
  auto missing = store.Get("never/set", milliseconds(150));
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("never/set"), std::string::npos);
  EXPECT_GE(waited, milliseconds(150));
  EXPECT_LT(waited, milliseconds(2000));

  // A key set later by another thread is picked up by a waiting Get.
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(store.Set("late", "here").ok());
  });
  auto late_value = store.Get("late", milliseconds(5000));
  late.join();
  ASSERT_TRUE(late_value.ok()) << late_value.status();
  EXPECT_EQ(*late_value, "here");

  EXPECT_TRUE(absl::IsInvalidArgument(store.Set("", "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(store.Set("has space", "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(store.Set(std::string(kMaxKeyBytes + 1, 'k'), "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(store.Set("big", std::string(kMaxValueBytes + 1, 'v'))));
}

TEST(FileKvStore, SetsGetsWaitsAndRefusesBadKeys) {
  std::string dir = FreshDir("file");
  auto store = OpenKvStore("file://" + dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ExpectStoreBehaves(**store);
  // Keys that are not plain file names are escaped, never paths.
  ASSERT_TRUE((*store)->Set("../escape", "x").ok());
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir).parent_path() / "escape"));
  // A second handle on the same directory (another rank) sees the keys.
  auto other = OpenKvStore("file://" + dir);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*(*other)->Get("a/b", milliseconds(100)), std::string("t\0wo", 4));
  std::filesystem::remove_all(dir);
}

TEST(ZmqKvStore, SetsGetsWaitsAndRefusesBadKeys) {
  auto server = KvServer::Start("tcp://127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->url().starts_with("tcp://127.0.0.1:"));
  auto store = OpenKvStore((*server)->url());
  ASSERT_TRUE(store.ok()) << store.status();
  ExpectStoreBehaves(**store);
  auto other = OpenKvStore((*server)->url());
  EXPECT_EQ(*(*other)->Get("a/b", milliseconds(100)), std::string("t\0wo", 4));
}

TEST(ZmqKvStore, WildcardBindIsReachableOnLoopback) {
  auto server = KvServer::Start("tcp://0.0.0.0:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->url().starts_with("tcp://127.0.0.1:")) << (*server)->url();
  auto store = OpenKvStore((*server)->url());
  ASSERT_TRUE((*store)->Set("k", "v").ok());
}

TEST(ZmqKvStore, UnreachableServerIsAnErrorWithinTheTimeout) {
  // A port nobody serves (bound then released by a server that is gone).
  std::string url;
  {
    auto server = KvServer::Start("tcp://127.0.0.1:0");
    ASSERT_TRUE(server.ok());
    url = (*server)->url();
  }
  auto store = OpenKvStore(url, milliseconds(200));
  ASSERT_TRUE(store.ok());
  auto start = std::chrono::steady_clock::now();
  Status s = (*store)->Set("k", "v");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find(url), std::string::npos) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
  auto got = (*store)->Get("k", milliseconds(300));
  EXPECT_FALSE(got.ok());
}

TEST(ZmqKvStore, ServerSurvivesMalformedRequestsAndEnforcesItsLimits) {
  auto server =
      KvServer::Start("tcp://127.0.0.1:0", KvServerLimits{.max_keys = 2, .max_total_bytes = 100});
  ASSERT_TRUE(server.ok());
  {
    zmq::context_t ctx(1);
    zmq::socket_t raw(ctx, zmq::socket_type::dealer);
    raw.set(zmq::sockopt::linger, 0);
    raw.connect((*server)->url());
    raw.send(zmq::str_buffer("garbage"), zmq::send_flags::none);
    raw.send(zmq::str_buffer("12345678"), zmq::send_flags::sndmore);
    raw.send(zmq::str_buffer("X"), zmq::send_flags::sndmore);
    raw.send(zmq::str_buffer("key"), zmq::send_flags::none);
    zmq::message_t reply;
    zmq::pollitem_t item{raw.handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, milliseconds(2000)), 1);
    ASSERT_TRUE(raw.recv(reply).has_value());  // seq
    ASSERT_TRUE(raw.recv(reply).has_value());
    EXPECT_EQ(reply.to_string(), "E");
  }
  auto store = OpenKvStore((*server)->url());
  ASSERT_TRUE((*store)->Set("k1", "v").ok());
  ASSERT_TRUE((*store)->Set("k2", "v").ok());
  Status third = (*store)->Set("k3", "v");
  EXPECT_TRUE(absl::IsFailedPrecondition(third)) << third;
  EXPECT_NE(third.message().find("2 keys"), std::string::npos) << third;
  EXPECT_TRUE((*store)->Set("k1", "overwriting is fine").ok());
  Status big = (*store)->Set("k2", std::string(200, 'v'));
  EXPECT_TRUE(absl::IsFailedPrecondition(big)) << big;
  EXPECT_EQ(*(*store)->Get("k1", milliseconds(100)), "overwriting is fine");
}

// A raw DEALER sends `frames` parts (the server sees one more, the routing id), each "x".
void SendMessageOfFrames(zmq::socket_t& raw, size_t frames) {
  if (frames == 0) {
    raw.send(zmq::message_t(), zmq::send_flags::none);  // one empty part: the least ZMQ sends
    return;
  }
  for (size_t i = 0; i < frames; ++i) {
    raw.send(zmq::str_buffer("x"),
             i + 1 < frames ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

// Issue 18: a message of 7 frames (the server kept 6 and then waited forever for more parts) used
// to wedge the server thread, and the destructor joined it. Every shape of message is answered
// or dropped; a normal client is served afterwards and the server stops at once.
TEST(ZmqKvStore, MessagesOfAnyShapeNeverWedgeTheServer) {
  auto server = KvServer::Start("tcp://127.0.0.1:0");
  ASSERT_TRUE(server.ok());
  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect((*server)->url());
  for (size_t frames : {7, 0, 1, 2, 5, 6, 8, 64}) SendMessageOfFrames(raw, frames);
  // A valid request shape with a 7th part, and an op that is not S or G.
  raw.send(zmq::str_buffer("12345678"), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("S"), zmq::send_flags::sndmore);
  for (int i = 0; i < 4; ++i) raw.send(zmq::str_buffer("k"), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("k"), zmq::send_flags::none);

  auto store = OpenKvStore((*server)->url(), milliseconds(2000));
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Set("after", "bad messages").ok());
  auto got = (*store)->Get("after", milliseconds(500));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "bad messages");
  EXPECT_FALSE((*store)->Get("k", milliseconds(50)).ok()) << "a 7-part set was stored";

  const auto start = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
}

KvAuth MustGenerate() {
  auto auth = GenerateKvAuth();
  EXPECT_TRUE(auth.ok()) << auth.status();
  return *auth;
}

// Issue 18: the rendezvous was open; a stranger could register as a rank. With the job's key
// pair only its holders are served: a stranger without CURVE, or with a key pair of its own,
// gets no answer, and the real rank's registration stands.
TEST(ZmqKvStore, OnlyHoldersOfTheJobKeyAreServed) {
  const KvAuth job = MustGenerate();
  auto server = KvServer::Start("tcp://127.0.0.1:0", {}, job);
  ASSERT_TRUE(server.ok()) << server.status();
  auto rank1 = OpenKvStore((*server)->url(), milliseconds(2000), job);
  ASSERT_TRUE(rank1.ok());
  ASSERT_TRUE((*rank1)->Set("job/rank/1", "real").ok());

  auto plain = OpenKvStore((*server)->url(), milliseconds(300));
  Status s = (*plain)->Set("job/rank/1", "poisoned");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  auto other_key = OpenKvStore((*server)->url(), milliseconds(300), MustGenerate());
  s = (*other_key)->Set("job/rank/1", "poisoned");
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_FALSE((*other_key)->Get("job/rank/1", milliseconds(100)).ok());
  {
    // A stranger who learned the job's public key, with a key pair of its own: the handshake
    // reaches the server's ZAP check, which refuses it; no request is answered.
    const KvAuth own = MustGenerate();
    zmq::context_t ctx(1);
    zmq::socket_t raw(ctx, zmq::socket_type::dealer);
    raw.set(zmq::sockopt::linger, 0);
    raw.set(zmq::sockopt::curve_serverkey, job.public_z85);
    raw.set(zmq::sockopt::curve_publickey, own.public_z85);
    raw.set(zmq::sockopt::curve_secretkey, own.secret_z85);
    raw.connect((*server)->url());
    raw.send(zmq::str_buffer("12345678"), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    raw.send(zmq::str_buffer("S"), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    raw.send(zmq::str_buffer("job/rank/1"), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    raw.send(zmq::str_buffer("poisoned"), zmq::send_flags::dontwait);
    zmq::pollitem_t item{raw.handle(), 0, ZMQ_POLLIN, 0};
    EXPECT_EQ(zmq::poll(&item, 1, milliseconds(500)), 0) << "a stranger was answered";
  }
  EXPECT_GE((*server)->refused_handshakes(), 1u);

  auto rank0 = OpenKvStore((*server)->url(), milliseconds(2000), job);
  auto got = (*rank0)->Get("job/rank/1", milliseconds(500));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "real");
}

TEST(ZmqKvStore, AKeyFileIsReadAndAFileStoreRefusesAKey) {
  auto store = OpenKvStore("file:///tmp/huddle-kv-never", milliseconds(100), MustGenerate());
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
  auto missing = ReadKvAuthFile("/nonexistent/job.key");
  EXPECT_FALSE(missing.ok());
}

// Multi-host rank 0 serves on the address the user names, never on every interface.
TEST(KvServerEndpointFor, BindsTheNamedAddressAndRefusesWildcards) {
  EXPECT_EQ(*KvServerEndpointFor("tcp://10.0.0.1:29500"), "tcp://10.0.0.1:29500");
  EXPECT_EQ(*KvServerEndpointFor("tcp://127.0.0.1:5"), "tcp://127.0.0.1:5");
  for (const char* url : {"tcp://*:29500", "tcp://0.0.0.0:29500", "tcp://:29500", "file:///x",
                          "tcp://host", "tcp://h:p"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(KvServerEndpointFor(url).status())) << url;
  }
}

TEST(OpenKvStore, RefusesMalformedUrls) {
  for (const char* url : {"", "redis://x:1", "tcp://host", "tcp://:5", "tcp://h:port",
                          "file://relative/dir", "file://"}) {
    auto store = OpenKvStore(url);
    EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << url << ": " << store.status();
  }
}

}  // namespace
}  // namespace huddle::transport
