// Structural validation of a client's FitResult against what the open round expects.
//
// The codec has already checked the message's own consistency (frame sizes, spec syntax, nonce
// length). This checks it against the round: the nonce of the instruction it answers, the model
// version it was computed from, the example count range, and tensor count, names, shapes and dtypes
// equal to the model's. Values (finite, bounded) are checked by the aggregator while it folds, so
// they are read once. Shared by the coordinator and the fuzz target (fuzz/).
//
// Thread-safety: stateless.
#pragma once

#include <cstdint>
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

}  // namespace huddle::coordinator
