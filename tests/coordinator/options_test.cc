// ValidateOptions (coordinator/options.h): the one place the job's cross-field rules live, used by
// the coordinator and by the YAML loader alike.
#include "coordinator/options.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace huddle::coordinator {
namespace {

TEST(ValidateOptionsTest, TheDefaultsAreValid) { EXPECT_TRUE(ValidateOptions({}).ok()); }

TEST(ValidateOptionsTest, EachRuleIsRefusedNamingItsKey) {
  struct Case {
    std::function<void(CoordinatorOptions&)> edit;
    std::string names;
  };
  const std::vector<Case> cases = {
      {[](CoordinatorOptions& o) { o.quorum = o.cohort.size + 1; }, "round.quorum"},
      {[](CoordinatorOptions& o) {
         o.eval_mode = CoordinatorOptions::EvalMode::kFederated;
         o.privacy.mode = privacy::PrivacyMode::kLocal;
       },
       "evaluation.mode federated"},
      {[](CoordinatorOptions& o) {
         o.eval_mode = CoordinatorOptions::EvalMode::kFederated;
         o.federated_eval.clients = 0;
       },
       "clients >= 1"},
      {[](CoordinatorOptions& o) {
         o.privacy.mode = privacy::PrivacyMode::kLocal;
         o.max_update_norm = 1;
       },
       "aggregation.max_update_norm"},
      {[](CoordinatorOptions& o) { o.privacy.mode = privacy::PrivacyMode::kCentral; },
       "cohort.sampling: poisson"},
      {[](CoordinatorOptions& o) { o.privacy.mode = privacy::PrivacyMode::kDistributed; },
       "needs secure_aggregation"},
      {[](CoordinatorOptions& o) {
         o.privacy.mode = privacy::PrivacyMode::kCentral;
         o.cohort.sampling = CohortOptions::Sampling::kPoisson;
         o.secure_aggregation.enabled = true;
       },
       "privacy.mode central is not supported"},
      {[](CoordinatorOptions& o) { o.secure_aggregation.enabled = true; },
       "aggregation.max_update_norm > 0"},
      {[](CoordinatorOptions& o) {
         o.secure_aggregation.enabled = true;
         o.max_update_norm = 1;
         o.secure_aggregation.bits = 16;
       },
       "bits 32 or 64"},
      {[](CoordinatorOptions& o) {
         o.privacy.mode = privacy::PrivacyMode::kDistributed;
         o.secure_aggregation.enabled = true;
         o.secure_aggregation.min_survivor_fraction = 0.05;
         o.secure_aggregation.graph.corrupt_fraction = 0.1;
       },
       "above corrupt_fraction"},
  };
  for (const Case& c : cases) {
    CoordinatorOptions o;
    c.edit(o);
    const Status st = ValidateOptions(o);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << c.names << ": " << st;
    EXPECT_NE(st.message().find(c.names), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace huddle::coordinator
