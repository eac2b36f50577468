// Options for the coordinator, with their defaults. cli/job_config.cc maps the job YAML onto these
// in one place; docs in README.md ("Configuration reference").
#pragma once

#include <cstdint>
#include <string>

#include "aggregation/server_optimizer.h"
#include "aggregation/streaming_aggregator.h"
#include "models/mlp.h"
#include "privacy/budget.h"
#include "proto/messages.h"

namespace huddle::coordinator {

struct CohortOptions {
  enum class Sampling { kFixed, kPoisson };
  // kFixed: `size` clients drawn uniformly without replacement (all if fewer are enrolled).
  // kPoisson: each enrolled client independently with probability `rate`.
  Sampling sampling = Sampling::kFixed;
  int64_t size = 10;
  double rate = 0.1;
};

struct CoordinatorOptions {
  std::string job_name = "huddle";
  uint64_t seed = 1;  // model init, cohort sampling, client seeds
  int64_t rounds = 20;
  models::MlpSpec model;
  wire::TrainConfig train;  // sent to clients with every fit instruction
  CohortOptions cohort;

  int64_t min_clients = 1;               // enrolled live clients needed to start a round
  int64_t wait_for_clients_ms = 120000;  // error if min_clients have not joined by then
  int64_t round_deadline_ms = 60000;     // results after this are ignored (stragglers)
  int64_t quorum = 1;                    // results needed for a round to update the model
  int64_t upload_slots = 4;              // uploads in flight at once (bounds memory)
  int64_t upload_timeout_ms = 30000;     // a grant not used within this is revoked

  aggregation::ServerOptimizerOptions server;
  aggregation::AggregatorOptions aggregation;
  privacy::PrivacyOptions privacy;  // client-level DP (docs/privacy.md); mode none by default

  int64_t eval_every = 1;                // evaluate every k rounds (0: never)
  int64_t heartbeat_interval_ms = 1000;  // told to clients
  int64_t client_timeout_ms = 10000;     // silent this long -> considered gone (0: never)

  std::string out_dir;  // metrics.jsonl, summary.json, model.bin, checkpoint
  bool resume = false;  // continue from out_dir/checkpoint.bin
};

}  // namespace huddle::coordinator
