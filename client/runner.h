// Runs a ClientAgent against a coordinator over a ClientTransport (ZeroMQ in `huddle client`).
//
// The I/O loop owns the transport; the agent runs on one worker thread so a long local training
// never stops heartbeats. Connection life cycle:
//   1. Send Join every backoff interval (exponential with jitter, initial..max) until Welcome.
//      A client started before its coordinator simply keeps trying.
//   2. Joined: heartbeat every interval; the coordinator answers each one.
//   3. Nothing heard for coordinator_timeout_ms: drop the connection, reconnect, back to 1.
//      A restarted coordinator answers a stranger's heartbeat with unknown_client, and the agent
//      joins again, so both a lost and a restarted coordinator are rejoined.
//   4. Shutdown from the coordinator, a fatal agent error, *stop, or give_up_after_ms without a
//      coordinator ends the loop.
#pragma once

#include <atomic>
#include <cstdint>

#include "client/agent.h"
#include "client/config.h"
#include "common/clock.h"
#include "transport/transport.h"

namespace huddle::client {

// Returns OK after a Shutdown (or *stop), the agent's fatal error, or Unavailable after
// give_up_after_ms without a coordinator.
Status RunClient(ClientAgent& agent, transport::ClientTransport& transport,
                 const RunnerOptions& options, const Clock& clock,
                 const std::atomic<bool>* stop = nullptr);

// A configured client, as `huddle client` and the client SDK run it, in two steps:
// OpenPrivacyGuard opens the client's privacy guard (config.privacy) and logs its policy and
// ledger; RunConfiguredClient connects to config.coordinator with `zopts` and runs `agent` (its
// guard set) with config.runner until RunClient returns.
StatusOr<PrivacyGuard> OpenPrivacyGuard(const ClientConfig& config);
Status RunConfiguredClient(const ClientConfig& config, const transport::ZmqOptions& zopts,
                           ClientAgent& agent, const std::atomic<bool>* stop = nullptr);

}  // namespace huddle::client
