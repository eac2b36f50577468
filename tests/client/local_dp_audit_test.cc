// An empirical privacy audit of client-level local DP through the real client agent, with the power
// to catch a client that adds HALF the noise std its accounting states.
//
// A ClientAgent drives a trainer whose update is known: the canary, +C or -C along the first
// coordinate and 0 elsewhere. That pair is the worst case under the client ledger's replace-one
// adjacency (the update swapped for its opposite: sensitivity 2C); a zero neighbour would use half
// of it, and a factor-2 accounting error would hide behind it. One FitInstruction in local DP mode
// per round (C = 1, z = 4; the release id includes the round, so each round is a fresh draw); each
// release is read from the FitResult that answers the UploadGrant. The agent clips the update,
// adds exact discrete Gaussian noise on its grid (privacy::NoiseGridFor,
// privacy::AddDiscreteGaussianNoise) from a seeded noise source, and accounts the release in its
// privacy guard: one release, analytic Gaussian at z/2 (replace-one), epsilon 1.993 at delta 1e-5
// (mu = 2/z = 0.5), is the claim audited. Each released coordinate minus the update, divided by
// the stated std z C, is the noise: N(0, 1) for a release that keeps its claim; the first
// coordinate moves by 2/z = 0.5 between the worlds. 2,000 rounds of each world (48 coordinates
// each) feed the three checks of tests/privacy/audit_stats.h:
//   (a) the threshold attack (1,000 + 1,000 runs): 0.04 true, 0.47 at half the std: it cannot
//       see a factor 2, only gross errors;
//   (b) the noise scale over 192,000 values, one-sided chi-square at 1e-7 (critical variance ratio
//       0.983): 1.004 true (p 0.90), 0.249 at half the std (p 10^-26,642); a half-std client
//       passes with probability 10^-65,201;
//   (c) the Gaussian loss: epsilon >= 0.99 true; at half the std mu = 1 (epsilon 4.38), the bound
//       reads 3.47 and misses the refutation with probability < 1e-11.
// False alarm <= 5e-7 on the true mechanism. The half-std client is the same agent told z/2 in its
// instructions, audited against the claim of z; (b) and (c) must both refute it. The noise sources
// are seeded: the figures above are the same on every run. ~0.5 s.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <vector>

#include "client/agent.h"
#include "models/wire_spec.h"
#include "tests/privacy/audit_expect.h"

namespace huddle::client {
namespace {

namespace audit = huddle::testing::audit;

constexpr double kClip = 1.0;
constexpr double kZ = 4;  // the stated noise multiplier
constexpr double kDelta = 1e-5;
constexpr int kRuns = 2000;  // rounds per world

// A trainer whose update (a delta) is `value` in the first coordinate and 0 elsewhere.
class CanaryTrainer final : public Trainer {
 public:
  explicit CanaryTrainer(float value) : value_(value) {}
  int64_t num_examples() const override { return 1; }
  FitResult Fit(const NamedTensors& global, const FitConfig&) override {
    FitResult r;
    r.is_delta = true;
    r.num_examples = 1;
    r.tensors = global;
    for (NamedTensor& t : r.tensors) std::fill(t.values.begin(), t.values.end(), 0.0f);
    r.tensors[0].values[0] = value_;
    return r;
  }

 private:
  float value_;
};

class LocalDpAuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = {{"encoder.weight", DType::kFloat32, {8, 5}}, {"encoder.bias", DType::kFloat32, {8}}};
    for (const TensorSpec& s : layout_) global_.emplace_back(s.name, s.shape);
  }

  wire::Message Fit(uint64_t round, double z_noise) const {
    wire::FitInstruction fit;
    fit.model_version = round - 1;
    fit.seed = 99;
    fit.nonce = std::string(wire::kNonceBytes, 'n');
    fit.privacy = {wire::UpdatePrivacy::Mode::kLocal, kClip, z_noise};
    wire::Message m = wire::MakeMessage(fit, round);
    for (const Tensor& t : global_) m.tensors.push_back(wire::TensorPayload::CopyOf(t));
    return m;
  }

  // kRuns releases of one agent whose update is `value` e_0, told noise multiplier z_noise: the
  // released coordinates in units of the stated std kZ C, round by round. epsilon_stated receives
  // the agent's own accounting of its first release.
  std::vector<std::vector<double>> Releases(float value, double z_noise, uint64_t seed,
                                            double* epsilon_stated) {
    CanaryTrainer trainer(value);
    ClientAgent agent("canary", &trainer, /*routine_logs_at_info=*/false);
    agent.set_noise_source(privacy::NoiseSource::SeededForTesting(seed));
    EXPECT_TRUE(
        agent
            .Handle(wire::MakeMessage(wire::Welcome{
                "audit", models::ModelSpecToWire(models::ModelSpec::External(layout_)), 500}))
            .ok());
    std::vector<std::vector<double>> out;
    for (uint64_t round = 1; round <= kRuns; ++round) {
      auto request = agent.Handle(Fit(round, z_noise));
      EXPECT_TRUE(request.ok() && request->size() == 1 &&
                  (*request)[0].type() == wire::MessageType::kUploadRequest)
          << round;
      if (round == 1 && epsilon_stated != nullptr) {
        auto spent = agent.privacy_guard().LocalSpent();
        EXPECT_TRUE(spent.ok()) << spent.status();
        if (spent.ok()) *epsilon_stated = spent->epsilon;
      }
      auto upload = agent.Handle(wire::MakeMessage(wire::UploadGrant{}, round));
      if (!upload.ok() || upload->size() != 1 || (*upload)[0].tensors.size() != layout_.size()) {
        ADD_FAILURE() << "round " << round << ": no FitResult with the model's tensors";
        return out;
      }
      std::vector<double> values;
      for (const wire::TensorPayload& t : (*upload)[0].tensors) {
        for (float x : t.floats()) values.push_back(x / (kZ * kClip));
      }
      out.push_back(std::move(values));
    }
    return out;
  }

  // Both worlds (+C and -C), every release told z_noise.
  audit::Samples Run(double z_noise, uint64_t seed, double* epsilon_stated) {
    audit::Samples s;
    for (const float value : {1.0f, -1.0f}) {
      for (const std::vector<double>& r :
           Releases(value * static_cast<float>(kClip), z_noise, seed + (value > 0 ? 0 : 1),
                    value > 0 ? epsilon_stated : nullptr)) {
        (value > 0 ? s.canary : s.neighbour).push_back(r[0]);
        s.noise.push_back(r[0] - value / kZ);  // the update, in stated stds
        s.noise.insert(s.noise.end(), r.begin() + 1, r.end());
      }
    }
    return s;
  }

  ModelLayout layout_;
  TensorList global_;
};

TEST_F(LocalDpAuditTest, TheTrueMechanismPassesAndHalfTheStatedNoiseIsRefuted) {
  double stated = 0;
  const audit::Audit honest = audit::RunAudit(Run(kZ, 1, &stated), kDelta);
  audit::Print(std::cout, "local DP, z = 4 added", honest, stated);
  // One local release under replace-one: the exact Gaussian epsilon of mu = 2 / z.
  EXPECT_NEAR(stated, audit::GaussianEpsilon(2 / kZ, kDelta), 1e-6 * stated);
  audit::ExpectKeepsItsClaim(honest, stated, 0.03);

  // The same agent told z / 2, audited against the claim of z.
  const audit::Audit half = audit::RunAudit(Run(kZ / 2, 3, nullptr), kDelta);
  audit::Print(std::cout, "local DP, z = 2 added, z = 4 claimed", half, stated);
  audit::ExpectRefutedAtHalfTheNoise(half, stated);

  // The design's miss probabilities at half the std (mu = 4 / z).
  const double miss_gaussian =
      audit::GaussianLossMissProbability(kRuns, kRuns, honest.scale.dof, 4 / kZ, stated, kDelta);
  std::cout << "false alarm <= " << audit::kFalseAlarm << "; at half the std (b) misses w.p. 10^"
            << honest.scale.log_miss_at_half / std::log(10.0) << ", (c) w.p. <= " << miss_gaussian
            << "\n";
  EXPECT_LT(std::exp(honest.scale.log_miss_at_half), 1e-6);
  EXPECT_LT(miss_gaussian, 1e-6);
}

}  // namespace
}  // namespace huddle::client
