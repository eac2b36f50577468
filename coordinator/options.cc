#include "coordinator/options.h"

namespace huddle::coordinator {

namespace {

Status CheckFederatedEvaluation(const CoordinatorOptions& o) {
  if (o.eval_mode != CoordinatorOptions::EvalMode::kFederated) return absl::OkStatus();
  if (o.privacy.mode != privacy::PrivacyMode::kNone || o.train.dp_sgd) {
    return absl::InvalidArgumentError(
        "evaluation.mode federated has the clients report a loss and an accuracy computed from "
        "their data without noise, which the job's differential privacy (privacy.mode, "
        "train.dp_sgd) does not cover; evaluate the released model.bin yourself instead");
  }
  const FederatedEvalOptions& f = o.federated_eval;
  if (f.clients < 1 || f.deadline_ms <= 0 || !(f.max_weight_ratio >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("federated evaluation needs clients >= 1 (", f.clients, "), deadline_ms > 0 (",
                     f.deadline_ms, ") and max_weight_ratio >= 1 (", f.max_weight_ratio, ")"));
  }
  return absl::OkStatus();
}

Status CheckSecureAggregation(const CoordinatorOptions& o) {
  const privacy::PrivacyMode mode = o.privacy.mode;
  if (mode == privacy::PrivacyMode::kDistributed && !o.secure_aggregation.enabled) {
    return absl::InvalidArgumentError(
        "privacy.mode distributed needs secure_aggregation: {enabled: true}: the clients' noise "
        "shares protect only a sum that secure aggregation keeps the coordinator from taking "
        "apart");
  }
  if (!o.secure_aggregation.enabled) return absl::OkStatus();
  const SecureAggregationOptions& a = o.secure_aggregation;
  if (mode == privacy::PrivacyMode::kCentral) {
    return absl::InvalidArgumentError(
        "secure_aggregation with privacy.mode central is not supported: central DP trusts the "
        "coordinator with the noise, secure aggregation does not trust it with an update; use "
        "privacy.mode local (each client noises its own update before masking it)");
  }
  if (mode == privacy::PrivacyMode::kNone && !(o.max_update_norm > 0)) {
    return absl::InvalidArgumentError(
        "secure_aggregation needs aggregation.max_update_norm > 0 (without privacy.mode): the "
        "coordinator cannot bound a masked update, so each client clips its update to that norm "
        "before masking it, and the word width is chosen for it");
  }
  if (!(a.min_survivor_fraction >= 0 && a.min_survivor_fraction <= 1) || a.stage_timeout_ms <= 0 ||
      (a.bits != 0 && a.bits != 32 && a.bits != 64) || (a.neighbours > 0) != (a.threshold > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secure_aggregation: min_survivors ", a.min_survivor_fraction,
        " must be in [0, 1], stage_timeout_s > 0, bits 32 or 64 (or unset), and neighbours and "
        "threshold given together"));
  }
  if (mode == privacy::PrivacyMode::kDistributed &&
      !(a.min_survivor_fraction > a.graph.corrupt_fraction)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "privacy.mode distributed needs secure_aggregation.min_survivors (",
        a.min_survivor_fraction, ") above corrupt_fraction (", a.graph.corrupt_fraction,
        "): the noise is carried by the honest members among the fewest whose inputs are "
        "unmasked, and colluders' shares do not count"));
  }
  return absl::OkStatus();
}

}  // namespace

Status ValidateOptions(const CoordinatorOptions& o) {
  if (o.quorum > o.cohort.size && o.cohort.sampling == CohortOptions::Sampling::kFixed) {
    return absl::InvalidArgumentError(absl::StrCat("round.quorum (", o.quorum,
                                                   ") exceeds cohort.size (", o.cohort.size,
                                                   "): no round could ever update the model"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckFederatedEvaluation(o));
  if (o.privacy.mode != privacy::PrivacyMode::kNone && o.max_update_norm > 0) {
    return absl::InvalidArgumentError(
        "aggregation.max_update_norm applies to jobs without client-level DP; under privacy.mode "
        "every update is already bounded by privacy.clip_norm (remove one)");
  }
  if (o.privacy.mode == privacy::PrivacyMode::kCentral &&
      o.cohort.sampling != CohortOptions::Sampling::kPoisson) {
    return absl::InvalidArgumentError(
        "privacy.mode central needs cohort.sampling: poisson (the accountant's amplification by "
        "sampling holds only for Poisson-sampled cohorts)");
  }
  return CheckSecureAggregation(o);
}

}  // namespace huddle::coordinator
