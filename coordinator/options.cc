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

// Client-level DP with buffered asynchronous training: participation-bounded accounting
// (privacy/budget.h's max_participations; docs/privacy.md, "Asynchronous training").
Status CheckAsyncPrivacy(const CoordinatorOptions& o) {
  const privacy::PrivacyOptions& p = o.privacy;
  if (!o.async.enabled) {
    if (p.max_participations) {
      return absl::InvalidArgumentError(
          "privacy.max_participations applies to asynchronous training (async): synchronous "
          "rounds sample their cohorts and account every round for every client; remove it");
    }
    return absl::OkStatus();
  }
  if (p.mode == privacy::PrivacyMode::kNone) return absl::OkStatus();
  if (p.mode == privacy::PrivacyMode::kDistributed) {
    return absl::InvalidArgumentError(
        "async with privacy.mode distributed is not supported yet (distributed DP per "
        "asynchronous secure-aggregation session is not built); use privacy.mode local (with "
        "secure_aggregation) or central, or synchronous rounds");
  }
  if (!p.max_participations) {
    return absl::InvalidArgumentError(
        "async with privacy.mode needs privacy.max_participations: asynchronous arrival is not "
        "Poisson sampling (fast clients come more often, and when a client answers may depend on "
        "its data), so no amplification by sampling is claimed; each client's epsilon is the "
        "composition of the server steps it contributed to, which the coordinator bounds by "
        "privacy.max_participations (and privacy.min_separation steps between two of them)");
  }
  if (p.expected_cohort_size) {
    return absl::InvalidArgumentError(
        "privacy.expected_cohort_size does not apply with async: every server step divides its "
        "noised sum by async.buffer; remove it");
  }
  for (size_t i = 0; i < p.schedule.size(); ++i) {
    const privacy::ScheduleRange& r = p.schedule[i];
    if (r.clip_norm && *r.clip_norm != p.clip_norm) {
      return absl::InvalidArgumentError(absl::StrCat(
          "privacy.schedule[", i,
          "].clip_norm: with async the clip norm is one for the whole job (privacy.clip_norm): a "
          "task sent in one server step may land in a later one"));
    }
    if (p.mode == privacy::PrivacyMode::kLocal && i > 0 &&
        (r.noise_multiplier != p.schedule[0].noise_multiplier ||
         r.epsilon != p.schedule[0].epsilon)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "privacy.schedule[", i,
          "]: with async and privacy.mode local the noise is one for the whole job: each client "
          "noises its update when it is sent the model, and it may land in a later server step"));
    }
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
  if (o.secure_aggregation.enabled) {
    // Server steps as SecAgg+ sessions of `buffer` members (secure_session.h).
    const int64_t sessions = a.buffer > 0 ? a.concurrency / a.buffer : 0;
    if (a.buffer < 2 || sessions < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "async with secure_aggregation: each server step is a secure-aggregation session of "
          "async.buffer members, so async.buffer (",
          a.buffer, ") must be >= 2 (one member's sum hides nothing) and async.concurrency (",
          a.concurrency, ") >= async.buffer (concurrency / buffer sessions are in flight)"));
    }
    if (!(a.over_selection >= 1 && a.over_selection <= 4)) {
      return absl::InvalidArgumentError(
          absl::StrCat("async.over_selection (", a.over_selection, ") must lie in [1, 4]"));
    }
    if (a.max_staleness < sessions - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "async with secure_aggregation: async.max_staleness (", a.max_staleness,
          ") must be >= the sessions in flight less one (", sessions - 1,
          "): a session's staleness is the steps applied since it started, up to that many"));
    }
  }
  if (a.over_selection != 1 && !o.secure_aggregation.enabled) {
    return absl::InvalidArgumentError(
        "async.over_selection applies to secure aggregation's sessions; without it every update "
        "is taken as it arrives (async.concurrency already keeps more clients training than a "
        "step takes); remove it");
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
  HUDDLE_RETURN_IF_ERROR(CheckAsyncPrivacy(o));
  if (o.privacy.mode != privacy::PrivacyMode::kNone && o.max_update_norm > 0) {
    return absl::InvalidArgumentError(
        "aggregation.max_update_norm applies to jobs without client-level DP; under privacy.mode "
        "every update is already bounded by privacy.clip_norm (remove one)");
  }
  if (o.privacy.mode == privacy::PrivacyMode::kCentral && !o.async.enabled &&
      o.cohort.sampling != CohortOptions::Sampling::kPoisson) {
    return absl::InvalidArgumentError(
        "privacy.mode central needs cohort.sampling: poisson (the accountant's amplification by "
        "sampling holds only for Poisson-sampled cohorts)");
  }
  HUDDLE_RETURN_IF_ERROR(CheckAsync(o));
  return CheckSecureAggregation(o);
}

}  // namespace huddle::coordinator
