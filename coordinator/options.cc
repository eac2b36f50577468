#include "coordinator/options.h"

#include <cmath>

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

Status CheckAsync(const CoordinatorOptions& o) {
  const AsyncOptions& a = o.async;
  if (!a.enabled) return absl::OkStatus();
  if (a.concurrency < 1 || a.buffer < 1 || a.max_staleness < 0 || !(a.exponent >= 0) ||
      !std::isfinite(a.exponent) || a.hinge_after < 0 || !(a.hinge_slope > 0) ||
      !std::isfinite(a.hinge_slope)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "async: concurrency (", a.concurrency, ") and buffer (", a.buffer,
        ") must be >= 1, max_staleness (", a.max_staleness, ") and staleness.hinge_after (",
        a.hinge_after, ") >= 0, staleness.exponent (", a.exponent,
        ") finite and >= 0, staleness.hinge_slope (", a.hinge_slope, ") finite and > 0"));
  }
  if (o.privacy.mode != privacy::PrivacyMode::kNone) {
    return absl::InvalidArgumentError(
        "async with privacy.mode is not supported yet: asynchronous arrival is not Poisson "
        "sampling, so its releases need per-client accounting without amplification "
        "(privacy.max_participations), which is not built; run DP jobs in synchronous rounds "
        "(remove async)");
  }
  if (o.secure_aggregation.enabled) {
    return absl::InvalidArgumentError(
        "async with secure_aggregation is not supported yet (flushes as SecAgg+ sessions are not "
        "built); remove one of them");
  }
  if (o.eval_mode == CoordinatorOptions::EvalMode::kFederated) {
    return absl::InvalidArgumentError(
        "async with evaluation.mode federated is not supported: federated evaluation asks idle "
        "clients between rounds, and an asynchronous job has no between; evaluate on the "
        "coordinator (evaluation.data)");
  }
  return absl::OkStatus();
}

}  // namespace

double StalenessFactor(const AsyncOptions& async, uint64_t staleness) {
  const double tau = static_cast<double>(staleness);
  switch (async.weight) {
    case AsyncOptions::Staleness::kConstant:
      return 1;
    case AsyncOptions::Staleness::kPolynomial:
      return std::pow(1 + tau, -async.exponent);
    case AsyncOptions::Staleness::kHinge: {
      const double after = static_cast<double>(async.hinge_after);
      return tau <= after ? 1 : 1 / (async.hinge_slope * (tau - after) + 1);
    }
  }
  return 1;
}

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
  HUDDLE_RETURN_IF_ERROR(CheckAsync(o));
  return CheckSecureAggregation(o);
}

}  // namespace huddle::coordinator
