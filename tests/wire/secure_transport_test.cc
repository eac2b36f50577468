// CurveZMQ keys, the allow-lists (by role: clients', operators'), and the encrypted, authenticated
// ZeroMQ transport over 127.0.0.1: enrolled keys get in and carry their identity; unknown, revoked,
// wrong-role and wrong-server keys are refused with clear errors; a key in both lists is refused;
// plaintext and encrypted peers refuse each other; a flooding peer is rate limited. Every wait is a
// loop of short Receive calls bounded by a deadline.
#include <spdlog/sinks/ostream_sink.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/wire/wire_testing.h"
#include "tests/wire/zmq_peers.h"
#include "transport/curve_keys.h"
#include "transport/ports.h"
#include "transport/zmq_transport.h"

namespace huddle::transport {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using wire::testutil::IsError;

constexpr auto kDeadline = std::chrono::seconds(10);

class SecureTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "allow");
    server_keys_ = Generate("server", "coordinator", "server");
  }

  CurveKeyPair Generate(const std::string& role, const std::string& id, const std::string& name) {
    auto keys = GenerateKeyPair(role, id);
    EXPECT_TRUE(keys.ok()) << keys.status();
    EXPECT_TRUE(WriteKeyFiles(*keys, (dir_ / "keys").string(), name).ok());
    return *keys;
  }
  // A client key pair, its .pub copied into the allow-list when `enroll`.
  CurveKeyPair Client(const std::string& id, bool enroll) {
    CurveKeyPair k = Generate("client", id, id);
    if (enroll) fs::copy_file(dir_ / "keys" / (id + ".pub"), dir_ / "allow" / (id + ".pub"));
    return k;
  }

  ZmqOptions ServerOptions() {
    ZmqOptions o;
    o.curve_server = CurveServerOptions{server_keys_, ZapOptions{(dir_ / "allow").string(), 100}};
    return o;
  }
  ZmqOptions ClientOptions(const CurveKeyPair& client) {
    return testing::CurveClient(server_keys_, client);
  }

  void Bind(const ZmqOptions& options) {
    for (int attempt = 0; attempt < 5 && server_ == nullptr; ++attempt) {
      auto port = FreeLoopbackPort();
      ASSERT_TRUE(port.ok());
      endpoint_ = "tcp://127.0.0.1:" + std::to_string(*port);
      auto s = BindZmqServer(endpoint_, options);
      if (s.ok()) server_ = std::move(s).value();
    }
    ASSERT_NE(server_, nullptr);
  }

  std::unique_ptr<ClientTransport> Connect(const ZmqOptions& options) {
    return testing::Connect(endpoint_, options);
  }

  // Sends Join every 100 ms until the server receives a message (from anyone); returns it.
  std::optional<Inbound> JoinAndReceive(ClientTransport& client, const std::string& id) {
    return testing::JoinAndReceive(*server_, client, id,
                                   {.from_anyone = true, .fail_on_client_error = true});
  }

  // Keeps the client trying (Join + Receive) until its transport reports an error.
  Status ClientErrorWithin(ClientTransport& client, std::chrono::seconds limit) {
    for (auto end = Clock::now() + limit; Clock::now() < end;) {
      (void)client.Send(wire::MakeMessage(wire::Join{"x", 1, "test"}));
      auto got = client.Receive(50);
      if (!got.ok()) return got.status();
      auto in = server_->Receive(0);
      if (in.ok() && in->has_value()) ++server_saw_;
    }
    return absl::OkStatus();
  }

  ::huddle::testing::ScopedTempDir tmp_{"secure"};
  fs::path dir_ = tmp_.path();
  CurveKeyPair server_keys_;
  std::string endpoint_;
  std::unique_ptr<ServerTransport> server_;
  int server_saw_ = 0;
};

TEST_F(SecureTransportTest, KeyFilesRoundTripWithSecretModeAndNeverOverwrite) {
  const std::string key = (dir_ / "keys" / "server.key").string();
  struct stat st {};
  ASSERT_EQ(::stat(key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto back = ReadKeyFile(key, /*need_secret=*/true);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->public_z85, server_keys_.public_z85);
  EXPECT_EQ(back->secret_z85, server_keys_.secret_z85);
  EXPECT_EQ(back->role, "server");
  auto pub = ReadKeyFile((dir_ / "keys" / "server.pub").string(), /*need_secret=*/false);
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_TRUE(pub->secret_z85.empty());
  EXPECT_TRUE(IsError(ReadKeyFile((dir_ / "keys" / "server.pub").string(), true),
                      absl::StatusCode::kInvalidArgument, "holds only a public key"));
  EXPECT_TRUE(IsError(WriteKeyFiles(server_keys_, (dir_ / "keys").string(), "server"),
                      absl::StatusCode::kAlreadyExists, "never overwrites"));
  EXPECT_EQ(Fingerprint(server_keys_.public_z85).rfind("blake2b:", 0), 0u);
  EXPECT_EQ(Fingerprint(server_keys_.public_z85).size(), 8u + 16u);
}

TEST_F(SecureTransportTest, SecretKeyReadableByOthersOrTamperedIsRefused) {
  const std::string key = (dir_ / "keys" / "server.key").string();
  ASSERT_EQ(::chmod(key.c_str(), 0644), 0);
  EXPECT_TRUE(IsError(ReadKeyFile(key, true), absl::StatusCode::kPermissionDenied, "chmod 600"));
  ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  CurveKeyPair other = *GenerateKeyPair("server", "x");
  std::string text = *ReadFile(key);
  text.replace(text.find(server_keys_.public_z85), 40, other.public_z85);
  ASSERT_TRUE(WriteFileAtomic(key, text, 0600).ok());
  EXPECT_TRUE(IsError(ReadKeyFile(key, true), absl::StatusCode::kInvalidArgument,
                      "public_key does not belong to secret_key"));
}

TEST_F(SecureTransportTest, AllowListFromDirectoryOrFileWithClearErrors) {
  CurveKeyPair alice = Client("alice", true);
  CurveKeyPair bob = Client("bob", true);
  auto list = AllowList::Load((dir_ / "allow").string());
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->size(), 2u);
  EXPECT_EQ(list->Lookup(*DecodeZ85Key(alice.public_z85, "k")), "alice");
  EXPECT_FALSE(list->Lookup(*DecodeZ85Key(server_keys_.public_z85, "k")).has_value());

  const std::string file = (dir_ / "clients.yaml").string();
  ASSERT_TRUE(WriteFileAtomic(file, "clients:\n  alice: \"" + alice.public_z85 + "\"\n  bob: \"" +
                                        bob.public_z85 + "\"\n")
                  .ok());
  auto from_file = AllowList::Load(file);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_TRUE(from_file->HasId("bob"));

  ASSERT_TRUE(WriteFileAtomic(file, "clients:\n  alice: \"" + alice.public_z85 + "\"\n  carol: \"" +
                                        alice.public_z85 + "\"\n")
                  .ok());
  EXPECT_TRUE(IsError(AllowList::Load(file), absl::StatusCode::kInvalidArgument,
                      "is already enrolled as 'alice'"));
  ASSERT_TRUE(WriteFileAtomic(file, "clients:\n  alice: \"tooshort\"\n").ok());
  EXPECT_TRUE(IsError(AllowList::Load(file), absl::StatusCode::kInvalidArgument,
                      "must be 40 Z85 characters"));
  ASSERT_TRUE(WriteFileAtomic(file, "client:\n  alice: \"x\"\n").ok());
  EXPECT_FALSE(AllowList::Load(file).ok());

  // A secret key copied into the allow-list directory by mistake is an error, not enrollment.
  fs::copy_file(dir_ / "keys" / "alice.key", dir_ / "allow" / "alice.key");
  EXPECT_TRUE(IsError(AllowList::Load((dir_ / "allow").string()),
                      absl::StatusCode::kFailedPrecondition, "contains the secret key file"));
  EXPECT_TRUE(IsError(AllowList::Load((dir_ / "nowhere").string()), absl::StatusCode::kNotFound,
                      "does not exist"));

  // A reload skips bad entries (naming each) and keeps the rest: the .key file, a malformed .pub,
  // and both files of an id claimed twice (which of the two was meant cannot be known).
  ASSERT_TRUE(WriteFileAtomic((dir_ / "allow" / "broken.pub").string(), "role: [").ok());
  Generate("client", "bob", "bob2");  // a second key claiming bob's id
  fs::copy_file(dir_ / "keys" / "bob2.pub", dir_ / "allow" / "bob2.pub");
  std::vector<Status> skipped;
  auto lenient = AllowList::Load((dir_ / "allow").string(), &skipped);
  ASSERT_TRUE(lenient.ok()) << lenient.status();
  EXPECT_EQ(lenient->size(), 1u);
  EXPECT_TRUE(lenient->HasId("alice"));
  EXPECT_FALSE(lenient->HasId("bob"));
  std::string all;
  for (const Status& s : skipped) absl::StrAppend(&all, s.message(), "\n");
  EXPECT_EQ(skipped.size(), 4u) << all;
  EXPECT_NE(all.find("contains the secret key file"), std::string::npos) << all;
  EXPECT_NE(all.find("broken.pub"), std::string::npos) << all;
  EXPECT_NE(all.find("bob2.pub: client id 'bob' is claimed by another entry too"),
            std::string::npos)
      << all;
  // A YAML file: a bad entry is skipped; one that does not parse at all is an error.
  ASSERT_TRUE(
      WriteFileAtomic(file, "clients:\n  alice: \"tooshort\"\n  bob: \"" + bob.public_z85 + "\"\n")
          .ok());
  skipped.clear();
  auto yaml = AllowList::Load(file, &skipped);
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_TRUE(yaml->HasId("bob"));
  EXPECT_FALSE(yaml->HasId("alice"));
  EXPECT_EQ(skipped.size(), 1u);
  ASSERT_TRUE(WriteFileAtomic(file, "clients: [").ok());
  EXPECT_FALSE(AllowList::Load(file, &skipped).ok());
}

TEST_F(SecureTransportTest, OperatorKeysAreTheirOwnRoleWithoutASigningKey) {
  CurveKeyPair op = Generate("operator", "alice", "alice");
  EXPECT_EQ(op.role, "operator");
  EXPECT_EQ(op.public_z85.size(), 40u);
  EXPECT_TRUE(op.signing_public_z85.empty()) << "operators take no part in secure aggregation";
  EXPECT_TRUE(op.signing_seed_z85.empty());
  const std::string key = (dir_ / "keys" / "alice.key").string();
  const std::string pub = (dir_ / "keys" / "alice.pub").string();
  auto read = ReadKeyFile(key, /*need_secret=*/true);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->role, "operator");
  EXPECT_EQ(read->secret_z85, op.secret_z85);
  // The files say what they are for and where the .pub goes.
  EXPECT_NE(ReadFile(pub)->find("security.operators"), std::string::npos) << *ReadFile(pub);
  EXPECT_NE(ReadFile(key)->find("security.operators"), std::string::npos) << *ReadFile(key);
  EXPECT_TRUE(ReadRoleKey(key, "operator", true, "--key").ok());
  EXPECT_TRUE(IsError(ReadRoleKey(key, "client", true, "security.secret_key"),
                      absl::StatusCode::kInvalidArgument,
                      "is an operator key; expected a client key"));
  Client("site-0", false);
  EXPECT_TRUE(
      IsError(ReadRoleKey((dir_ / "keys" / "site-0.key").string(), "operator", true, "--key"),
              absl::StatusCode::kInvalidArgument, "is a client key; expected an operator key"));
}

TEST_F(SecureTransportTest, AllowListsAreByRoleAndSkipAnotherRolesKeysNamingThem) {
  Client("site-0", true);  // in the clients' allow-list
  Generate("operator", "alice", "alice");
  fs::create_directories(dir_ / "ops");
  fs::copy_file(dir_ / "keys" / "alice.pub", dir_ / "ops" / "alice.pub");
  // A client's .pub copied into the operators' directory by mistake makes no operator.
  fs::copy_file(dir_ / "keys" / "site-0.pub", dir_ / "ops" / "site-0.pub");
  const std::string ops = (dir_ / "ops").string();
  const std::string wrong_role =
      (dir_ / "ops" / "site-0.pub").string() +
      ": role is 'client'; the operators' allow-list takes only operator "
      "keys (`huddle keygen operator`)";
  EXPECT_TRUE(IsError(AllowList::Load(ops, AllowListRole::kOperator),
                      absl::StatusCode::kInvalidArgument, wrong_role));
  std::vector<Status> skipped;
  auto operators = AllowList::Load(ops, AllowListRole::kOperator, &skipped);
  ASSERT_TRUE(operators.ok()) << operators.status();
  EXPECT_EQ(operators->size(), 1u);
  EXPECT_TRUE(operators->HasId("alice"));
  EXPECT_FALSE(operators->HasId("site-0"));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].message(), wrong_role);
  // ...and the other way round: an operator's .pub in the clients' list enrols no client.
  fs::copy_file(dir_ / "keys" / "alice.pub", dir_ / "allow" / "alice.pub");
  skipped.clear();
  auto clients = AllowList::Load((dir_ / "allow").string(), &skipped);
  ASSERT_TRUE(clients.ok()) << clients.status();
  EXPECT_TRUE(clients->HasId("site-0"));
  EXPECT_FALSE(clients->HasId("alice"));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].message().find(
                "alice.pub: role is 'operator'; the clients' allow-list takes only client keys "
                "(`huddle keygen client`)"),
            std::string::npos)
      << skipped[0];
  // The YAML form carries no role: an operators' list is an `operators:` mapping, never
  // `clients:`.
  const std::string file = (dir_ / "list.yaml").string();
  const CurveKeyPair op = *ReadKeyFile((dir_ / "keys" / "alice.pub").string(), false);
  ASSERT_TRUE(WriteFileAtomic(file, "clients:\n  alice: \"" + op.public_z85 + "\"\n").ok());
  EXPECT_TRUE(IsError(AllowList::Load(file, AllowListRole::kOperator),
                      absl::StatusCode::kInvalidArgument, "needs an `operators:` mapping"));
  EXPECT_TRUE(IsError(AllowList::Load(file, AllowListRole::kOperator),
                      absl::StatusCode::kInvalidArgument, "`clients:` mapping is the clients'"));
  ASSERT_TRUE(WriteFileAtomic(file, "operators:\n  alice: \"" + op.public_z85 + "\"\n").ok());
  auto from_file = AllowList::Load(file, AllowListRole::kOperator);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(from_file->Lookup(*DecodeZ85Key(op.public_z85, "k")), "alice");
  EXPECT_TRUE(IsError(AllowList::Load(file), absl::StatusCode::kInvalidArgument,
                      "needs a `clients:` mapping"));
}

// Captures what spdlog's default logger writes; read it once the threads that log have stopped.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("%v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string Text() {
    spdlog::default_logger()->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

// A client's key relabelled as an operator's (its .pub edited to `role: operator`, and so its
// .key, which its holder has) and copied into the operators' directory: the role in a file is only
// what the file says, the key is what the handshake proves.
TEST_F(SecureTransportTest, AKeyInBothAllowListsIsRefusedOnEitherSideAcrossReloads) {
  CurveKeyPair site = Client("site-0", true);
  CurveKeyPair alice = Generate("operator", "alice", "alice");
  fs::create_directories(dir_ / "ops");
  fs::copy_file(dir_ / "keys" / "alice.pub", dir_ / "ops" / "alice.pub");
  std::string relabelled = *ReadFile((dir_ / "keys" / "site-0.pub").string());
  relabelled.replace(relabelled.find("role: client"), 12, "role: operator");
  relabelled.replace(relabelled.find("id: \"site-0\""), 12, "id: \"mallory\"");
  ASSERT_TRUE(WriteFileAtomic((dir_ / "ops" / "mallory.pub").string(), relabelled).ok());
  CurveKeyPair as_operator = site;
  as_operator.role = "operator";

  LogCapture log;
  ZmqOptions operators = ServerOptions();
  operators.curve_server->zap.allow_list_path = (dir_ / "ops").string();
  operators.curve_server->zap.role = AllowListRole::kOperator;
  operators.curve_server->zap.conflicting_path = (dir_ / "allow").string();
  Bind(operators);
  // The operator gets in; the key enrolled as a client does not, whatever its file here says.
  auto op_client = Connect(ClientOptions(alice));
  auto in = JoinAndReceive(*op_client, "alice");
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->auth_id, "alice");
  auto refused = Connect(ClientOptions(as_operator));
  Status err = ClientErrorWithin(*refused, kDeadline);
  EXPECT_TRUE(absl::IsPermissionDenied(err)) << err;
  EXPECT_EQ(server_saw_, 0);
  // A reload keeps refusing it (here: one of the clients' list, whose files changed).
  Client("site-1", true);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  refused = Connect(ClientOptions(as_operator));
  err = ClientErrorWithin(*refused, kDeadline);
  EXPECT_TRUE(absl::IsPermissionDenied(err)) << err;
  op_client.reset();
  refused.reset();
  server_.reset();
  const std::string text = log.Text();
  const std::string both = "is enrolled both as operator 'mallory' (" +
                           (dir_ / "ops" / "mallory.pub").string() + ") and as client 'site-0' (" +
                           (dir_ / "allow" / "site-0.pub").string() + ")";
  EXPECT_NE(text.find(both), std::string::npos) << text;
  EXPECT_NE(text.find("a client's key never acts as an operator"), std::string::npos) << text;
  EXPECT_NE(text.find("operators' allow-list reloaded"), std::string::npos) << text;

  // The clients' side refuses it too while it is enrolled as an operator; once the operators'
  // copy is removed (a change to the other list alone), it is a client again.
  ZmqOptions clients = ServerOptions();
  clients.curve_server->zap.conflicting_path = (dir_ / "ops").string();
  Bind(clients);
  auto site_client = Connect(ClientOptions(site));
  err = ClientErrorWithin(*site_client, kDeadline);
  EXPECT_TRUE(absl::IsPermissionDenied(err)) << err;
  fs::remove(dir_ / "ops" / "mallory.pub");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto site_again = Connect(ClientOptions(site));
  in = JoinAndReceive(*site_again, "site-0");
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->auth_id, "site-0");
}

TEST_F(SecureTransportTest, EnrolledClientGetsInAndCarriesItsEnrolledId) {
  CurveKeyPair alice = Client("alice", true);
  Bind(ServerOptions());
  EXPECT_TRUE(server_->authenticates());
  auto client = Connect(ClientOptions(alice));
  auto in = JoinAndReceive(*client, "alice");
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->auth_id, "alice");
  ASSERT_TRUE(in->message.ok()) << in->message.status();
  // The reply travels back encrypted too.
  ASSERT_TRUE(server_->Send(in->peer, wire::MakeMessage(wire::Heartbeat{})).ok());
  bool got = false;
  for (auto end = Clock::now() + kDeadline; Clock::now() < end && !got;) {
    auto r = client->Receive(50);
    ASSERT_TRUE(r.ok()) << r.status();
    got = r->has_value();
  }
  EXPECT_TRUE(got);
  EXPECT_EQ(server_->auth_rejections(), 0u);
}

TEST_F(SecureTransportTest, UnknownClientKeyIsRefusedAtTheHandshake) {
  Client("alice", true);
  CurveKeyPair mallory = Client("mallory", false);
  Bind(ServerOptions());
  auto client = Connect(ClientOptions(mallory));
  Status err = ClientErrorWithin(*client, kDeadline);
  EXPECT_TRUE(IsError(err, absl::StatusCode::kPermissionDenied, "refused this client's key"))
      << err;
  EXPECT_NE(err.message().find(Fingerprint(mallory.public_z85)), std::string::npos) << err;
  EXPECT_EQ(server_saw_, 0);  // nothing reached the coordinator
  EXPECT_GE(server_->auth_rejections(), 1u);
}

TEST_F(SecureTransportTest, WrongPinnedServerKeyFailsWithAClearError) {
  CurveKeyPair alice = Client("alice", true);
  Bind(ServerOptions());
  ZmqOptions o = ClientOptions(alice);
  o.curve_client->server_public_z85 = GenerateKeyPair("server", "impostor")->public_z85;
  auto client = Connect(o);
  Status err = ClientErrorWithin(*client, kDeadline);
  EXPECT_TRUE(IsError(err, absl::StatusCode::kUnauthenticated, "not this coordinator's key"))
      << err;
  EXPECT_EQ(server_saw_, 0);
}

TEST_F(SecureTransportTest, PlaintextAndEncryptedPeersRefuseEachOther) {
  CurveKeyPair alice = Client("alice", true);
  Bind(ServerOptions());
  auto plain = Connect(ZmqOptions{});
  Status err = ClientErrorWithin(*plain, kDeadline);
  // Which side notices first is a race: the client sees either the mechanism mismatch or the
  // server hanging up; both errors name encryption as the cause.
  EXPECT_FALSE(err.ok());
  EXPECT_NE(err.message().find("encryption"), std::string::npos) << err;
  EXPECT_EQ(server_saw_, 0);

  server_.reset();
  Bind(ZmqOptions{});  // a plaintext coordinator
  auto encrypted = Connect(ClientOptions(alice));
  err = ClientErrorWithin(*encrypted, kDeadline);
  EXPECT_FALSE(err.ok());
  EXPECT_NE(err.message().find("--insecure"), std::string::npos) << err;
  EXPECT_EQ(server_saw_, 0);
}

TEST_F(SecureTransportTest, RevokedKeyIsRefusedAfterReloadOnLiveAndNewConnections) {
  CurveKeyPair alice = Client("alice", true);
  CurveKeyPair bob = Client("bob", true);
  std::atomic<uint64_t> reloads{0};
  ZmqOptions options = ServerOptions();
  options.curve_server->zap.reload_interval_ms = 3'600'000;  // only on request (like SIGHUP)
  options.curve_server->zap.reload_requests = &reloads;
  Bind(options);
  auto alice_client = Connect(ClientOptions(alice));
  auto bob_client = Connect(ClientOptions(bob));
  ASSERT_TRUE(JoinAndReceive(*alice_client, "alice").has_value());
  ASSERT_TRUE(JoinAndReceive(*bob_client, "bob").has_value());

  fs::remove(dir_ / "allow" / "alice.pub");
  reloads++;
  // The live connection: its next messages arrive as PermissionDenied naming the client.
  bool refused = false;
  for (auto end = Clock::now() + kDeadline; Clock::now() < end && !refused;) {
    (void)alice_client->Send(wire::MakeMessage(wire::Heartbeat{}));
    auto in = server_->Receive(100);
    ASSERT_TRUE(in.ok());
    if (in->has_value() && (*in)->auth_id == "alice") {
      refused = absl::IsPermissionDenied((*in)->message.status());
    }
  }
  EXPECT_TRUE(refused) << "alice's messages still admitted after the reload";
  // A new connection with the revoked key fails at the handshake; bob is unaffected.
  auto again = Connect(ClientOptions(alice));
  Status err = ClientErrorWithin(*again, kDeadline);
  EXPECT_TRUE(IsError(err, absl::StatusCode::kPermissionDenied, "refused this client's key"))
      << err;
  // Alice's last heartbeats may still be queued at the server (refused): skip them to bob's join.
  std::optional<Inbound> in;
  for (int tries = 0; tries < 1000; ++tries) {
    in = JoinAndReceive(*bob_client, "bob");
    if (!in.has_value() || in->auth_id == "bob") break;
  }
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->auth_id, "bob");
  EXPECT_TRUE(in->message.ok()) << in->message.status();
}

// Rotating a client's key (`huddle provision --rotate`: the same id, a new .pub) cuts the live
// connections of the old key, not only its next handshakes: a connection is enrolled by the key
// it was admitted with (kZapKeyProperty), not by its id alone.
TEST_F(SecureTransportTest, RotatingAKeyCutsTheOldKeysLiveConnectionAndAdmitsTheNewKey) {
  CurveKeyPair old_key = Client("alice", true);
  std::atomic<uint64_t> reloads{0};
  ZmqOptions options = ServerOptions();
  options.curve_server->zap.reload_interval_ms = 3'600'000;  // only on request (like SIGHUP)
  options.curve_server->zap.reload_requests = &reloads;
  Bind(options);
  auto old_client = Connect(ClientOptions(old_key));
  ASSERT_TRUE(JoinAndReceive(*old_client, "alice").has_value());

  // The new key pair of the same id replaces the old .pub in the allow-list.
  fs::remove(dir_ / "keys" / "alice.key");
  fs::remove(dir_ / "keys" / "alice.pub");
  CurveKeyPair new_key = Generate("client", "alice", "alice");
  ASSERT_TRUE(WriteFileAtomic((dir_ / "allow" / "alice.pub").string(),
                              ReadFile((dir_ / "keys" / "alice.pub").string()).value())
                  .ok());
  reloads++;
  bool refused = false;
  for (auto end = Clock::now() + kDeadline; Clock::now() < end && !refused;) {
    (void)old_client->Send(wire::MakeMessage(wire::Heartbeat{}));
    auto in = server_->Receive(100);
    ASSERT_TRUE(in.ok());
    if (in->has_value() && (*in)->auth_id == "alice") {
      refused = absl::IsPermissionDenied((*in)->message.status());
    }
  }
  EXPECT_TRUE(refused) << "the old key's live connection was still admitted after the rotation";
  // A new handshake with the old key is refused; the new key joins as alice.
  auto again = Connect(ClientOptions(old_key));
  Status err = ClientErrorWithin(*again, kDeadline);
  EXPECT_TRUE(IsError(err, absl::StatusCode::kPermissionDenied, "refused this client's key"))
      << err;
  auto new_client = Connect(ClientOptions(new_key));
  std::optional<Inbound> in;
  for (int tries = 0; tries < 1000; ++tries) {
    in = JoinAndReceive(*new_client, "alice");
    if (!in.has_value() || in->message.ok()) break;  // skip the old connections' refusals
  }
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->auth_id, "alice");
  EXPECT_TRUE(in->message.ok()) << in->message.status();
}

TEST_F(SecureTransportTest, AllowListChangesArePickedUpPeriodicallyAndBrokenFilesAreSkipped) {
  CurveKeyPair alice = Client("alice", true);
  CurveKeyPair bob = Client("bob", false);
  Bind(ServerOptions());  // checks every 100 ms
  auto bob_client = Connect(ClientOptions(bob));
  Status err = ClientErrorWithin(*bob_client, kDeadline);
  ASSERT_TRUE(absl::IsPermissionDenied(err)) << err;
  // A malformed file is reported and skipped: alice stays enrolled.
  ASSERT_TRUE(WriteFileAtomic((dir_ / "allow" / "broken.pub").string(), "role: [").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto alice_client = Connect(ClientOptions(alice));
  ASSERT_TRUE(JoinAndReceive(*alice_client, "alice").has_value());
  // ...and does not block a revocation made while it is there: removing alice.pub applies.
  fs::remove(dir_ / "allow" / "alice.pub");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto revoked = Connect(ClientOptions(alice));
  err = ClientErrorWithin(*revoked, kDeadline);
  EXPECT_TRUE(absl::IsPermissionDenied(err)) << "a revocation was held back by a malformed file";
  fs::remove(dir_ / "allow" / "broken.pub");
  fs::copy_file(dir_ / "keys" / "bob.pub", dir_ / "allow" / "bob.pub");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto bob_again = Connect(ClientOptions(bob));
  // The server reports alice's cut live connection (revoked) first: skip it to bob's join.
  std::optional<Inbound> in;
  for (int tries = 0; tries < 1000; ++tries) {
    in = JoinAndReceive(*bob_again, "bob");
    if (!in.has_value() || in->auth_id == "bob") break;
  }
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->auth_id, "bob");
}

TEST_F(SecureTransportTest, AFloodingPeerIsRateLimitedBeforeDecoding) {
  CurveKeyPair alice = Client("alice", true);
  ZmqOptions options = ServerOptions();
  options.max_messages_per_s = 50;
  options.burst_messages = 50;
  Bind(options);
  auto client = Connect(ClientOptions(alice));
  ASSERT_TRUE(JoinAndReceive(*client, "alice").has_value());
  const auto start = Clock::now();
  uint64_t sent = 0;  // the client's own send queue (high-water mark) may refuse some
  for (int i = 0; i < 2000; ++i) sent += client->Send(wire::MakeMessage(wire::Heartbeat{})).ok();
  ASSERT_GT(sent, 500u);
  int delivered = 0;
  for (auto end = Clock::now() + std::chrono::seconds(2); Clock::now() < end;) {
    auto in = server_->Receive(50);
    ASSERT_TRUE(in.ok());
    if (in->has_value()) ++delivered;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // At most the burst plus the refill over the elapsed time; everything else was dropped.
  EXPECT_LE(delivered, 50 + static_cast<int>(50 * seconds) + 1);
  EXPECT_GE(server_->rate_limited() + static_cast<uint64_t>(delivered), sent - 5);
  EXPECT_GE(server_->rate_limited(), sent - 50 - static_cast<uint64_t>(50 * seconds) - 1);
}

}  // namespace
}  // namespace huddle::transport
