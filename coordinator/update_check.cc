#include "coordinator/update_check.h"

#include <algorithm>
#include <cmath>
#include <variant>

namespace huddle::coordinator {
namespace {

// The lower median: of an even count, the smaller middle value (the tighter bound).
double Median(std::vector<double> v) {
  auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

}  // namespace

StatusOr<std::vector<std::span<const float>>> CheckUpdate(const wire::Message& msg,
                                                          const UpdateExpectation& want) {
  const auto* result = std::get_if<wire::FitResult>(&msg.body);
  if (result == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a FitResult, got ", wire::MessageTypeName(msg.type())));
  }
  if (msg.round != want.round) {
    return absl::InvalidArgumentError(
        absl::StrCat("update is for round ", msg.round, "; round ", want.round, " is open"));
  }
  if (result->nonce != want.nonce) {
    return absl::InvalidArgumentError(
        absl::StrCat("update's nonce does not match the instruction this client was sent in round ",
                     want.round, " (a replayed or superseded result)"));
  }
  if (result->model_version != want.model_version) {
    return absl::InvalidArgumentError(absl::StrCat("update was computed from model version ",
                                                   result->model_version, "; round ", want.round,
                                                   " sent version ", want.model_version));
  }
  if (result->num_examples < 1 || result->num_examples > static_cast<uint64_t>(want.max_weight)) {
    return absl::InvalidArgumentError(absl::StrCat("num_examples ", result->num_examples,
                                                   " is outside [1, ", want.max_weight, "]"));
  }
  const ModelLayout& layout = *want.layout;
  if (msg.tensors.size() != layout.size()) {
    return absl::InvalidArgumentError(absl::StrCat("update has ", msg.tensors.size(),
                                                   " tensors; round ", want.round, " expects ",
                                                   layout.size()));
  }
  std::vector<std::span<const float>> spans;
  spans.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    const TensorSpec& got = msg.tensors[i].spec;
    const TensorSpec& expect = layout[i];
    if (got.name != expect.name || got.shape != expect.shape || got.dtype != expect.dtype ||
        msg.tensors[i].bytes.size() != static_cast<size_t>(expect.ByteLength())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " is '", got.name, "' ", ShapeString(got.shape), " ",
                       DTypeName(got.dtype), "; round ", want.round, " expects '", expect.name,
                       "' ", ShapeString(expect.shape), " ", DTypeName(expect.dtype)));
    }
    spans.push_back(msg.tensors[i].floats());
  }
  return spans;
}

Status CheckEvaluation(const wire::Message& msg, const EvaluationExpectation& want) {
  const auto* result = std::get_if<wire::EvaluateResult>(&msg.body);
  if (result == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected an EvaluateResult, got ", wire::MessageTypeName(msg.type())));
  }
  if (msg.round != want.round) {
    return absl::InvalidArgumentError(absl::StrCat(
        "evaluation is of round ", msg.round, "'s model; round ", want.round, "'s is evaluated"));
  }
  if (result->nonce != want.nonce) {
    return absl::InvalidArgumentError(absl::StrCat(
        "evaluation's nonce does not match the instruction this client was sent after round ",
        want.round, " (a replayed or forged answer)"));
  }
  if (result->model_version != want.model_version) {
    return absl::InvalidArgumentError(absl::StrCat("evaluation is of model version ",
                                                   result->model_version, "; version ",
                                                   want.model_version, " was sent"));
  }
  if (result->num_examples < 1 || result->num_examples > static_cast<uint64_t>(want.max_examples)) {
    return absl::InvalidArgumentError(absl::StrCat("num_examples ", result->num_examples,
                                                   " is outside [1, ", want.max_examples, "]"));
  }
  if (!(std::isfinite(result->loss) && result->loss >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", result->loss, " is not a finite value >= 0"));
  }
  if (!(result->accuracy >= 0 && result->accuracy <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("accuracy ", result->accuracy, " is outside [0, 1]"));
  }
  if (!msg.tensors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an evaluation carries no tensors; this one has ", msg.tensors.size()));
  }
  return absl::OkStatus();
}

void UpdateNormBound::StartRound(uint64_t round) {
  if (round == round_) return;
  round_ = round;
  if (this_round_.empty()) return;
  history_.insert(history_.end(), this_round_.begin(), this_round_.end());
  this_round_.clear();
  while (history_.size() > kWindow) history_.pop_front();
  history_median_ = Median({history_.begin(), history_.end()});
}

double UpdateNormBound::BoundFor(uint64_t round, double norm) {
  if (fixed_ > 0) return fixed_;
  if (!(factor_ > 0)) return 0;
  StartRound(round);
  if (!history_.empty()) return factor_ * history_median_;
  if (this_round_.size() + 1 < kMinKnown || !(std::isfinite(norm) && norm > 0)) return 0;
  std::vector<double> known = this_round_;
  known.push_back(norm);
  return factor_ * Median(std::move(known));
}

void UpdateNormBound::Accepted(uint64_t round, double norm) {
  if (fixed_ > 0 || !(factor_ > 0) || !(std::isfinite(norm) && norm > 0)) return;
  StartRound(round);
  this_round_.push_back(norm);
}

}  // namespace huddle::coordinator
