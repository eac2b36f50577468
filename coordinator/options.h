// Options for the coordinator, with their defaults. cli/job_config.cc maps the job YAML onto these
// in one place; docs in README.md ("Configuration reference").
#pragma once

#include <cstdint>
#include <string>

#include "aggregation/server_optimizer.h"
#include "aggregation/streaming_aggregator.h"
#include "models/model.h"
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
  models::ModelSpec model;
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
  // Without DP: each client's delta is clipped to this L2 norm before it is folded (0: off), the
  // standard norm-bounding defence; the aggregator's |value| bound then follows from it
  // (|x_i| <= ||x||), so an update is clipped rather than refused for its size.
  double max_update_norm = 0;
  // Without DP: a client's FedAvg weight (its claimed example count) is capped at this multiple
  // of the median count the round's cohort claimed when joining (0: no cap). One client lying
  // about its data then cannot take over the average.
  double max_weight_ratio = 4;
  privacy::PrivacyOptions privacy;  // client-level DP (docs/privacy.md); mode none by default

  int64_t eval_every = 1;                // evaluate every k rounds (0: never)
  int64_t heartbeat_interval_ms = 1000;  // told to clients
  int64_t client_timeout_ms = 10000;     // silent this long -> considered gone (0: never)
  // The job fails (non-zero exit) after this many rounds in a row that accepted no update.
  int64_t max_rounds_without_update = 3;

  std::string out_dir;  // metrics.jsonl, summary.json, model.bin, checkpoint
  bool resume = false;  // continue from out_dir/checkpoint.bin
  // Start afresh in an out_dir that holds a previous job's outputs (they are replaced). Without it
  // (or resume) such a directory is refused, so that nothing is lost by accident.
  bool force = false;
};

}  // namespace huddle::coordinator
