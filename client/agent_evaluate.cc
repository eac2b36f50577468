// Federated evaluation on the client (docs/protocol.md, "Federated evaluation"): the agent's
// answer to an EvaluateInstruction. The coordinator asks between rounds; the client evaluates the
// instruction's model with its trainer on its own data and reports the example count, mean loss
// and accuracy, or declines with an Error.
#include <spdlog/spdlog.h>

#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "client/agent.h"

namespace huddle::client {
std::vector<wire::Message> ClientAgent::OnEvaluate(const wire::Message& msg,
                                                   const wire::EvaluateInstruction& evaluate) {
  auto refuse = [&](wire::ErrorCode code, std::string why) {
    spdlog::warn("round {}: federated evaluation: {}", msg.round, why);
    return std::vector<wire::Message>{wire::MakeError(code, std::move(why), msg.round)};
  };
  if (!model_) {
    spdlog::warn("round {}: evaluate instruction before welcome; rejoining", msg.round);
    return {MakeJoin()};
  }
  TensorList model = wire::ToTensors(msg.tensors);
  if (Status st = models::CheckParams(*model_, model); !st.ok()) {
    return refuse(wire::ErrorCode::kRejected,
                  absl::StrCat("the model to evaluate is not the job's: ", st.message()));
  }
  if (!trainer_->can_evaluate()) {
    return refuse(wire::ErrorCode::kRejected,
                  "this client's trainer cannot evaluate (its can_evaluate() is false)");
  }
  if (guard_.reports_nothing()) {
    // A loss and an accuracy computed from the client's data, sent without noise, are exactly
    // what a client with a privacy policy never reports (as in its Join and FitResult).
    return refuse(wire::ErrorCode::kRejected,
                  "this client's privacy policy forbids reporting metrics computed from its data "
                  "without noise");
  }
  EvaluateResult result;
  try {
    result = trainer_->Evaluate(ToNamedTensors(model));
  } catch (const std::exception& e) {
    return refuse(wire::ErrorCode::kInternal, absl::StrCat("evaluation failed: ", e.what()));
  } catch (...) {
    return refuse(wire::ErrorCode::kInternal, "evaluation failed: a non-standard exception");
  }
  // What the coordinator would refuse is not sent: the trainer's mistake, said as one.
  if (result.num_examples < 1 || !(std::isfinite(result.loss) && result.loss >= 0) ||
      !(result.accuracy >= 0 && result.accuracy <= 1)) {
    return refuse(wire::ErrorCode::kInternal,
                  absl::StrCat("the trainer's evaluation is invalid: ", result.num_examples,
                               " examples (at least 1), loss ", result.loss,
                               " (finite, >= 0), accuracy ", result.accuracy, " (in [0, 1])"));
  }
  spdlog::log(routine_level_,
              "round {}: evaluated model version {}: loss {:.4f}, accuracy {:.4f} on {} examples",
              msg.round, evaluate.model_version, result.loss, result.accuracy, result.num_examples);
  wire::EvaluateResult answer;
  answer.num_examples = static_cast<uint64_t>(result.num_examples);
  answer.loss = result.loss;
  answer.accuracy = result.accuracy;
  answer.model_version = evaluate.model_version;
  answer.nonce = evaluate.nonce;
  return {wire::MakeMessage(std::move(answer), msg.round, client_id_)};
}

}  // namespace huddle::client
