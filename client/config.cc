#include "client/config.h"

#include "client/silo.h"
#include "kernels/backend.h"
#include "proto/messages.h"
#include "transport/curve_keys.h"

namespace huddle::client {
namespace {

// A policy's optional `max_epsilon`.
Status ReadMaxEpsilon(ConfigMap& m, std::optional<double>* out) {
  if (!m.Has("max_epsilon")) return absl::OkStatus();
  double eps = 0;
  HUDDLE_RETURN_IF_ERROR(m.Optional("max_epsilon", &eps, 1e-6, 1e6));
  *out = eps;
  return absl::OkStatus();
}

// The client's `privacy` section (ClientPrivacyPolicy).
Status ReadClientPrivacy(ConfigMap& m, ClientPrivacyPolicy* p) {
  HUDDLE_RETURN_IF_ERROR(m.OptionalPath("ledger", &p->ledger_path));
  HUDDLE_RETURN_IF_ERROR(m.Optional("acknowledge_ledger_loss", &p->acknowledge_ledger_loss));
  if (m.Has("reply_after_s")) {
    int64_t ms = 0;
    HUDDLE_RETURN_IF_ERROR(m.OptionalSeconds("reply_after_s", &ms, 0, 86400));
    p->reply_after_ms = ms;
  }
  if (m.Has("local")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap l, m.Child("local"));
    LocalDpPolicy local;
    HUDDLE_RETURN_IF_ERROR(l.Optional("require", &local.require));
    HUDDLE_RETURN_IF_ERROR(
        l.Optional("min_noise_multiplier", &local.min_noise_multiplier, 0.0, 1e6));
    HUDDLE_RETURN_IF_ERROR(ReadMaxEpsilon(l, &local.max_epsilon));
    HUDDLE_RETURN_IF_ERROR(l.Optional("delta", &local.delta, 1e-300, 0.5));
    if (l.Has("clip_norm")) {
      double c = 0;
      HUDDLE_RETURN_IF_ERROR(l.Optional("clip_norm", &c, 1e-9, 1e9));
      local.clip_norm = c;
    }
    HUDDLE_RETURN_IF_ERROR(
        l.OptionalChoice("adjacency", &local.adjacency, {"replace_one", "add_remove"}));
    HUDDLE_RETURN_IF_ERROR(l.Finish());
    p->local = local;
  }
  if (m.Has("dp_sgd")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap d, m.Child("dp_sgd"));
    DpSgdPolicy dp;
    HUDDLE_RETURN_IF_ERROR(d.Optional("require", &dp.require));
    HUDDLE_RETURN_IF_ERROR(d.Optional("min_noise_multiplier", &dp.min_noise_multiplier, 0.0, 1e6));
    HUDDLE_RETURN_IF_ERROR(ReadMaxEpsilon(d, &dp.max_epsilon));
    HUDDLE_RETURN_IF_ERROR(d.Optional("delta", &dp.delta, 1e-300, 0.5));
    std::string accountant = privacy::AccountantName(dp.accountant);
    HUDDLE_RETURN_IF_ERROR(d.OptionalChoice("accountant", &accountant, {"rdp", "pld"}));
    dp.accountant =
        accountant == "pld" ? privacy::AccountantKind::kPld : privacy::AccountantKind::kRdp;
    HUDDLE_RETURN_IF_ERROR(d.Finish());
    p->dp_sgd = dp;
  }
  if (m.Has("distributed")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap d, m.Child("distributed"));
    DistributedDpPolicy dist;
    HUDDLE_RETURN_IF_ERROR(d.Optional("require", &dist.require));
    HUDDLE_RETURN_IF_ERROR(
        d.Optional("min_noise_multiplier", &dist.min_noise_multiplier, 0.0, 1e6));
    if (d.Has("corrupt_fraction")) {
      return absl::InvalidArgumentError(absl::StrCat(
          d.Where("corrupt_fraction"),
          ": moved to secure_aggregation.corrupt_fraction (it now also decides the threshold and "
          "graph this client requires of every secure-aggregation session)"));
    }
    HUDDLE_RETURN_IF_ERROR(ReadMaxEpsilon(d, &dist.max_epsilon));
    HUDDLE_RETURN_IF_ERROR(d.Optional("delta", &dist.delta, 1e-300, 0.5));
    HUDDLE_RETURN_IF_ERROR(d.Finish());
    p->distributed = dist;
  }
  if (p->any() && p->ledger_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        m.Where("ledger"),
        ": required with privacy.local, privacy.distributed or privacy.dp_sgd (the client's own "
        "durable record of "
        "what it released; keep it with the client's data, and never delete it)"));
  }
  return m.Finish();
}

}  // namespace

// `device: auto | cpu | cuda[:N]`, checked here so a typo fails before anything starts.
Status ReadDevice(ConfigMap& map, std::string* device) {
  HUDDLE_RETURN_IF_ERROR(map.Optional("device", device));
  if (Status st = kernels::ParseDeviceRequest(*device).status(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(map.Where("device"), ": ", st.message()));
  }
  return absl::OkStatus();
}

// `silo: {nproc: N}` in a client's settings: N ranks train as that one client (client/silo.h).
Status ReadSilo(ConfigMap& parent, int64_t* nproc) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap silo, parent.Child("silo"));
  HUDDLE_RETURN_IF_ERROR(silo.Optional("nproc", nproc, 1, kMaxSiloRanks));
  return silo.Finish();
}

StatusOr<ClientConfig> LoadClientConfig(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::LoadFile(path));
  ClientConfig c;
  HUDDLE_RETURN_IF_ERROR(top.Optional("coordinator", &c.coordinator));
  HUDDLE_RETURN_IF_ERROR(top.Optional("client_id", &c.client_id));
  HUDDLE_RETURN_IF_ERROR(ReadDevice(top, &c.device));
  HUDDLE_RETURN_IF_ERROR(ReadSilo(top, &c.silo_nproc));
  HUDDLE_RETURN_IF_ERROR(top.Optional("slowdown", &c.slowdown, 1.0, kMaxSlowdown));
  HUDDLE_RETURN_IF_ERROR(top.OptionalChoice("log_level", &c.log_level,
                                            {"trace", "debug", "info", "warn", "error", "off"}));
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap data, top.Child("data"));
  HUDDLE_RETURN_IF_ERROR(data::ReadDataSpec(data, &c.data, /*shard_keys=*/true));
  // `datasets: {NAME: {path, format, ...}}`: a service agent's data sets by name (huddle agent).
  if (top.Has("datasets")) {
    if (top.Has("data")) {
      return absl::InvalidArgumentError(absl::StrCat(
          top.Where("data"), " and ", top.Where("datasets"),
          ": give one: `data` for `huddle client` (one job), `datasets` for `huddle agent` (data "
          "sets by name, for the service's jobs)"));
    }
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap sets, top.Child("datasets"));
    for (const std::string& name : sets.Keys()) {
      if (!wire::IsValidClientId(name) || c.datasets.size() >= wire::kMaxDatasetNames) {
        return absl::InvalidArgumentError(
            absl::StrCat(sets.Where(name),
                         !wire::IsValidClientId(name)
                             ? ": a data set name is 1-128 characters of [A-Za-z0-9._-]"
                             : absl::StrCat(": at most ", wire::kMaxDatasetNames, " data sets")));
      }
      HUDDLE_ASSIGN_OR_RETURN(ConfigMap one, sets.Child(name));
      data::DataSpec spec;
      HUDDLE_RETURN_IF_ERROR(data::ReadDataSpec(one, &spec, /*shard_keys=*/true));
      c.datasets[name] = spec;
    }
    HUDDLE_RETURN_IF_ERROR(sets.Finish());
  }
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap sec, top.Child("security"));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("server_public_key", &c.security.server_public_key));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("secret_key", &c.security.secret_key));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("project_public_key", &c.security.project_public_key));
  HUDDLE_RETURN_IF_ERROR(sec.Finish());
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap agg, top.Child("secure_aggregation"));
  HUDDLE_RETURN_IF_ERROR(
      agg.Optional("corrupt_fraction", &c.secure_aggregation.corrupt_fraction, 0.0, 0.4999));
  int64_t security_bits = c.secure_aggregation.security_bits;
  HUDDLE_RETURN_IF_ERROR(agg.Optional("security_bits", &security_bits, 8, 128));
  c.secure_aggregation.security_bits = static_cast<int>(security_bits);
  HUDDLE_RETURN_IF_ERROR(agg.Optional("max_sessions_per_round",
                                      &c.secure_aggregation.max_sessions_per_round, 1, 1000));
  HUDDLE_RETURN_IF_ERROR(agg.Finish());
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap conn, top.Child("connection"));
  HUDDLE_RETURN_IF_ERROR(
      conn.OptionalSeconds("coordinator_timeout_s", &c.runner.coordinator_timeout_ms, 0.1, 86400));
  HUDDLE_RETURN_IF_ERROR(
      conn.OptionalSeconds("backoff_initial_s", &c.runner.backoff_initial_ms, 0.01, 3600));
  HUDDLE_RETURN_IF_ERROR(
      conn.OptionalSeconds("backoff_max_s", &c.runner.backoff_max_ms, 0.01, 3600));
  HUDDLE_RETURN_IF_ERROR(
      conn.OptionalSeconds("give_up_after_s", &c.runner.give_up_after_ms, 0, 7 * 86400));
  HUDDLE_RETURN_IF_ERROR(conn.Finish());
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap priv, top.Child("privacy"));
  HUDDLE_RETURN_IF_ERROR(ReadClientPrivacy(priv, &c.privacy));
  HUDDLE_RETURN_IF_ERROR(top.Finish());
  return c;
}

Status ValidateClientConfig(const ClientConfig& c) {
  if (c.coordinator.empty()) {
    return absl::InvalidArgumentError("no coordinator given (--coordinator tcp://HOST:PORT)");
  }
  if (c.client_id.empty()) {
    return absl::InvalidArgumentError("no client id given (--client-id, or a key file --key)");
  }
  if (c.data.partitioned && c.data.shard >= c.data.partition.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", c.data.shard, " is out of range for ",
                                                   c.data.partition.num_shards, " shards"));
  }
  return absl::OkStatus();
}

StatusOr<std::optional<SecAggIdentity>> SecAggIdentityOf(const ClientConfig& config) {
  const ClientSecurity& s = config.security;
  if (s.project_public_key.empty()) return std::optional<SecAggIdentity>();
  if (s.secret_key.empty()) {
    return absl::InvalidArgumentError(
        "security.project_public_key is set but no security.secret_key: secure aggregation signs "
        "with this client's key (huddle keygen client)");
  }
  HUDDLE_ASSIGN_OR_RETURN(transport::CurveKeyPair project,
                          transport::ReadRoleKey(s.project_public_key, "project", false,
                                                 "security.project_public_key"));
  HUDDLE_ASSIGN_OR_RETURN(
      transport::CurveKeyPair mine,
      transport::ReadRoleKey(s.secret_key, "client", true, "security.secret_key"));
  SecAggIdentity identity;
  identity.id = config.client_id.empty() ? mine.id : config.client_id;
  HUDDLE_ASSIGN_OR_RETURN(identity.key,
                          transport::SigningKeyOf(mine, "security.secret_key " + s.secret_key));
  HUDDLE_ASSIGN_OR_RETURN(identity.policy.project_key,
                          transport::SigningPublicKeyOf(project, s.project_public_key));
  identity.policy.corrupt_fraction = config.secure_aggregation.corrupt_fraction;
  identity.policy.security_bits = config.secure_aggregation.security_bits;
  return std::optional<SecAggIdentity>(std::move(identity));
}

StatusOr<transport::ZmqOptions> ClientTransportOptions(ClientConfig* config, bool insecure) {
  transport::ZmqOptions zopts;
  if (insecure) return zopts;
  const ClientSecurity& s = config->security;
  if (s.server_public_key.empty() || s.secret_key.empty()) {
    return absl::FailedPreconditionError(
        "no transport security configured: pass the coordinator's public key (--server-key "
        "server.pub, or security.server_public_key) and this client's key pair (--key NAME.key, "
        "or security.secret_key; create it with `huddle keygen client --id NAME`), or "
        "--insecure for plaintext");
  }
  HUDDLE_ASSIGN_OR_RETURN(
      transport::CurveKeyPair server,
      transport::ReadRoleKey(s.server_public_key, "server", false, "security.server_public_key"));
  HUDDLE_ASSIGN_OR_RETURN(
      transport::CurveKeyPair mine,
      transport::ReadRoleKey(s.secret_key, "client", true, "security.secret_key"));
  if (config->client_id.empty()) {
    config->client_id = mine.id;
  } else if (config->client_id != mine.id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client id '", config->client_id, "' differs from the id '", mine.id, "' in key file ",
        s.secret_key, ": the coordinator knows this key as '", mine.id, "'"));
  }
  zopts.curve_client = transport::CurveClientOptions{server.public_z85, std::move(mine)};
  // A key not enrolled (yet) is retried, backing off up to the runner's own backoff: enrolment
  // may be on its way, and give_up_after bounds the wait.
  zopts.refused_retry_max_ms = config->runner.backoff_max_ms;
  return zopts;
}

}  // namespace huddle::client
