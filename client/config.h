// A client's settings: the client YAML (`huddle client --config`, README "Client
// configuration"), and the transport options they make. Used by `huddle client` and the client SDK
// (huddle/client/client.h).
#pragma once

#include <map>
#include <string>

#include "client/privacy_guard.h"
#include "client/secagg_member.h"
#include "common/config_reader.h"
#include "common/status.h"
#include "data/client_data.h"
#include "transport/zmq_transport.h"

namespace huddle::client {

// The connection life cycle (client/runner.h).
struct RunnerOptions {
  int64_t heartbeat_interval_ms = 1000;    // until the coordinator's Welcome says otherwise
  int64_t coordinator_timeout_ms = 15000;  // silence after which the connection is renewed
  int64_t backoff_initial_ms = 250;
  int64_t backoff_max_ms = 8000;
  int64_t give_up_after_ms = 0;  // 0: keep trying for ever
};

struct ClientSecurity {
  std::string server_public_key;  // the coordinator's .pub file, pinned
  std::string secret_key;         // this client's .key file (huddle keygen client)
  // The project's .pub file (huddle keygen project), pinned: in secure aggregation this client
  // accepts only members the project certified. Without it, it refuses secure aggregation.
  std::string project_public_key;
};

// `secure_aggregation:` what this client assumes in secure aggregation, whatever the coordinator
// says (aggregation/secagg/protocol.h's MemberPolicy): it refuses a session whose threshold,
// graph and minimum do not hold against these, and counts its distributed-DP release by them.
struct ClientSecAgg {
  double corrupt_fraction = 0.1;  // of a session, colluding with the coordinator, in [0, 0.5)
  int security_bits = 40;         // a session may fail its guarantee with probability 2^-this
  int64_t max_sessions_per_round = 4;
};

// The largest `slowdown` (and --slowdown) a client takes.
inline constexpr double kMaxSlowdown = 1000;

struct ClientConfig {
  std::string coordinator;  // tcp://HOST:PORT
  std::string client_id;    // defaults to the id in the client's key file
  ClientSecurity security;
  data::DataSpec data;
  // `datasets:` a service agent's data sets by name (`huddle agent`); a job names the one it
  // trains on. Empty for `huddle client`, which has the one `data`.
  std::map<std::string, data::DataSpec> datasets;
  RunnerOptions runner;
  std::string log_level = "info";
  std::string device = "auto";  // auto | cpu | cuda[:N] (kernels::ParseDeviceRequest)
  // `silo: {nproc: N}`: N ranks (CPU ranks, or GPUs from `device`'s ordinal on) train as this
  // one client, synchronous data-parallel (client/silo.h). 1: one device, no silo.
  int64_t silo_nproc = 1;
  // `slowdown: X` (>= 1): behave like a device X times slower (ClientAgent::set_slowdown: after
  // local training, wait (X - 1) x its wall time before asking to upload). For experiments with
  // stragglers; 1: no wait.
  double slowdown = 1;
  // `privacy:` the client's own policy and ledger (client/privacy_guard.h). Empty: the
  // coordinator's settings are trusted and releases are accounted in memory only.
  ClientPrivacyPolicy privacy;
  ClientSecAgg secure_aggregation;
};

// Reads a client YAML. Errors name the key, the value and what is allowed.
StatusOr<ClientConfig> LoadClientConfig(const std::string& path);
// A loaded config's cross-key checks (a coordinator and a client id given, the shard in range).
Status ValidateClientConfig(const ClientConfig& config);

// The transport options of a client: CurveZMQ with the coordinator's pinned public key and the
// client's key pair (security.*), the client id taken from the key file when none is given (and
// refused when it differs), or plaintext when `insecure` (the caller warns).
StatusOr<transport::ZmqOptions> ClientTransportOptions(ClientConfig* config, bool insecure);

// This client's identity in secure aggregation: its signing key (security.secret_key) and the
// project key it pins (security.project_public_key), with its secure_aggregation assumptions.
// nullopt without a project key (the agent then refuses secure aggregation, saying why); an
// error for a key file without a signing key, or a project file that is not one.
StatusOr<std::optional<SecAggIdentity>> SecAggIdentityOf(const ClientConfig& config);

// `device: auto | cpu | cuda[:N]` of *map, checked so that a typo fails before anything starts.
Status ReadDevice(ConfigMap& map, std::string* device);
// `silo: {nproc: N}` of *parent: N ranks train as one client (client/silo.h).
Status ReadSilo(ConfigMap& parent, int64_t* nproc);

}  // namespace huddle::client
