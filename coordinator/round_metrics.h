// What one round did, as written to metrics.jsonl (one JSON object per line) and shown in the
// live progress line.
//
// Under DP the values split in two (docs/privacy.md, "What is public"): metrics.jsonl holds only
// what the DP guarantee covers or the configuration fixes (PublicJson: the round, the evaluation
// of the released model on the coordinator's own test set, epsilon and the mechanism's settings,
// the noised adaptive clip norm); operator_metrics.jsonl holds the operator-only diagnostics,
// computed from the clients' data or behaviour without noise (OperatorJson: counts of clients,
// results and examples, the raw adaptive-clipping count, timings (the round's, each upload's),
// bytes). Without DP everything is in metrics.jsonl (ToJson).
//
// `time` (wall_ms, ISO-8601 UTC) is when the row was written. Under DP it is in
// operator_metrics.jsonl only: the times of successive rows give each round's duration, which
// depends on how many clients answered before the deadline (operator-only, like duration_s).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace huddle::coordinator {

inline constexpr char kMetricsFile[] = "metrics.jsonl";

struct RoundMetrics {
  uint64_t round = 0;
  // When the row was written: Clock::WallMs, milliseconds since the Unix epoch (-1: unknown, the
  // row has no `time`).
  int64_t wall_ms = -1;
  uint64_t total_rounds = 0;
  int64_t clients_enrolled = 0;
  int64_t clients_sampled = 0;
  int64_t results = 0;        // updates folded into the model
  int64_t dropped = 0;        // sampled but no accepted result by the deadline (incl. rejected)
  int64_t rejected = 0;       // results refused by validation (shape, dtype, non-finite, ...)
  int64_t stale = 0;          // messages for another round (stragglers)
  int64_t malformed = 0;      // messages that failed to decode
  int64_t auth_rejected = 0;  // handshakes refused (unknown/revoked key) + identity refusals
  int64_t rate_limited = 0;   // messages dropped by the per-peer rate limit
  int64_t declined = 0;       // members whose own privacy policy refused the round
  int64_t failed = 0;         // members that reported their local training failed
  int64_t clipped = 0;        // accepted updates clipped to aggregation.max_update_norm
  int64_t weight_capped = 0;  // accepted updates whose example count was capped (max_weight_ratio)
  int64_t connections_cut = 0;  // connections the transport cut (undelivered bytes over bound)
  bool updated = false;         // quorum met and the model changed
  int64_t examples = 0;         // sum of the accepted results' example counts (-1: unknown, null)
  std::optional<double> train_loss;     // example-weighted mean over accepted results
  std::optional<double> test_accuracy;  // evaluation of the round's model, when due
  std::optional<double> test_loss;
  // Federated evaluation (evaluation.mode federated), when one ran after this round: test_accuracy
  // and test_loss are then the weighted means of the clients' accepted answers (null when none
  // was accepted).
  struct FederatedEval {
    int64_t asked = 0;          // clients sent the EvaluateInstruction
    int64_t answered = 0;       // answers accepted into the means
    int64_t rejected = 0;       // answers refused (wrong nonce or round, out of range, duplicate)
    int64_t declined = 0;       // clients that answered with an Error (cannot evaluate, or policy)
    int64_t weight = 0;         // sum of the accepted answers' weights (capped example counts)
    int64_t weight_capped = 0;  // accepted answers whose example count was capped
  };
  std::optional<FederatedEval> federated_eval;
  // Secure aggregation, when the round used it (aggregation/secagg/protocol.h): the session's
  // settings (what the configuration fixes: public) and what happened (operator-only under DP).
  struct SecureAggregation {
    int64_t members = 0;        // the cohort the session was planned for
    int threshold = 0;          // t
    double neighbours = 0;      // the graph's expected degree
    int64_t min_survivors = 0;  // m
    int bits = 0;
    int64_t consistency_quorum = 0;  // signatures over one survivor set before anyone unmasks
    int64_t honest_shares = 0;  // honest inputs in any sum it can unmask, the coordinator's count
    // What happened: the members listed (advertised keys), whose secrets enough others hold (U2),
    // that sent a masked input (S), that signed S, that answered the unmasking; complaints of
    // unreadable shares; members found lying (client id, what it did).
    int64_t listed = 0;
    int64_t shared = 0;
    int64_t masked = 0;
    int64_t signed_survivors = 0;
    int64_t answered = 0;
    int64_t complaints = 0;
    std::vector<std::pair<std::string, std::string>> blamed;
    int restarts = 0;       // sessions started again without members that did not reveal
    bool released = false;  // the sum was unmasked
    std::string failure;    // why it was not ("" when it was)
  };
  std::optional<SecureAggregation> secure_aggregation;
  // Buffered asynchronous training (async:): the row is one server step (flush), `round` its
  // number; clients_sampled counts the tasks dispatched while it was open, `results` the updates
  // it folded, `dropped` the tasks that ended without one (deadline, silence, refusal).
  struct Async {
    int64_t buffer = 0;         // K
    int64_t concurrency = 0;    // C
    int64_t in_flight = 0;      // tasks still training when it closed
    int64_t refused_stale = 0;  // results staler than max_staleness, refused
    double staleness_mean = 0;  // of the folded results (server steps since their model)
    int64_t staleness_max = 0;
    double discount_mean = 0;  // mean staleness factor s(tau) of the folded results
  };
  std::optional<Async> async;
  double duration_s = 0;
  // Each accepted upload's duration in seconds (the coordinator's clock), in the order they
  // completed: from the member's upload grant to its whole update received (a result folded, or
  // under secure aggregation a masked input accepted). One per member at most, so at most
  // clients_sampled. Operator-only, like duration_s: in operator_metrics.jsonl under DP (and in
  // metrics.jsonl without), never in PublicJson; rows carry the list (`upload_seconds`, for the
  // service's histogram) and its summary (`upload_s`: count, sum, p50, max).
  std::vector<double> upload_seconds;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  double elapsed_s = 0;  // since the job started (across resumes)
  // Under DP (privacy.mode central or local): the round's mechanism and the job's spend so far.
  struct Privacy {
    std::string mode;  // "central" | "local"
    // false (RoundPrivacy::NotPrivateBecause): `epsilon` is nominal and reported as null
    bool is_private = true;
    double epsilon = 0;  // spent after this round, at `delta`
    double delta = 0;
    std::optional<double> budget_epsilon;  // the total, when configured
    std::string accountant;                // "rdp" | "pld" | "analytic"
    double noise_multiplier = 0;           // z of this round
    double clip_norm = 0;                  // C of this round
    double noise_stddev = 0;   // of the noise added to the sum (central) or to each update
    int64_t within_clip = -1;  // updates whose norm was <= C (adaptive clipping; -1: n/a)
    std::optional<double> next_clip_norm;  // adaptive clipping: C for the next round
    double noise_seconds = 0;              // time to sample and add the noise (central)
  };
  std::optional<Privacy> privacy;

  // metrics.jsonl's line: every field without DP; under DP (privacy set) PublicJson().
  std::string ToJson() const;
  std::string PublicJson() const;
  // operator_metrics.jsonl's line under DP.
  std::string OperatorJson() const;
  // "round 3/20 | updates 10/10 | test acc 0.8312 loss 0.4710 | 1.24 s"
  std::string ProgressLine() const;
};

}  // namespace huddle::coordinator
