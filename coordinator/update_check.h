// Structural validation of a client's FitResult against what the open round expects.
//
// The codec has already checked the message's own consistency (frame sizes, spec syntax, nonce
// length). This checks it against the round: the nonce of the instruction it answers, the model
// version it was computed from, the example count range, and tensor count, names, shapes and dtypes
// equal to the model's. Values (finite, bounded) are checked by the aggregator while it folds, so
// they are read once. Shared by the coordinator and the fuzz target (fuzz/).
// UpdateNormBound decides the L2 norm each plain FedAvg update is clipped to.
//
// Thread-safety: the functions are stateless; an UpdateNormBound is used by one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "proto/messages.h"

namespace huddle::coordinator {

struct UpdateExpectation {
  uint64_t round = 0;
  uint64_t model_version = 0;
  std::string nonce;       // of the FitInstruction this client was sent this round
  int64_t max_weight = 0;  // num_examples must lie in [1, max_weight]
  const ModelLayout* layout = nullptr;
};

// The update's tensors as float spans in layout order, or InvalidArgument naming the first field
// that differs from `want` (both values shown).
StatusOr<std::vector<std::span<const float>>> CheckUpdate(const wire::Message& msg,
                                                          const UpdateExpectation& want);

// What an EvaluateResult (federated evaluation) must answer.
struct EvaluationExpectation {
  uint64_t round = 0;  // whose model was sent
  uint64_t model_version = 0;
  std::string nonce;         // of the EvaluateInstruction this client was sent
  int64_t max_examples = 0;  // num_examples must lie in [1, max_examples]
};

// OK, or InvalidArgument naming the first field of the EvaluateResult that differs from `want` or
// lies out of range: round, nonce, model version, num_examples, loss (finite, >= 0), accuracy
// (in [0, 1]), no tensors. The codec has already checked the nonce's length and that the doubles
// are finite; this checks again, so that nothing depends on which transport delivered it.
Status CheckEvaluation(const wire::Message& msg, const EvaluationExpectation& want);

// Norm-bounded aggregation in plain federated averaging (no DP, no secure aggregation): the L2
// norm a client's delta is scaled down to before it is folded (aggregation.max_update_norm).
//
//  - fixed (fixed > 0): every update is clipped to `fixed`.
//  - auto (fixed == 0, factor > 0; the default): `factor` times the median norm of the updates
//    accepted in previous rounds (the last kWindow of them), so one update far longer than its
//    peers' weighs at most `factor` typical updates, with nothing to tune. Before any round has
//    accepted an update (round 1, or the first round after a resume: the window is not
//    checkpointed) the median is of this round's accepted norms and the update's own, once at
//    least kMinKnown are known; the first kMinKnown - 1 updates of such a round are not clipped
//    (the aggregator folds as it receives, so it cannot wait for later norms). Residual: an
//    update among those first ones is bounded only by aggregation.max_update_abs per value.
//  - off (fixed == 0, factor == 0).
//
// Norms of 0 and non-finite norms are not recorded (the aggregator refuses non-finite values).
// Under DP the clip norm bounds every update, and under secure aggregation the coordinator never
// sees an update's norm (clients clip to a fixed max_update_norm): neither uses this.
class UpdateNormBound {
 public:
  static constexpr size_t kWindow = 256;  // previous rounds' accepted norms the median is over
  static constexpr size_t kMinKnown = 3;  // norms known before a round without history clips

  UpdateNormBound(double fixed, double factor) : fixed_(fixed), factor_(factor) {}

  bool enabled() const { return fixed_ > 0 || factor_ > 0; }

  // The norm an update of `round` whose L2 norm is `norm` is clipped to if longer; 0: none yet.
  // Rounds are numbered upwards; a new number closes the previous round's norms into history.
  double BoundFor(uint64_t round, double norm);

  // An update of `round` with L2 norm `norm` (before any clipping) was folded.
  void Accepted(uint64_t round, double norm);

 private:
  void StartRound(uint64_t round);

  double fixed_;
  double factor_;
  uint64_t round_ = 0;
  std::deque<double> history_;      // accepted norms of previous rounds, oldest first
  double history_median_ = 0;       // of history_, 0 when empty
  std::vector<double> this_round_;  // accepted norms of round_
};

}  // namespace huddle::coordinator
