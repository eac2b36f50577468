// The public client SDK (huddle/client/client.h): Run is `huddle client` with the caller's trainer
// (client/runner.h's RunConfiguredClient, the same agent and processing), Version.
#include <spdlog/spdlog.h>

#include "client/agent.h"
#include "client/config.h"
#include "client/runner.h"
#include "common/config_reader.h"
#include "common/logging.h"
#include "common/version.h"
#include "huddle/client/client.h"

namespace huddle::client {
namespace {

// The options over the config file's settings. Errors name the option or the file's key.
StatusOr<ClientConfig> ConfigOf(const ClientOptions& options) {
  ClientConfig config;
  if (!options.config_file.empty()) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::LoadFile(options.config_file));
    for (const char* key : {"data", "device", "silo"}) {
      if (top.Has(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat(top.Where(key),
                         " is for `huddle client`'s built-in trainer; a trainer given to "
                         "huddle::client::Run owns its data and its device"));
      }
    }
    HUDDLE_ASSIGN_OR_RETURN(config, LoadClientConfig(options.config_file));
  }
  if (!options.coordinator.empty()) config.coordinator = options.coordinator;
  if (!options.client_id.empty()) config.client_id = options.client_id;
  if (!options.secret_key_file.empty()) config.security.secret_key = options.secret_key_file;
  if (!options.server_key_file.empty()) {
    config.security.server_public_key = options.server_key_file;
  }
  if (!options.project_key_file.empty()) {
    config.security.project_public_key = options.project_key_file;
  }
  if (!options.privacy_ledger.empty()) config.privacy.ledger_path = options.privacy_ledger;
  if (options.give_up_after_s < 0 || !(options.give_up_after_s <= 7 * 86400.0)) {
    return absl::InvalidArgumentError(absl::StrCat("ClientOptions::give_up_after_s is ",
                                                   options.give_up_after_s,
                                                   "; it must be in [0, 604800]"));
  }
  if (options.give_up_after_s > 0) {
    config.runner.give_up_after_ms = static_cast<int64_t>(options.give_up_after_s * 1000);
  }
  if (!options.log_level.empty()) config.log_level = options.log_level;
  return config;
}

Status RunTrainer(Trainer& trainer, const ClientOptions& options) {
  HUDDLE_ASSIGN_OR_RETURN(ClientConfig config, ConfigOf(options));
  HUDDLE_ASSIGN_OR_RETURN(transport::ZmqOptions zopts,
                          ClientTransportOptions(&config, options.insecure));
  HUDDLE_RETURN_IF_ERROR(ValidateClientConfig(config));
  HUDDLE_RETURN_IF_ERROR(SetupLogging(config.log_level, "client " + config.client_id));
  if (options.insecure) {
    spdlog::warn(
        "insecure: plaintext transport. Anyone on the network can read and alter model updates "
        "and join as any client. Use only on a trusted network, for debugging.");
  }
  ClientAgent agent(config.client_id, &trainer);
  HUDDLE_ASSIGN_OR_RETURN(PrivacyGuard guard, OpenPrivacyGuard(config));
  agent.set_privacy_guard(std::move(guard));
  HUDDLE_ASSIGN_OR_RETURN(std::optional<SecAggIdentity> identity, SecAggIdentityOf(config));
  if (identity) agent.set_secagg_identity(*std::move(identity));
  agent.set_max_sessions_per_round(config.secure_aggregation.max_sessions_per_round);
  HUDDLE_RETURN_IF_ERROR(RunConfiguredClient(config, zopts, agent, options.stop));
  spdlog::info("finished after training {} rounds", agent.rounds_trained());
  return absl::OkStatus();
}

}  // namespace

void Run(Trainer& trainer, const ClientOptions& options) {
  const Status st = RunTrainer(trainer, options);
  if (!st.ok()) throw Error(std::string(st.message()));
}

const char* Version() { return huddle::Version(); }

const char* BuildRevision() { return huddle::BuildRevision(); }

}  // namespace huddle::client
