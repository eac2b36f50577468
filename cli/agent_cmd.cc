// `huddle agent --config agent.yaml`: a client agent that stays, for a service's jobs
// (client/service_agent.h).
#include <spdlog/spdlog.h>

#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "client/agent.h"
#include "client/runner.h"
#include "client/service_agent.h"
#include "client/silo.h"
#include "common/logging.h"
#include "kernels/backend.h"
#include "kernels/cpu_isa.h"

namespace huddle::cli {

int RunAgentCommand(const AgentFlags& flags) {
  constexpr const char* kCommand = "huddle agent";
  auto loaded = LoadClientConfig(flags.config);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s: %s\n", kCommand, std::string(loaded.status().message()).c_str());
    return kExitUsage;
  }
  ClientConfig config = *std::move(loaded);
  if (!flags.service.empty()) config.coordinator = flags.service;
  if (!flags.log_level.empty()) config.log_level = flags.log_level;
  if (!flags.key.empty()) config.security.secret_key = flags.key;
  if (!flags.server_key.empty()) config.security.server_public_key = flags.server_key;
  if (flags.slowdown > 0) config.slowdown = flags.slowdown;
  auto usage = [&](const std::string& why) {
    std::fprintf(stderr, "%s: %s\n", kCommand, why.c_str());
    return kExitUsage;
  };
  if (config.datasets.empty()) {
    return usage(
        "datasets: an agent declares its data sets by name (datasets: {NAME: {path: ..., format: "
        "idx|csv}}); a job submitted to the service names the one it trains on");
  }
  if (flags.insecure) WarnInsecure("agent");
  auto zopts = client::ClientTransportOptions(&config, flags.insecure);
  if (!zopts.ok()) return usage(std::string(zopts.status().message()));
  if (config.coordinator.empty()) return usage("no service given (coordinator: tcp://HOST:PORT)");
  if (config.client_id.empty()) return usage("no client id given (client_id, or a key file)");
  if (Status st = SetupLogging(config.log_level, "agent " + config.client_id); !st.ok()) {
    return usage(std::string(st.message()));
  }
  // Every data set is loaded (and checked) now: a bad path is the operator's error at start,
  // not a job's later.
  std::map<std::string, data::Dataset> datasets;
  std::map<std::string, data::DatasetView> views;
  for (const auto& [name, spec] : config.datasets) {
    auto d = data::LoadClientData(spec);
    if (!d.ok()) {
      std::fprintf(stderr, "%s: datasets.%s: %s\n", kCommand, name.c_str(),
                   std::string(d.status().message()).c_str());
      return kExitFailed;
    }
    datasets.emplace(name, *std::move(d));
    data::DatasetView view;
    view.base = &datasets.at(name);
    views.emplace(name, view);
    spdlog::info("data set '{}': {} examples from {}", name, views.at(name).size(), spec.path);
  }
  auto device = kernels::ParseDeviceRequest(config.device);
  if (!device.ok()) return usage(std::string(device.status().message()));
  // One device (or one silo of several ranks, connected once) for the agent's life, lent to each
  // job's agent in turn (one job at a time).
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<client::Silo> silo;
  if (config.silo_nproc > 1) {
    client::SiloOptions silo_options;
    silo_options.nproc = config.silo_nproc;
    silo_options.device = *device;
    auto created = client::Silo::Create(silo_options);
    if (!created.ok()) return usage(std::string(created.status().message()));
    silo = *std::move(created);
    spdlog::info("training as a silo: {} (device: {})", silo->description(), config.device);
  } else {
    auto opened = kernels::OpenBackend(*device);
    if (!opened.ok()) return usage(std::string(opened.status().message()));
    backend = *std::move(opened);
    spdlog::info("training on {} (device: {}; cpu kernels: {})", backend->name(), config.device,
                 kernels::CpuIsaDescription());
  }
  auto guard = client::OpenPrivacyGuard(config);
  if (!guard.ok()) {
    std::fprintf(stderr, "%s: %s\n", kCommand, std::string(guard.status().message()).c_str());
    return kExitUsage;
  }
  auto identity = client::SecAggIdentityOf(config);
  if (!identity.ok()) return usage(std::string(identity.status().message()));
  client::JobAgentFactory factory =
      [&](const std::string& job,
          const std::string& data) -> StatusOr<std::unique_ptr<client::ClientAgent>> {
    auto view = views.find(data);
    if (view == views.end()) {
      return absl::NotFoundError(absl::StrCat("no data set '", data, "'"));
    }
    auto agent = std::make_unique<client::ClientAgent>(config.client_id, &view->second);
    if (silo) {
      agent->builtin()->set_silo(silo.get());
    } else {
      agent->builtin()->set_backend(backend.get());
    }
    if (*identity) agent->set_secagg_identity(**identity);
    agent->set_max_sessions_per_round(config.secure_aggregation.max_sessions_per_round);
    if (config.slowdown > 1) agent->set_slowdown(config.slowdown);
    spdlog::debug("job '{}': agent ready on '{}'", job, data);
    return agent;
  };
  Status st = client::RunServiceAgent(config, *zopts, factory, *std::move(guard), &StopFlag());
  if (!st.ok()) {
    std::fprintf(stderr, "%s %s: %s\n", kCommand, config.client_id.c_str(),
                 std::string(st.message()).c_str());
    return kExitFailed;
  }
  return StopFlag().load() ? StopExitCode() : kExitOk;
}

}  // namespace huddle::cli
