// Federated evaluation: the clients evaluate the global model on their own data, for a model the
// coordinator cannot evaluate (an external one: only its tensors are known) or a job without test
// data on the server (`evaluation: {mode: federated}`).
//
// It runs between rounds, inside FinishRound after the round's update and before its metrics line
// and checkpoint, so the round's metrics carry its result and no training message is in flight:
//   1. Sample up to federated_eval.clients live clients with a stream of the job seed derived for
//      this round (reproducible, and resumes exactly without any state in the checkpoint).
//   2. Send each an EvaluateInstruction (model version, a fresh nonce, the time left) with the
//      global model as tensor frames, from one shared copy.
//   3. Pump messages until every asked client has answered or failed, or the evaluation's own
//      deadline (federated_eval.deadline_ms) passes; then the next round starts. An answer is
//      hostile input: CheckEvaluation (update_check.h) checks its round, nonce, model version,
//      example count, loss and accuracy, and a loss above kMaxEvaluationLoss is refused too (both
//      logged naming the client); one answer per client; an Error answer (the client's
//      trainer cannot evaluate, its privacy policy forbids reporting, or its evaluation failed)
//      or a malformed message fails it for the evaluation; so does going silent.
//   4. Weighted means of the accepted answers' loss and accuracy, each answer weighing its example
//      count capped at max_weight_ratio x the lower median of the answers' counts: one liar cannot
//      dominate (docs/security.md says what it can still do). Every value is bounded on receipt,
//      so no sum can overflow and the checkpoint holds only values it can read back. No answer:
//      a warning, null values, and the job summary says so.
// Late answers (after the deadline) are refused as stale, as a straggler's result is.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/secure_random.h"
#include "coordinator/coordinator.h"
#include "coordinator/update_check.h"

namespace huddle::coordinator {
namespace {

constexpr uint64_t kEvalStream = 0x6576616c;  // "eval"

// The largest loss an answer may report. A mean cross-entropy computed from float32 outputs stays
// below 1e39, so no honest answer is refused; a liar's DBL_MAX would overflow the weighted sum to
// inf. Bounded so, with weights <= aggregation.max_weight <= 2^53 and fewer than 2^32 answers (one
// per enrolled client), the sums of weight x loss stay finite, and so does the mean.
constexpr double kMaxEvaluationLoss = 1e100;
static_assert(kMaxEvaluationLoss * 0x1p53 * 0x1p32 < std::numeric_limits<double>::max());

// Bounds CheckEvaluation (update_check.h) leaves open.
Status CheckEvaluationBounds(const wire::EvaluateResult& result) {
  if (!(result.loss <= kMaxEvaluationLoss)) {
    return absl::InvalidArgumentError(absl::StrCat("loss ", result.loss, " exceeds ",
                                                   kMaxEvaluationLoss,
                                                   ", the most an evaluation may report"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> Coordinator::SampleEvaluators(uint64_t round) const {
  std::vector<std::string> live = population_.LiveIds();
  Rng rng(DeriveSeed(options_.seed, kEvalStream, round));
  rng.Shuffle(live);
  const size_t n = std::min(live.size(), static_cast<size_t>(options_.federated_eval.clients));
  std::vector<std::string> chosen(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(n));
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

Status Coordinator::FederatedEvaluate(uint64_t round, RoundMetrics* metrics) {
  const int64_t start_ms = clock_->NowMs();
  eval_ = EvalRun{};
  EvalRun& eval = *eval_;
  eval.round = round;
  eval.model_version = model_version_;
  eval.deadline_ms = start_ms + options_.federated_eval.deadline_ms;

  // 1-2.
  auto global = std::make_shared<const TensorList>(model_);
  for (const std::string& id : SampleEvaluators(round)) {
    wire::EvaluateInstruction instruction;
    instruction.model_version = model_version_;
    instruction.nonce = SecureRandomBytes(wire::kNonceBytes);
    instruction.deadline_ms = static_cast<uint32_t>(options_.federated_eval.deadline_ms);
    eval.nonces[id] = instruction.nonce;
    eval.members[id] = EvalState::kPending;
    eval.metrics.asked++;
    wire::Message msg = wire::MakeMessage(std::move(instruction), round, "coordinator");
    msg.tensors = wire::ShareAll(global);
    if (Status st = transport_->Send(population_.PeerOf(id), msg); !st.ok()) {
      FailEvaluator(id, "is unreachable for its evaluation instruction");
    }
  }

  // 3.
  auto pending = [&] {
    return std::any_of(eval.members.begin(), eval.members.end(),
                       [](const auto& m) { return m.second == EvalState::kPending; });
  };
  while (pending()) {
    const int64_t now = clock_->NowMs();
    if (now >= eval.deadline_ms) {
      for (auto& [id, state] : eval.members) {
        if (state == EvalState::kPending) {
          Warn("evaluations not answered in time", id, [&, &who = id] {
            return absl::StrCat("round ", round, ": client ", who,
                                " did not answer the federated evaluation in time");
          });
          state = EvalState::kFailed;
        }
      }
      break;
    }
    Pump(std::min<int64_t>(100, eval.deadline_ms - now));
    for (const auto& [id, state] : eval.members) {
      if (state != EvalState::kPending) continue;
      if (population_.Find(id) == nullptr) {
        FailEvaluator(id, "left the federation while evaluating");
      } else if (!population_.Alive(id)) {
        FailEvaluator(id, "went silent (client_timeout) while evaluating");
      }
    }
  }

  // 4. Sorted by client id (a map), so the sums are the same whatever the arrival order.
  RoundMetrics::FederatedEval& f = eval.metrics;
  std::vector<uint64_t> counts;
  for (const auto& [id, a] : eval.answers) counts.push_back(a.examples);
  ++summary_.federated_evaluations;
  evaluated_version_ = model_version_;
  if (counts.empty()) {
    spdlog::warn(
        "round {}: federated evaluation had no answers ({} clients asked, {} declined, {} "
        "refused); the model's accuracy after this round is unknown",
        round, f.asked, f.declined, f.rejected);
    ++summary_.evaluations_without_answers;
    summary_.final_evaluation_unanswered = true;
    summary_.final_test_accuracy.reset();
    summary_.final_test_loss.reset();
    metrics->federated_eval = f;
    eval_.reset();
    return absl::OkStatus();
  }
  std::sort(counts.begin(), counts.end());
  const double median = static_cast<double>(counts[(counts.size() - 1) / 2]);
  const double cap_d = std::max(1.0, options_.federated_eval.max_weight_ratio * median);
  const uint64_t cap = static_cast<uint64_t>(std::min(cap_d, 9e15));
  // Each term is bounded on receipt (weight <= 2^53, loss <= kMaxEvaluationLoss, accuracy in
  // [0, 1]): no sum overflows. The reported weight total saturates rather than wrap.
  double loss = 0, accuracy = 0, weight = 0;
  for (const auto& [id, a] : eval.answers) {
    const uint64_t w = std::min(a.examples, cap);
    if (w < a.examples) f.weight_capped++;
    loss += static_cast<double>(w) * a.loss;
    accuracy += static_cast<double>(w) * a.accuracy;
    weight += static_cast<double>(w);
    constexpr int64_t kMaxWeight = std::numeric_limits<int64_t>::max();
    f.weight = w > static_cast<uint64_t>(kMaxWeight - f.weight)
                   ? kMaxWeight
                   : f.weight + static_cast<int64_t>(w);
  }
  metrics->test_loss = loss / weight;
  metrics->test_accuracy = std::clamp(accuracy / weight, 0.0, 1.0);
  metrics->federated_eval = f;
  summary_.final_evaluation_unanswered = false;
  summary_.final_test_accuracy = metrics->test_accuracy;
  summary_.final_test_loss = metrics->test_loss;
  if (!summary_.best_test_accuracy || *metrics->test_accuracy > *summary_.best_test_accuracy) {
    summary_.best_test_accuracy = metrics->test_accuracy;
    summary_.best_round = round;
  }
  eval_.reset();
  return absl::OkStatus();
}

bool Coordinator::EvaluationPending(const std::string& id) const {
  if (!eval_) return false;
  auto m = eval_->members.find(id);
  return m != eval_->members.end() && m->second == EvalState::kPending;
}

void Coordinator::FailEvaluator(const std::string& id, const char* why) {
  if (!EvaluationPending(id)) return;
  eval_->members[id] = EvalState::kFailed;
  Warn("failed evaluations", id,
       [&] { return absl::StrCat("round ", eval_->round, ": client ", id, " ", why); });
}

void Coordinator::OnEvaluateResult(const std::string& id, const wire::Message& msg) {
  const transport::PeerId peer = population_.PeerOf(id);
  if (!eval_ || msg.round != eval_->round) {
    // After its evaluation closed (a straggler), or for another round's model.
    CountStale();
    Warn("evaluations after their evaluation closed", id, [&] {
      return absl::StrCat("client ", id, ": evaluation of round ", msg.round,
                          "'s model arrived when no evaluation of it is open");
    });
    Refuse(peer, wire::ErrorCode::kWrongRound,
           absl::StrCat("no evaluation of round ", msg.round, "'s model is open"), msg.round);
    return;
  }
  EvalRun& eval = *eval_;
  if (!EvaluationPending(id)) {
    // Not asked, or already answered or failed: one answer per client.
    eval.metrics.rejected++;
    Warn("unsolicited or repeated evaluations", id, [&] {
      return absl::StrCat("client ", id, ": unsolicited or repeated evaluation of round ",
                          eval.round, "'s model");
    });
    Refuse(
        peer, wire::ErrorCode::kRejected,
        absl::StrCat("client ", id, " has no pending evaluation of round ", eval.round, "'s model"),
        msg.round);
    return;
  }
  EvaluationExpectation want;
  want.round = eval.round;
  want.model_version = eval.model_version;
  want.nonce = eval.nonces[id];
  want.max_examples = options_.aggregation.max_weight;
  Status st = CheckEvaluation(msg, want);
  if (st.ok()) st = CheckEvaluationBounds(std::get<wire::EvaluateResult>(msg.body));
  if (!st.ok()) {
    eval.metrics.rejected++;
    eval.members[id] = EvalState::kFailed;
    Warn("refused evaluations", id, [&] {
      return absl::StrCat("client ", id, ": round ", eval.round,
                          ": evaluation refused: ", st.message());
    });
    Refuse(peer, wire::ErrorCode::kRejected, std::string(st.message()), msg.round);
    return;
  }
  const auto& result = std::get<wire::EvaluateResult>(msg.body);
  eval.answers[id] = EvalAnswer{result.num_examples, result.loss, result.accuracy};
  eval.members[id] = EvalState::kAnswered;
  eval.metrics.answered++;
}

void Coordinator::OnEvaluateError(const std::string& id, const wire::Message& msg) {
  const auto& err = std::get<wire::Error>(msg.body);
  eval_->metrics.declined++;
  constexpr size_t kMaxText = 300;
  const std::string text =
      err.message.size() > kMaxText ? err.message.substr(0, kMaxText) + "..." : err.message;
  Warn("evaluations declined or failed", id, [&] {
    return absl::StrCat("round ", eval_->round, ": client ", id, " ",
                        err.code == wire::ErrorCode::kRejected ? "declined" : "could not run",
                        " the federated evaluation (", wire::ErrorCodeName(err.code), "): ", text);
  });
  eval_->members[id] = EvalState::kFailed;
}

}  // namespace huddle::coordinator
