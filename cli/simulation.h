// `huddle run`'s simulation on a virtual clock (`simulation: {clock: virtual}`, cli/run_cmd.cc):
// what each simulated client costs in virtual time, and what a run says about its settings.
//
// Client i computes for slowdown_i x seconds_per_example x the examples its work passes over:
//   - a training instruction (FitInstruction): epochs x its shard's size, or under DP-SGD its
//     steps x its expected batch (models::DpSgdSteps on min(expected_batch_size, shard size));
//   - a federated evaluation (EvaluateInstruction): a third of that per example (a forward pass),
//     over its shard once;
//   - anything else: nothing.
// slowdown_i is drawn once per client from the job seed (SimulationOptions: constant 1, or
// lognormal of median 1). Links and dropouts are the transport's (transport/sim_transport.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/job_config.h"
#include "common/config_reader.h"
#include "proto/messages.h"
#include "transport/sim_transport.h"

namespace huddle::cli {

// Reads the job's `simulation` section into *s. The virtual clock's settings are refused with
// `clock: real`, naming both keys; errors name the key and what is allowed.
Status ReadSimulation(ConfigMap& sim, SimulationOptions* s);

// Each of sim.clients clients' multiplier on its compute time, in client order; a function of
// `seed` and the client's index alone.
std::vector<double> DrawSlowdowns(const SimulationOptions& sim, uint64_t seed);

// The examples a training run of `train` passes over on a shard of `shard_size` examples.
int64_t ExamplesTrained(const wire::TrainConfig& train, int64_t shard_size);

// Virtual seconds a client of `slowdown` holding `shard_size` examples computes on `msg`.
double ComputeSeconds(const wire::Message& msg, int64_t shard_size, double slowdown,
                      double seconds_per_example);

// The transport's settings: each client's link, its compute (ComputeSeconds with its shard size
// and slowdown, both in client order) and dropout, seeded from the job seed.
transport::SimulatedTransportOptions TransportOptions(const SimulationOptions& sim, uint64_t seed,
                                                      std::vector<int64_t> shard_sizes,
                                                      std::vector<double> slowdowns);

// The slowdowns' median, 10th and 90th percentiles (linear interpolation) and the slowest tenth's
// mean over the median. All 1 for an empty list.
struct SlowdownSummary {
  double median = 1;
  double p10 = 1;
  double p90 = 1;
  double slowest_decile_ratio = 1;
};
SlowdownSummary Summarize(std::vector<double> slowdowns);

// The start line's text after "huddle run: ": the clock is virtual, the slowdowns drawn, and the
// other settings.
std::string DescribeVirtualSimulation(const SimulationOptions& sim,
                                      const std::vector<double>& slowdowns);

// OUT/simulation.json: the settings, the seed, each client's slowdown by id, and (once the job
// ended) the training instructions lost to dropout.
std::string SimulationJson(const SimulationOptions& sim, uint64_t seed,
                           const std::vector<std::string>& ids,
                           const std::vector<double>& slowdowns,
                           std::optional<uint64_t> dropouts = std::nullopt);

}  // namespace huddle::cli
