// The agent's answer to an EvaluateInstruction (federated evaluation, client/agent_evaluate.cc):
// the built-in trainer's evaluation, echoing the instruction's nonce and model version; a user's
// trainer (an external model) that can, cannot, fails or misreports; a client whose privacy policy
// reports nothing; a model that is not the job's.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "client/agent.h"
#include "common/rng.h"
#include "models/wire_spec.h"

namespace huddle::client {
namespace {

const std::string kNonce(wire::kNonceBytes, 'e');

wire::Message Instruction(uint64_t round, uint64_t version, const TensorList& model) {
  wire::Message m = wire::MakeMessage(wire::EvaluateInstruction{version, kNonce, 30000}, round);
  for (const Tensor& t : model) m.tensors.push_back(wire::TensorPayload::CopyOf(t));
  return m;
}

// The single Error among `replies`: its code and text.
std::pair<wire::ErrorCode, std::string> ErrorOf(
    const StatusOr<std::vector<wire::Message>>& replies) {
  EXPECT_TRUE(replies.ok()) << replies.status();
  EXPECT_EQ(replies->size(), 1u);
  if (!replies.ok() || replies->size() != 1 || (*replies)[0].type() != wire::MessageType::kError) {
    ADD_FAILURE() << "expected one Error";
    return {wire::ErrorCode::kUnspecified, ""};
  }
  const auto& e = std::get<wire::Error>((*replies)[0].body);
  return {e.code, e.message};
}

TEST(AgentEvaluateTest, TheBuiltInTrainerEvaluatesTheInstructionsModel) {
  data::Dataset data;
  data.feature_dim = 6;
  data.num_classes = 3;
  Rng rng(4);
  for (int i = 0; i < 48; ++i) {
    for (int f = 0; f < 6; ++f) data.features.push_back(static_cast<float>(rng.Uniform()));
    data.labels.push_back(i % 3);
  }
  const data::DatasetView view{&data, {}};
  const models::MlpSpec spec{6, {4}, 3};
  ClientAgent agent("edge-1", &view);
  ASSERT_TRUE(
      agent.Handle(wire::MakeMessage(wire::Welcome{"job", models::ModelSpecToWire(spec), 500}))
          .ok());
  const TensorList model = models::InitModel(spec, 8);
  auto replies = agent.Handle(Instruction(4, 3, model));
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 1u);
  const wire::Message& answer = (*replies)[0];
  ASSERT_EQ(answer.type(), wire::MessageType::kEvaluateResult);
  EXPECT_EQ(answer.round, 4u);
  EXPECT_TRUE(answer.tensors.empty());
  const auto& r = std::get<wire::EvaluateResult>(answer.body);
  EXPECT_EQ(r.nonce, kNonce);
  EXPECT_EQ(r.model_version, 3u);
  EXPECT_EQ(r.num_examples, 48u);
  const StatusOr<models::EvalStats> want = models::EvaluateModel(spec, model, view);
  ASSERT_TRUE(want.ok());
  EXPECT_DOUBLE_EQ(r.loss, want->loss);
  EXPECT_DOUBLE_EQ(r.accuracy, want->accuracy);
}

// A user's trainer of an external model, scripted.
class ScriptedTrainer final : public Trainer {
 public:
  int64_t num_examples() const override { return 30; }
  FitResult Fit(const NamedTensors& global, const FitConfig&) override {
    FitResult r;
    r.tensors = global;
    r.num_examples = 30;
    return r;
  }
  bool can_evaluate() const override { return can_evaluate_; }
  EvaluateResult Evaluate(const NamedTensors& model) override {
    seen_ = model;
    if (throws_) throw std::runtime_error("CUDA out of memory");
    return result_;
  }

  bool can_evaluate_ = true;
  bool throws_ = false;
  EvaluateResult result_{30, 0.25, 0.75};
  NamedTensors seen_;
};

class ExternalAgentEvaluateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = {{"encoder.weight", DType::kFloat32, {3, 2}}, {"scale", DType::kFloat32, {}}};
    ASSERT_TRUE(
        agent_
            .Handle(wire::MakeMessage(wire::Welcome{
                "torch-job", models::ModelSpecToWire(models::ModelSpec::External(layout_)), 500}))
            .ok());
    for (const TensorSpec& s : layout_) model_.emplace_back(s.name, s.shape);
    model_[1].data[0] = 2.5f;
  }

  ModelLayout layout_;
  TensorList model_;
  ScriptedTrainer trainer_;
  ClientAgent agent_{"site-a", &trainer_};
};

TEST_F(ExternalAgentEvaluateTest, AnswersWithTheTrainersEvaluation) {
  auto replies = agent_.Handle(Instruction(2, 2, model_));
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 1u);
  const auto& r = std::get<wire::EvaluateResult>((*replies)[0].body);
  EXPECT_EQ(r.num_examples, 30u);
  EXPECT_EQ(r.loss, 0.25);
  EXPECT_EQ(r.accuracy, 0.75);
  ASSERT_EQ(trainer_.seen_.size(), 2u);
  EXPECT_EQ(trainer_.seen_[1].name, "scale");
  EXPECT_EQ(trainer_.seen_[1].values, std::vector<float>{2.5f});
}

TEST_F(ExternalAgentEvaluateTest, ATrainerThatCannotEvaluateDeclines) {
  trainer_.can_evaluate_ = false;
  const auto [code, text] = ErrorOf(agent_.Handle(Instruction(2, 2, model_)));
  EXPECT_EQ(code, wire::ErrorCode::kRejected);
  EXPECT_NE(text.find("cannot evaluate"), std::string::npos) << text;
  EXPECT_TRUE(trainer_.seen_.empty());
}

TEST_F(ExternalAgentEvaluateTest, AFailedEvaluationIsAnInternalError) {
  trainer_.throws_ = true;
  const auto [code, text] = ErrorOf(agent_.Handle(Instruction(2, 2, model_)));
  EXPECT_EQ(code, wire::ErrorCode::kInternal);
  EXPECT_EQ(text, "evaluation failed: CUDA out of memory");
}

TEST_F(ExternalAgentEvaluateTest, AnEvaluationTheCoordinatorWouldRefuseIsNotSent) {
  trainer_.result_ = {30, 0.25, 7.0};
  auto [code, text] = ErrorOf(agent_.Handle(Instruction(2, 2, model_)));
  EXPECT_EQ(code, wire::ErrorCode::kInternal);
  EXPECT_NE(text.find("accuracy 7 (in [0, 1])"), std::string::npos) << text;
  trainer_.result_ = {0, 0.25, 0.5};
  std::tie(code, text) = ErrorOf(agent_.Handle(Instruction(2, 2, model_)));
  EXPECT_EQ(code, wire::ErrorCode::kInternal);
}

TEST_F(ExternalAgentEvaluateTest, AModelThatIsNotTheJobsIsRefused) {
  TensorList wrong = model_;
  wrong[0] = Tensor("encoder.weight", {2, 3});
  const auto [code, text] = ErrorOf(agent_.Handle(Instruction(2, 2, wrong)));
  EXPECT_EQ(code, wire::ErrorCode::kRejected);
  EXPECT_NE(text.find("not the job's"), std::string::npos) << text;
  EXPECT_TRUE(trainer_.seen_.empty());
}

TEST_F(ExternalAgentEvaluateTest, AClientWithAPrivacyPolicyReportsNothing) {
  ClientPrivacyPolicy policy;
  policy.local = LocalDpPolicy{};
  StatusOr<PrivacyGuard> guard = PrivacyGuard::Open(policy);
  ASSERT_TRUE(guard.ok()) << guard.status();
  agent_.set_privacy_guard(*std::move(guard));
  const auto [code, text] = ErrorOf(agent_.Handle(Instruction(2, 2, model_)));
  EXPECT_EQ(code, wire::ErrorCode::kRejected);
  EXPECT_NE(text.find("privacy policy forbids"), std::string::npos) << text;
  EXPECT_TRUE(trainer_.seen_.empty());
}

TEST(AgentEvaluateBeforeWelcomeTest, RejoinsFirst) {
  ScriptedTrainer trainer;
  ClientAgent agent("site-b", &trainer);
  auto replies = agent.Handle(Instruction(1, 0, {}));
  ASSERT_TRUE(replies.ok());
  ASSERT_EQ(replies->size(), 1u);
  EXPECT_EQ((*replies)[0].type(), wire::MessageType::kJoin);
}

}  // namespace
}  // namespace huddle::client
