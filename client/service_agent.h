// `huddle agent`: a client agent that stays, taking part in the jobs a service (`huddle serve`,
// service/service.h) hosts.
//
// It holds a session with the service: a Join naming no job but listing the agent's data sets by
// name, heartbeats, and the service's JobOffers. For an offer of a job on a data set it declared,
// and while it is in no other job, it runs that job exactly as `huddle client` runs one (a
// ClientAgent over RunClient, client/runner.h) on a connection of its own whose Join names the
// job, on a thread of its own while the session goes on. When the job ends (its Shutdown), the
// agent waits for the next offer. A lost service is reconnected with backoff; a refused key is
// retried (its enrolment may be on its way); nothing ends the agent but *stop or a fatal error of
// its own (a data set that cannot be trained on is the job's error, logged, not the agent's).
//
// The agent's privacy guard (its policy and its ledger) is one for the agent's life: lent to each
// job's ClientAgent and taken back when the job ends, so every release of every job is in the one
// ledger and every budget spans them all.
//
// Thread-safety: RunServiceAgent blocks its calling thread until *stop.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "client/agent.h"
#include "client/config.h"
#include "client/privacy_guard.h"
#include "common/status.h"
#include "transport/zmq_transport.h"

namespace huddle::client {

// Makes the ClientAgent for `job` on the data set the agent declared as `data` (the caller binds
// it to its loaded data, device and secure-aggregation identity). Its errors end that job's part.
using JobAgentFactory = std::function<StatusOr<std::unique_ptr<ClientAgent>>(
    const std::string& job, const std::string& data)>;

// Runs until *stop. `config`: the service's endpoint (`coordinator`), the client id, the data sets
// (their names are declared to the service), runner options; `zopts` its transport.
Status RunServiceAgent(const ClientConfig& config, const transport::ZmqOptions& zopts,
                       JobAgentFactory factory, PrivacyGuard guard, const std::atomic<bool>* stop);

}  // namespace huddle::client
