// Transport security for the CLI: key generation (`huddle keygen`), the coordinator's CurveZMQ
// options from its config (the client's: client/config.h), and ephemeral keys for `huddle run`.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "common/file_util.h"
#include "transport/curve_keys.h"

namespace huddle::cli {
namespace {

namespace fs = std::filesystem;

}  // namespace

void WarnInsecure(const char* command) {
  std::fprintf(stderr,
               "huddle %s: WARNING: --insecure: plaintext transport. Anyone on the network can "
               "read and alter model updates and join as any client. Use only on a trusted "
               "network, for debugging.\n",
               command);
  std::fflush(stderr);
}

StatusOr<transport::ZmqOptions> CoordinatorTransportOptions(const JobConfig& job, bool insecure) {
  transport::ZmqOptions zopts;
  zopts.io_threads = 2;  // CurveZMQ decryption runs on the I/O threads: use both cores
  zopts.max_messages_per_s = job.security.max_messages_per_s;
  zopts.burst_messages = job.security.burst_messages;
  // A few messages per peer are plenty (a client has at most one update in flight); with TCP
  // backpressure this bounds what a flooding peer can make us buffer.
  zopts.recv_hwm = 64;
  if (insecure) {
    WarnInsecure("coordinator");
    return zopts;
  }
  const ServerSecurity& s = job.security;
  if (s.server_secret_key.empty() || s.allowed_clients.empty()) {
    return absl::FailedPreconditionError(
        "no transport security configured: set security.server_secret_key (create it with "
        "`huddle keygen server --out keys`) and security.allowed_clients (a directory of "
        "enrolled client .pub files), or pass --server-key and --allow; --insecure runs "
        "plaintext");
  }
  HUDDLE_ASSIGN_OR_RETURN(
      transport::CurveKeyPair server,
      transport::ReadRoleKey(s.server_secret_key, "server", true, "security.server_secret_key"));
  transport::ZapOptions zap;
  zap.allow_list_path = s.allowed_clients;
  zap.reload_interval_ms = s.reload_interval_ms;
  zap.reload_requests = &ReloadRequests();
  zopts.curve_server = transport::CurveServerOptions{std::move(server), std::move(zap)};
  spdlog::info("encrypted transport (CurveZMQ); coordinator key {}",
               transport::Fingerprint(zopts.curve_server->server.public_z85));
  return zopts;
}

Status GenerateLocalKeys(const std::string& dir, const std::vector<std::string>& client_ids) {
  std::error_code ec;
  fs::remove_all(dir, ec);  // ephemeral: a fresh set for every run
  HUDDLE_ASSIGN_OR_RETURN(transport::CurveKeyPair server,
                          transport::GenerateKeyPair("server", "coordinator"));
  HUDDLE_RETURN_IF_ERROR(transport::WriteKeyFiles(server, dir, "server"));
  const std::string clients = (fs::path(dir) / "clients").string();
  const std::string allowed = (fs::path(dir) / "allowed").string();
  HUDDLE_RETURN_IF_ERROR(MakeDirs(allowed));
  for (const std::string& id : client_ids) {
    HUDDLE_ASSIGN_OR_RETURN(transport::CurveKeyPair k, transport::GenerateKeyPair("client", id));
    HUDDLE_RETURN_IF_ERROR(transport::WriteKeyFiles(k, clients, id));
    fs::rename(fs::path(clients) / (id + ".pub"), fs::path(allowed) / (id + ".pub"), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot enroll ", id, ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

int RunKeygenCommand(const KeygenFlags& flags) {
  std::string id = flags.id;
  if (flags.role == "server") {
    if (id.empty()) id = "server";
  } else if (!wire::IsValidClientId(id)) {
    std::fprintf(stderr,
                 "huddle keygen: a client key needs --id NAME, 1-128 characters of "
                 "[A-Za-z0-9._-] (the client id the coordinator will know it as)\n");
    return 2;
  }
  auto keys = transport::GenerateKeyPair(flags.role, id);
  Status st = keys.ok() ? transport::WriteKeyFiles(*keys, flags.out_dir, id) : keys.status();
  if (!st.ok()) {
    std::fprintf(stderr, "huddle keygen: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const std::string base = (fs::path(flags.out_dir) / id).string();
  std::printf("wrote %s.key (secret, mode 0600) and %s.pub (public)\n", base.c_str(), base.c_str());
  std::printf("%s '%s' public key: %s\nfingerprint: %s\n", flags.role.c_str(), id.c_str(),
              keys->public_z85.c_str(), transport::Fingerprint(keys->public_z85).c_str());
  if (flags.role == "server") {
    std::printf(
        "coordinator: security.server_secret_key: %s.key\n"
        "clients pin: security.server_public_key: %s.pub (or --server-key %s.pub)\n",
        base.c_str(), base.c_str(), base.c_str());
  } else {
    std::printf(
        "enroll: copy %s.pub into the coordinator's security.allowed_clients directory\n"
        "client: --key %s.key (or security.secret_key)\n",
        base.c_str(), base.c_str());
  }
  return 0;
}

}  // namespace huddle::cli
