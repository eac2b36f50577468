// Options for the coordinator, with their defaults. cli/job_config.cc maps the job YAML onto these
// in one place; docs in README.md ("Configuration reference").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "aggregation/secagg/graph.h"
#include "aggregation/server_optimizer.h"
#include "aggregation/streaming_aggregator.h"
#include "common/member_certificate.h"
#include "common/status.h"
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

// Federated evaluation (`evaluation: {mode: federated}`): the clients evaluate the global model on
// their own data, for a model the coordinator cannot evaluate (an external one) or a job without
// test data on the server. It runs between rounds (coordinator/federated_eval.cc).
struct FederatedEvalOptions {
  int64_t clients = 10;         // clients asked each time (fewer when fewer are live)
  int64_t deadline_ms = 60000;  // answers after this are ignored; the next round then starts
  // An answer's weight (its example count, at most aggregation.max_weight) is capped at this
  // multiple of the lower median count of the evaluation's answers, so that one client lying
  // about its data cannot dominate the mean.
  double max_weight_ratio = 4;
};

// Secure aggregation (`secure_aggregation:`; aggregation/secagg/protocol.h, docs/security.md): the
// clients mask their quantized updates so that the coordinator learns only the sum of each
// round's survivors.
struct SecureAggregationOptions {
  bool enabled = false;
  // The neighbourhood graph is chosen for these (aggregation/secagg/graph.h) unless `neighbours`
  // and `threshold` are both set.
  aggregation::secagg::GraphOptions graph;
  int neighbours = 0;
  int threshold = 0;
  // A round unmasks nothing with fewer masked inputs than max(threshold, quorum, this fraction of
  // the cohort rounded up, the consistency quorum: more than half the cohort, its colluders aside).
  double min_survivor_fraction = 0.5;
  int64_t stage_timeout_ms = 30000;  // every stage after training; the first ends at the deadline
  int bits = 0;                      // word width: 0 chooses 32 (64 when 32 is too narrow)
  // Without DP, whether updates are weighted by their example counts (FedAvg) inside the secure
  // sum: a masked weight word no one can check but for its total, which a lying member can move
  // within [survivors, survivors x the cap] (docs/security.md). Off (default): every survivor
  // weighs 1.
  bool weight_by_examples = false;
  // Each member's certificate (common/member_certificate.h) by client id, as the project key
  // certified it: what the coordinator lists the member with. A member without one cannot join a
  // session (members accept only certified peers). The CLI reads them from the allow-list.
  std::function<std::optional<MemberCertificate>(const std::string& id)> certificates;
};

// Buffered asynchronous training (`async:`; FedBuff, Nguyen et al. 2022;
// coordinator/async_round.h): instead of lock-step rounds, `concurrency` clients train at all
// times, each result is folded as it arrives (its delta against the model version that client was
// sent, discounted by its staleness), and every `buffer` accepted results make one server step.
// `rounds` then counts server steps (flushes); `round.deadline_s` bounds each task from its
// dispatch.
struct AsyncOptions {
  bool enabled = false;
  int64_t concurrency = 10;  // C: clients training at once (fewer when fewer are eligible)
  int64_t buffer = 5;        // K: accepted updates per server step
  // s(tau), the factor a result of staleness tau (server steps since its model was sent) is
  // scaled by before it is folded; in (0, 1], so a stale update never weighs more than a fresh one:
  //   constant:   1
  //   polynomial: (1 + tau)^-exponent (FedBuff's default, exponent 0.5)
  //   hinge:      1 for tau <= hinge_after, else 1 / (hinge_slope (tau - hinge_after) + 1)
  enum class Staleness { kConstant, kPolynomial, kHinge };
  Staleness weight = Staleness::kPolynomial;
  double exponent = 0.5;
  int64_t hinge_after = 4;
  double hinge_slope = 1;
  // Results staler than this are refused (the client is free for a new task).
  int64_t max_staleness = 20;
  // With secure aggregation: each session is sent ceil(buffer x over_selection) members and its
  // training stage ends once `buffer` of them have trained (the others are dropped from it), so
  // that a session does not wait for its slowest members (Bonawitz et al. 2019's goal count).
  double over_selection = 1.0;
};

// s(tau) of `async` (above).
double StalenessFactor(const AsyncOptions& async, uint64_t staleness);

struct CoordinatorOptions {
  std::string job_name = "huddle";
  uint64_t seed = 1;  // model init, cohort sampling, client seeds
  int64_t rounds = 20;
  models::ModelSpec model;
  // The initial global model, in Layout(model) order (checked against it, and finite). null: the
  // seeded models::InitModel, which an external model does not have (it must be given). Shared so
  // that copies of the options do not copy the model. A checkpoint, when resuming, wins over it.
  std::shared_ptr<const TensorList> initial_model;
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
  // Without DP: each client's delta is clipped to this L2 norm before it is folded, the standard
  // norm-bounding defence; the aggregator's |value| bound then follows from it (|x_i| <= ||x||),
  // so an update is clipped rather than refused for its size. 0: the automatic bound below.
  // Secure aggregation without DP needs it > 0 (clients clip to it before masking).
  double max_update_norm = 0;
  // With max_update_norm 0, without DP or secure aggregation: each delta is clipped to this
  // factor times the median L2 norm of recently accepted updates (UpdateNormBound in
  // coordinator/update_check.h, which also gives the round-1 rule). 0: no norm bound at all.
  double auto_norm_factor = 3;
  // Without DP: a client's FedAvg weight (its claimed example count) is capped at this multiple
  // of the median count the round's cohort claimed when joining (0: no cap). One client lying
  // about its data then cannot take over the average.
  double max_weight_ratio = 4;
  privacy::PrivacyOptions privacy;  // client-level DP (docs/privacy.md); mode none by default
  SecureAggregationOptions secure_aggregation;
  AsyncOptions async;

  enum class EvalMode { kServer, kFederated };
  // kServer: the Evaluator given to the Coordinator (e.g. on the test set); kFederated: the
  // clients (FederatedEvalOptions). Either writes test_accuracy and test_loss of the round.
  EvalMode eval_mode = EvalMode::kServer;
  int64_t eval_every = 1;  // evaluate every k rounds and after the last (0: never)
  FederatedEvalOptions federated_eval;

  int64_t heartbeat_interval_ms = 1000;  // told to clients
  int64_t client_timeout_ms = 10000;     // silent this long -> considered gone (0: never)
  // The job fails (non-zero exit) after this many rounds in a row that accepted no update.
  int64_t max_rounds_without_update = 3;

  std::string out_dir;  // metrics.jsonl, summary.json, model.bin, checkpoint
  bool resume = false;  // continue from out_dir/checkpoint.bin
  // Resume from a checkpoint of a format before C4 (no checksum: damage or editing would go
  // unnoticed); off, such a file is refused (coordinator/checkpoint.h). CLI:
  // --allow-legacy-checkpoint.
  bool allow_legacy_checkpoint = false;
  // Start afresh in an out_dir that holds a previous job's outputs (they are replaced). Without it
  // (or resume) such a directory is refused, so that nothing is lost by accident.
  bool force = false;
};

// The checks of `options` that need no file, no model and no client: combinations that cannot
// work or whose guarantee would not hold (federated evaluation under DP, distributed DP without
// secure aggregation, secure aggregation under central DP or without a bound, a quorum above a
// fixed cohort, ...). InvalidArgument naming the job's YAML keys. The one place these rules live:
// Coordinator::Run checks them first, and the YAML loader (cli/job_config.cc) at load time.
Status ValidateOptions(const CoordinatorOptions& options);

}  // namespace huddle::coordinator
