// Transport security for the CLI: key generation (`huddle keygen`), the coordinator's CurveZMQ
// options from its config (the client's: client/config.h), and ephemeral keys for `huddle run`.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cli/commands.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "transport/curve_keys.h"

namespace huddle::cli {
namespace {

namespace fs = std::filesystem;

}  // namespace

StatusOr<MemberCertificate> CertificateFor(const transport::CurveKeyPair& keys,
                                           uint64_t not_after) {
  MemberCertificate c;
  c.id = keys.id;
  HUDDLE_ASSIGN_OR_RETURN(c.transport_key, transport::DecodeZ85Key(keys.public_z85, keys.id));
  HUDDLE_ASSIGN_OR_RETURN(c.signing_key, transport::SigningPublicKeyOf(keys, keys.id));
  c.not_after = not_after;
  return c;
}

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
  // The project key that certifies the clients for secure aggregation: here the same process
  // holds it (a local federation has one operator); a deployment keeps it off the coordinator.
  HUDDLE_ASSIGN_OR_RETURN(transport::CurveKeyPair project,
                          transport::GenerateKeyPair("project", "project"));
  HUDDLE_RETURN_IF_ERROR(transport::WriteKeyFiles(project, dir, "project"));
  HUDDLE_ASSIGN_OR_RETURN(SigningKey project_key, transport::SigningKeyOf(project, "project"));
  const std::string clients = (fs::path(dir) / "clients").string();
  const std::string allowed = (fs::path(dir) / "allowed").string();
  HUDDLE_RETURN_IF_ERROR(MakeDirs(allowed));
  for (const std::string& id : client_ids) {
    HUDDLE_ASSIGN_OR_RETURN(transport::CurveKeyPair k, transport::GenerateKeyPair("client", id));
    HUDDLE_RETURN_IF_ERROR(transport::WriteKeyFiles(k, clients, id));
    fs::remove(fs::path(clients) / (id + ".pub"), ec);
    HUDDLE_ASSIGN_OR_RETURN(MemberCertificate certificate, CertificateFor(k, 0));
    HUDDLE_RETURN_IF_ERROR(transport::RewritePublicFile(
        transport::WithCertificate(k, Certify(certificate, project_key)),
        (fs::path(allowed) / (id + ".pub")).string()));
  }
  return absl::OkStatus();
}

int RunCertifyCommand(const CertifyFlags& flags) {
  auto project = transport::ReadRoleKey(flags.project_key, "project", true, "--project");
  StatusOr<SigningKey> key =
      project.ok() ? transport::SigningKeyOf(*project, flags.project_key) : project.status();
  if (!key.ok()) {
    std::fprintf(stderr, "huddle certify: %s\n", std::string(key.status().message()).c_str());
    return 2;
  }
  const uint64_t not_after = flags.days > 0 ? static_cast<uint64_t>(std::time(nullptr)) +
                                                  static_cast<uint64_t>(flags.days) * 86400
                                            : 0;
  int failed = 0;
  for (const std::string& file : flags.files) {
    auto keys = transport::ReadRoleKey(file, "client", false, file.c_str());
    StatusOr<MemberCertificate> certificate =
        keys.ok() ? CertificateFor(*keys, not_after) : StatusOr<MemberCertificate>(keys.status());
    Status st = certificate.ok()
                    ? transport::RewritePublicFile(
                          transport::WithCertificate(*keys, Certify(*certificate, *key)), file)
                    : certificate.status();
    if (!st.ok()) {
      std::fprintf(stderr, "huddle certify: %s\n", std::string(st.message()).c_str());
      ++failed;
      continue;
    }
    std::printf("certified '%s' (%s, signing %s)%s by project %s\n", keys->id.c_str(),
                transport::Fingerprint(keys->public_z85).c_str(),
                SigningFingerprint(certificate->signing_key).c_str(),
                not_after > 0 ? absl::StrCat(" until ", not_after, " (Unix time)").c_str() : "",
                SigningFingerprint(key->public_key()).c_str());
  }
  if (failed == 0 && !flags.files.empty()) {
    std::printf(
        "enroll: copy the .pub files into the coordinator's security.allowed_clients directory\n"
        "clients pin: security.project_public_key: the project's .pub (or --project-key)\n");
  }
  return failed == 0 ? 0 : 1;
}

std::function<std::optional<MemberCertificate>(const std::string&)> AllowListCertificates(
    std::string path) {
  struct Cache {
    absl::Mutex mu;
    std::string signature ABSL_GUARDED_BY(mu);
    int64_t checked_ms ABSL_GUARDED_BY(mu) = -1;
    std::optional<transport::AllowList> list ABSL_GUARDED_BY(mu);
  };
  auto cache = std::make_shared<Cache>();
  return [path = std::move(path),
          cache](const std::string& id) -> std::optional<MemberCertificate> {
    absl::MutexLock lock(&cache->mu);
    const int64_t now = SteadyClock::Get()->NowMs();
    if (cache->checked_ms < 0 || now - cache->checked_ms >= 1000) {
      cache->checked_ms = now;
      std::string signature = transport::AllowList::Signature(path);
      if (signature != cache->signature) {
        auto list = transport::AllowList::Load(path);
        if (list.ok()) {
          cache->list = *std::move(list);
          cache->signature = std::move(signature);
        } else {
          spdlog::warn("certificates: {} (keeping the last good list)", list.status().message());
        }
      }
    }
    return cache->list ? cache->list->Certificate(id) : std::nullopt;
  };
}

int RunKeygenCommand(const KeygenFlags& flags) {
  std::string id = flags.id;
  if (flags.role == "server" || flags.role == "project") {
    if (id.empty()) id = flags.role;
  } else if (!wire::IsValidClientId(id)) {
    std::fprintf(stderr,
                 flags.role == "operator"
                     ? "huddle keygen: an operator key needs --id NAME, 1-128 characters of "
                       "[A-Za-z0-9._-] (the operator's name in the service's audit log)\n"
                     : "huddle keygen: a client key needs --id NAME, 1-128 characters of "
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
  if (flags.role == "project") {
    std::printf(
        "project '%s' signing key: %s (%s)\n"
        "the privacy owner keeps %s.key, not the coordinator's operator\n"
        "certify each client: huddle certify --project %s.key CLIENT.pub ...\n"
        "clients pin: security.project_public_key: %s.pub (or --project-key %s.pub)\n",
        id.c_str(), keys->signing_public_z85.c_str(),
        SigningFingerprint(*transport::SigningPublicKeyOf(*keys, id)).c_str(), base.c_str(),
        base.c_str(), base.c_str(), base.c_str());
    return 0;
  }
  std::printf("%s '%s' public key: %s\nfingerprint: %s\n", flags.role.c_str(), id.c_str(),
              keys->public_z85.c_str(), transport::Fingerprint(keys->public_z85).c_str());
  if (flags.role == "server") {
    std::printf(
        "coordinator: security.server_secret_key: %s.key\n"
        "clients pin: security.server_public_key: %s.pub (or --server-key %s.pub)\n",
        base.c_str(), base.c_str(), base.c_str());
  } else if (flags.role == "operator") {
    std::printf(
        "enroll: copy %s.pub into the service's security.operators directory (never into its "
        "allowed_clients)\n"
        "operator commands: huddle submit|jobs|status|stop|logs|clients --key %s.key "
        "--server-key server.pub --service tcp://HOST:5556\n",
        base.c_str(), base.c_str());
  } else {
    std::printf(
        "certify (secure aggregation): huddle certify --project project.key %s.pub\n"
        "enroll: copy %s.pub into the coordinator's security.allowed_clients directory\n"
        "client: --key %s.key (or security.secret_key)\n",
        base.c_str(), base.c_str(), base.c_str());
  }
  return 0;
}

}  // namespace huddle::cli
