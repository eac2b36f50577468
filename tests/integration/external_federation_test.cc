// An external model end to end, in one process: the real coordinator and real client agents over
// the in-process transport, each agent driving a user's trainer (huddle/client/trainer.h) of a
// network Huddle does not know. The clients' models are averaged by name and shape into the global
// model, and the clients that can evaluate it do so between rounds (federated evaluation); the one
// that cannot declines, and the means are of the others' answers.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "client/agent.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "coordinator/coordinator.h"
#include "tests/testing/temp_dir.h"
#include "transport/inproc_transport.h"

namespace huddle {
namespace {

// A "network" of two tensors; training adds `shift` to every value, evaluation reports the loss
// |w[0] - 1| on `n` examples.
class ShiftTrainer final : public client::Trainer {
 public:
  ShiftTrainer(float shift, int64_t n, bool can_evaluate)
      : shift_(shift), n_(n), can_evaluate_(can_evaluate) {}
  int64_t num_examples() const override { return n_; }
  void Start(const client::JobInfo& job) override {
    if (job.model_kind != "external" || job.tensors.size() != 2) {
      throw std::runtime_error("not my network");
    }
  }
  client::FitResult Fit(const client::NamedTensors& global, const client::FitConfig&) override {
    client::FitResult r;
    r.tensors = global;
    for (client::NamedTensor& t : r.tensors) {
      for (float& v : t.values) v += shift_;
    }
    r.num_examples = n_;
    r.metrics["loss"] = 0.5;
    return r;
  }
  bool can_evaluate() const override { return can_evaluate_; }
  client::EvaluateResult Evaluate(const client::NamedTensors& model) override {
    const double loss = std::abs(model[0].values[0] - 1.0);
    return {n_, loss, 1.0 / (1.0 + loss)};
  }

 private:
  float shift_;
  int64_t n_;
  bool can_evaluate_;
};

class AgentPeer final : public transport::InProcPeer {
 public:
  AgentPeer(std::string id, std::unique_ptr<client::Trainer> trainer)
      : trainer_(std::move(trainer)), agent_(std::move(id), trainer_.get(), false) {}
  std::vector<wire::Message> OnStart() override { return {agent_.MakeJoin()}; }
  StatusOr<std::vector<wire::Message>> OnMessage(const wire::Message& msg) override {
    return agent_.Handle(msg);
  }

 private:
  std::unique_ptr<client::Trainer> trainer_;
  client::ClientAgent agent_;
};

TEST(ExternalFederationTest, UserTrainersTrainAndEvaluateAnExternalModel) {
  const ModelLayout layout = {{"encoder/kernel:0", DType::kFloat32, {3, 2}},
                              {"logit_scale", DType::kFloat32, {}}};
  TensorList initial;
  for (const TensorSpec& s : layout) initial.emplace_back(s.name, s.shape);

  // (shift, examples, can evaluate)
  const std::vector<std::tuple<float, int64_t, bool>> sites = {
      {0.1f, 100, true}, {0.2f, 300, true}, {0.4f, 100, false}};
  std::vector<std::unique_ptr<AgentPeer>> peers;
  std::vector<transport::InProcPeer*> raw;
  for (size_t i = 0; i < sites.size(); ++i) {
    const auto [shift, n, evaluates] = sites[i];
    peers.push_back(std::make_unique<AgentPeer>(
        "site-" + std::to_string(i), std::make_unique<ShiftTrainer>(shift, n, evaluates)));
    raw.push_back(peers.back().get());
  }
  transport::InProcServerTransport transport(raw, 2);
  transport.Start();

  coordinator::CoordinatorOptions o;
  o.job_name = "external-e2e";
  o.rounds = 3;
  o.model = models::ModelSpec::External(layout);
  o.initial_model = std::make_shared<const TensorList>(initial);
  o.cohort.size = 3;
  o.min_clients = 3;
  o.client_timeout_ms = 0;
  o.wait_for_clients_ms = 30'000;
  o.round_deadline_ms = 30'000;
  o.eval_mode = coordinator::CoordinatorOptions::EvalMode::kFederated;
  o.federated_eval.clients = 3;
  o.federated_eval.deadline_ms = 30'000;
  const testing::ScopedTempDir out("external_e2e", /*create=*/false);
  o.out_dir = out.path();
  std::vector<coordinator::RoundMetrics> metrics;
  coordinator::Coordinator coord(o, &transport, SteadyClock::Get(), {},
                                 [&](const coordinator::RoundMetrics& m) { metrics.push_back(m); });
  const Status st = coord.Run();
  ASSERT_TRUE(st.ok()) << st;

  // Every round: the example-weighted mean shift, (0.1 * 100 + 0.2 * 300 + 0.4 * 100) / 500.
  const double step = (0.1 * 100 + 0.2 * 300 + 0.4 * 100) / 500;
  ASSERT_EQ(metrics.size(), 3u);
  for (size_t r = 0; r < metrics.size(); ++r) {
    SCOPED_TRACE(r + 1);
    EXPECT_EQ(metrics[r].results, 3);
    ASSERT_TRUE(metrics[r].federated_eval.has_value());
    EXPECT_EQ(metrics[r].federated_eval->asked, 3);
    EXPECT_EQ(metrics[r].federated_eval->answered, 2);
    EXPECT_EQ(metrics[r].federated_eval->declined, 1) << "site-2's trainer cannot evaluate";
    ASSERT_TRUE(metrics[r].test_loss.has_value());
    const double w0 = step * static_cast<double>(r + 1);
    EXPECT_NEAR(*metrics[r].test_loss, std::abs(w0 - 1.0), 1e-5);
  }
  ASSERT_EQ(LayoutOf(coord.model()), layout);
  for (const Tensor& t : coord.model()) {
    for (float v : t.data) EXPECT_NEAR(v, 3 * step, 1e-5) << t.name();
  }
  const auto summary = nlohmann::json::parse(ReadFile(o.out_dir + "/summary.json").value());
  EXPECT_EQ(summary["evaluation"]["mode"], "federated");
  EXPECT_NEAR(summary["final_test_loss"].get<double>(), std::abs(3 * step - 1.0), 1e-5);
}

}  // namespace
}  // namespace huddle
