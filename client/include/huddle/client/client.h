// Huddle client SDK: join a federation with your own trainer. Public, installed; depends on the C++
// standard library alone.
//
//   #include <huddle/client/client.h>
//
//   class MyTrainer : public huddle::client::Trainer { ... };   // huddle/client/trainer.h
//
//   huddle::client::ClientOptions options;
//   options.coordinator = "tcp://coordinator.example:5555";
//   options.secret_key_file = "hospital-7.key";       // `huddle keygen client --id hospital-7`
//   options.server_key_file = "server.pub";           // the coordinator's public key
//   MyTrainer trainer;
//   huddle::client::Run(trainer, options);            // until the coordinator ends the job
//
// Run is `huddle client` with the trainer given instead of a built-in model and a data set: the
// same connection life cycle (join, heartbeats, reconnects with backoff), CurveZMQ encryption and
// authentication, privacy policy and ledger, and the same processing of every update (see
// trainer.h). Link with Huddle::client (find_package(Huddle)).
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "huddle/client/trainer.h"

namespace huddle::client {

// A fatal error of Run: bad options, a refused identity, a coordinator that speaks another
// protocol version, a trainer that refused the job, or no coordinator within give_up_after_s.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ClientOptions {
  // A client YAML file, the format of `huddle client --config` (README, "Client configuration"):
  // its connection, security, privacy and logging sections are read first; its data, device and
  // silo sections are refused (the trainer owns its data and device). The fields below, where set,
  // override the file. Empty: no file.
  std::string config_file;
  std::string coordinator;      // tcp://HOST:PORT
  std::string client_id;        // default: the id in secret_key_file
  std::string secret_key_file;  // this client's CurveZMQ key pair (`huddle keygen client`)
  std::string server_key_file;  // the coordinator's public key
  // The project's public key (`huddle keygen project`): in secure aggregation this client accepts
  // only members the project certified, and refuses secure aggregation without it.
  std::string project_key_file;
  // Plaintext, no authentication: for tests on one machine, against a coordinator started with
  // --insecure. Never in a deployment.
  bool insecure = false;
  // The client's privacy ledger (a file; every release this client makes is appended, fsync'd,
  // before it is sent). Empty: the file's, or in memory only.
  std::string privacy_ledger;
  // Give up after this many seconds without a coordinator; 0: the file's, or keep trying.
  double give_up_after_s = 0;
  // trace | debug | info | warn | error | off; empty: the file's, or info. Logs go to stderr.
  std::string log_level;
  // Set *stop to true (from any thread, e.g. a signal handler's flag) to end Run: it returns soon
  // after, once the trainer's call in progress has returned. nullptr: only the coordinator ends it.
  const std::atomic<bool>* stop = nullptr;
};

// Runs the client until the coordinator shuts the job down (returns normally) or a fatal error
// (throws Error with the reason). `trainer` must outlive the call; it is called from a worker
// thread of Run's, one call at a time. Signals are the embedding program's: Run installs no
// handler (ClientOptions::stop is how a handler ends the run).
void Run(Trainer& trainer, const ClientOptions& options);

// The SDK's version, "0.1.0".
const char* Version();
// The git revision the library was built from (12 hex digits, "-dirty" when the tree had
// changes; "unknown" outside a git checkout), as `huddle --version` prints it.
const char* BuildRevision();

}  // namespace huddle::client
