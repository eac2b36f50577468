// `huddle client`: a client agent on an edge node.
#include <spdlog/spdlog.h>

#include <cstdio>

#include "cli/commands.h"
#include "client/agent.h"
#include "client/runner.h"
#include "client/silo.h"
#include "common/clock.h"
#include "common/logging.h"
#include "kernels/backend.h"
#include "kernels/cpu_isa.h"
#include "transport/zmq_transport.h"

namespace huddle::cli {
namespace {

Status ApplyFlags(const ClientFlags& f, ClientConfig* c) {
  if (!f.coordinator.empty()) c->coordinator = f.coordinator;
  if (!f.client_id.empty()) c->client_id = f.client_id;
  if (!f.data.empty()) c->data.path = f.data;
  if (!f.format.empty()) {
    if (f.format != "idx" && f.format != "csv") {
      return absl::InvalidArgumentError(
          absl::StrCat("--format '", f.format, "' is not allowed (allowed: idx, csv)"));
    }
    c->data.format = f.format;
  }
  if (!f.partition.empty()) {
    if (f.partition == "none") {
      c->data.partitioned = false;
    } else {
      HUDDLE_ASSIGN_OR_RETURN(c->data.partition.kind, data::ParsePartitionKind(f.partition));
      c->data.partitioned = true;
    }
  }
  if (f.num_classes > 0) c->data.num_classes = f.num_classes;
  if (f.scale_255) c->data.csv_scale_255 = true;
  if (f.num_shards > 0) c->data.partition.num_shards = f.num_shards;
  if (f.shard >= 0) c->data.shard = f.shard;
  if (f.alpha > 0) c->data.partition.alpha = f.alpha;
  if (f.partition_seed >= 0) c->data.partition.seed = static_cast<uint64_t>(f.partition_seed);
  if (f.give_up_after_s >= 0) {
    c->runner.give_up_after_ms = static_cast<int64_t>(f.give_up_after_s * 1000);
  }
  if (!f.log_level.empty()) c->log_level = f.log_level;
  if (!f.server_key.empty()) c->security.server_public_key = f.server_key;
  if (!f.key.empty()) c->security.secret_key = f.key;
  if (!f.project_key.empty()) c->security.project_public_key = f.project_key;
  if (!f.device.empty()) {
    if (Status st = kernels::ParseDeviceRequest(f.device).status(); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--device: ", st.message()));
    }
    c->device = f.device;
  }
  if (f.silo_nproc > 0) c->silo_nproc = f.silo_nproc;
  if (f.slowdown > 0) c->slowdown = f.slowdown;
  return absl::OkStatus();
}

// The device or the silo could not be set up: exit code 2, the reason on stderr.
int SetupError(const ClientConfig& config, const Status& st) {
  std::fprintf(stderr, "huddle client %s: %s\n", config.client_id.c_str(),
               std::string(st.message()).c_str());
  return 2;
}

}  // namespace

int RunClientCommand(const ClientFlags& flags) {
  ClientConfig config;
  if (!flags.config.empty()) {
    auto loaded = LoadClientConfig(flags.config);
    if (!loaded.ok()) {
      std::fprintf(stderr, "huddle client: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    config = std::move(loaded).value();
  }
  if (Status st = ApplyFlags(flags, &config); !st.ok()) {
    std::fprintf(stderr, "huddle client: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (flags.insecure) WarnInsecure("client");
  auto zopts = client::ClientTransportOptions(&config, flags.insecure);
  if (!zopts.ok()) {
    std::fprintf(stderr, "huddle client: %s\n", std::string(zopts.status().message()).c_str());
    return 2;
  }
  if (Status st = ValidateClientConfig(config); !st.ok()) {
    std::fprintf(stderr, "huddle client: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (Status st = SetupLogging(config.log_level, "client " + config.client_id); !st.ok()) {
    std::fprintf(stderr, "huddle client: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  auto dataset = data::LoadClientData(config.data);
  if (!dataset.ok()) {
    std::fprintf(stderr, "huddle client: %s\n", std::string(dataset.status().message()).c_str());
    return 1;
  }
  data::DatasetView view;
  view.base = &dataset.value();
  spdlog::info("loaded {} examples from {}", view.size(), config.data.path);
  const kernels::DeviceRequest device = kernels::ParseDeviceRequest(config.device).value();
  std::unique_ptr<kernels::Backend> backend;  // both outlive the agent
  std::unique_ptr<client::Silo> silo;
  client::ClientAgent agent(config.client_id, &view);
  auto guard = client::OpenPrivacyGuard(config);
  if (!guard.ok()) return SetupError(config, guard.status());
  agent.set_privacy_guard(*std::move(guard));
  auto identity = client::SecAggIdentityOf(config);
  if (!identity.ok()) return SetupError(config, identity.status());
  if (*identity) agent.set_secagg_identity(**std::move(identity));
  agent.set_max_sessions_per_round(config.secure_aggregation.max_sessions_per_round);
  if (config.slowdown > 1) {
    agent.set_slowdown(config.slowdown);
    spdlog::info("slowdown {}: each round's training is followed by {} x its time waited",
                 config.slowdown, config.slowdown - 1);
  }
  if (config.silo_nproc > 1) {
    // A silo: several ranks train as this one client; they connect once, here.
    client::SiloOptions silo_options;
    silo_options.nproc = config.silo_nproc;
    silo_options.device = device;
    auto created = client::Silo::Create(silo_options);
    if (!created.ok()) return SetupError(config, created.status());
    silo = std::move(created).value();
    spdlog::info("training as a silo: {} (device: {})", silo->description(), config.device);
    agent.builtin()->set_silo(silo.get());
  } else {
    // The device: `auto` takes a GPU where one is usable and says which; `cuda` without one is an
    // error, never a quiet fallback to the CPU.
    auto opened = kernels::OpenBackend(device);
    if (!opened.ok()) return SetupError(config, opened.status());
    backend = std::move(opened).value();
    spdlog::info("training on {} (device: {}; cpu kernels: {})", backend->name(), config.device,
                 kernels::CpuIsaDescription());
    agent.builtin()->set_backend(backend.get());
  }
  Status st = client::RunConfiguredClient(config, *zopts, agent, &StopFlag());
  if (!st.ok()) {
    std::fprintf(stderr, "huddle client %s: %s\n", config.client_id.c_str(),
                 std::string(st.message()).c_str());
    return 1;
  }
  spdlog::info("finished after training {} rounds", agent.rounds_trained());
  return StopFlag().load() ? StopExitCode() : kExitOk;
}

}  // namespace huddle::cli
