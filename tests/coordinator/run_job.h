// Shared coordinator-test harness: one whole job run against a FakeFederation in simulated time,
// with everything it produced owned by the result (status, final model, every round's metrics,
// the summary, and the federation, for the test to inspect). Header-only; a test that uses it
// compiles fake_federation.cc and links huddle_coordinator.
//
//   JobRun job = RunJob(options, {.clients = Honest(4), .delivery_seed = 3});
//   ASSERT_TRUE(job.status.ok()) << job.status;
//   EXPECT_EQ(job.metrics.size(), 2u);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "coordinator/coordinator.h"
#include "tests/coordinator/fake_federation.h"

namespace huddle::testing {

// What a job runs against: its clients, the order their messages arrive in, and how the
// federation is set up before the coordinator starts.
struct JobSetup {
  std::vector<SyntheticClient> clients;
  uint64_t delivery_seed = 1;
  bool authenticated = false;                   // FakeFederation's `authenticated`
  std::function<void(FakeFederation&)> before;  // e.g. an evaluate answer, injected messages
  coordinator::Evaluator evaluator;
  // A clock shared with other jobs (e.g. a job and its resumption), which must outlive the
  // result; unset: the job has a fresh one of its own.
  ManualClock* clock = nullptr;
};

// Everything one job produced. The clock and the federation outlive the run, for inspection.
struct JobRun {
  Status status;
  TensorList model;
  std::vector<coordinator::RoundMetrics> metrics;
  coordinator::JobSummary summary;
  std::unique_ptr<ManualClock> own_clock;  // unless the setup lent one
  ManualClock* clock = nullptr;
  std::unique_ptr<FakeFederation> federation;
};

// Runs the job of `options` against a FakeFederation of `setup` to its end.
inline JobRun RunJob(const coordinator::CoordinatorOptions& options, JobSetup setup) {
  JobRun run;
  if (setup.clock == nullptr) run.own_clock = std::make_unique<ManualClock>();
  run.clock = setup.clock != nullptr ? setup.clock : run.own_clock.get();
  run.federation =
      std::make_unique<FakeFederation>(std::move(setup.clients), models::Layout(options.model),
                                       run.clock, setup.delivery_seed, setup.authenticated);
  if (setup.before) setup.before(*run.federation);
  coordinator::Coordinator coord(
      options, run.federation.get(), run.clock, std::move(setup.evaluator),
      [&run](const coordinator::RoundMetrics& m) { run.metrics.push_back(m); });
  run.status = coord.Run();
  run.model = coord.model();
  run.summary = coord.summary();
  return run;
}

}  // namespace huddle::testing
