#include "coordinator/round_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/time_format.h"

namespace huddle::coordinator {

namespace {

using Json = nlohmann::ordered_json;

template <typename T>
Json Maybe(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

// The DP-protected (or configuration-fixed) privacy fields.
Json PublicPrivacy(const RoundMetrics::Privacy& p) {
  Json j;
  j["mode"] = p.mode;
  j["private"] = p.is_private;
  if (!p.is_private) j["nominal_epsilon"] = p.epsilon;
  j["accountant"] = p.accountant;
  j["budget_epsilon"] = Maybe(p.budget_epsilon);
  j["noise_multiplier"] = p.noise_multiplier;
  j["clip_norm"] = p.clip_norm;
  j["noise_stddev"] = p.noise_stddev;
  j["next_clip_norm"] = Maybe(p.next_clip_norm);
  return j;
}

// {"time": "2026-11-28T22:51:03.123Z"} when the row's wall time is known.
void AddTime(const RoundMetrics& m, Json* j) {
  if (m.wall_ms >= 0) (*j)["time"] = Iso8601Utc(m.wall_ms);
}

// What only the operator may see under DP: counts of clients and messages.
void AddCounts(const RoundMetrics& m, Json* j) {
  (*j)["clients_enrolled"] = m.clients_enrolled;
  (*j)["clients_sampled"] = m.clients_sampled;
  (*j)["results"] = m.results;
  (*j)["dropped"] = m.dropped;
  (*j)["rejected"] = m.rejected;
  (*j)["stale"] = m.stale;
  (*j)["malformed"] = m.malformed;
  (*j)["auth_rejected"] = m.auth_rejected;
  (*j)["rate_limited"] = m.rate_limited;
  (*j)["declined"] = m.declined;
  (*j)["failed"] = m.failed;
  (*j)["clipped"] = m.clipped;
  (*j)["weight_capped"] = m.weight_capped;
  (*j)["connections_cut"] = m.connections_cut;
}

// {"mode": "federated", "clients_asked": ..., ...}: which evaluation the test_* values are.
Json FederatedJson(const RoundMetrics::FederatedEval& f) {
  Json j;
  j["mode"] = "federated";
  j["clients_asked"] = f.asked;
  j["clients_answered"] = f.answered;
  j["rejected"] = f.rejected;
  j["declined"] = f.declined;
  j["weight"] = f.weight;
  j["weight_capped"] = f.weight_capped;
  return j;
}

// The session's settings: public, the configuration fixes them.
Json SecAggSettings(const RoundMetrics::SecureAggregation& a) {
  Json j;
  j["enabled"] = true;
  j["members"] = a.members;
  j["threshold"] = a.threshold;
  j["neighbours"] = a.neighbours;
  j["min_survivors"] = a.min_survivors;
  j["bits"] = a.bits;
  j["consistency_quorum"] = a.consistency_quorum;
  if (a.honest_shares > 0) j["honest_shares"] = a.honest_shares;
  return j;
}

// What happened in the session: counts of members by stage, complaints, who lied, the outcome.
Json SecAggOutcome(const RoundMetrics::SecureAggregation& a) {
  Json j;
  j["listed"] = a.listed;
  j["shared"] = a.shared;
  j["masked"] = a.masked;
  j["signed"] = a.signed_survivors;
  j["answered"] = a.answered;
  j["complaints"] = a.complaints;
  Json blamed = Json::array();
  for (const auto& [id, why] : a.blamed) blamed.push_back({{"client", id}, {"reason", why}});
  j["blamed"] = blamed;
  j["restarts"] = a.restarts;
  j["released"] = a.released;
  j["failure"] = a.failure.empty() ? Json(nullptr) : Json(a.failure);
  return j;
}

// {"count", "sum", "p50", "max"} of the round's upload durations (p50 and max null when none).
Json UploadSummary(const std::vector<double>& seconds) {
  Json j;
  j["count"] = seconds.size();
  if (seconds.empty()) {
    j["sum"] = 0.0;
    j["p50"] = nullptr;
    j["max"] = nullptr;
    return j;
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  // Microseconds: a plain sum of millisecond values writes 0.30000000000000004.
  j["sum"] = std::round(std::accumulate(sorted.begin(), sorted.end(), 0.0) * 1e6) / 1e6;
  j["p50"] = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  j["max"] = sorted.back();
  return j;
}

// ... and timings and traffic.
void AddTimings(const RoundMetrics& m, Json* j) {
  (*j)["duration_s"] = m.duration_s;
  (*j)["upload_s"] = UploadSummary(m.upload_seconds);
  // The raw durations, one per contributing member (at most the cohort): the service's histogram
  // observes each (service/service_metrics.h).
  (*j)["upload_seconds"] = m.upload_seconds;
  (*j)["bytes_in"] = m.bytes_in;
  (*j)["bytes_out"] = m.bytes_out;
  (*j)["elapsed_s"] = m.elapsed_s;
}

// A step's buffered asynchronous settings (configuration: public under DP) and, with `observed`,
// what the step saw (counts and staleness of the results: operator-only under DP).
Json AsyncJson(const RoundMetrics::Async& a, bool observed) {
  Json j = {{"buffer", a.buffer}, {"concurrency", a.concurrency}};
  if (observed) {
    j["in_flight"] = a.in_flight;
    j["refused_stale"] = a.refused_stale;
    j["staleness_mean"] = a.staleness_mean;
    j["staleness_max"] = a.staleness_max;
    j["discount_mean"] = a.discount_mean;
  }
  return j;
}

}  // namespace

std::string RoundMetrics::PublicJson() const {
  if (!privacy) return ToJson();
  Json j;
  j["round"] = round;  // no `time`: a timing, operator-only (round_metrics.h)
  j["updated"] = updated;
  j["test_accuracy"] = Maybe(test_accuracy);
  j["test_loss"] = Maybe(test_loss);
  j["epsilon"] = privacy->is_private ? Json(privacy->epsilon) : Json(nullptr);
  j["delta"] = privacy->delta;
  j["privacy"] = PublicPrivacy(*privacy);
  if (async) j["async"] = AsyncJson(*async, /*observed=*/false);
  if (secure_aggregation) j["secure_aggregation"] = SecAggSettings(*secure_aggregation);
  return j.dump();
}

std::string RoundMetrics::OperatorJson() const {
  Json j;
  j["round"] = round;
  AddTime(*this, &j);
  AddCounts(*this, &j);
  j["examples"] = examples >= 0 ? Json(examples) : Json(nullptr);
  j["train_loss"] = Maybe(train_loss);
  AddTimings(*this, &j);
  if (privacy) {
    j["within_clip"] = privacy->within_clip >= 0 ? Json(privacy->within_clip) : Json(nullptr);
    j["noise_seconds"] = privacy->noise_seconds;
  }
  if (async) j["async"] = AsyncJson(*async, /*observed=*/true);
  if (secure_aggregation) j["secure_aggregation"] = SecAggOutcome(*secure_aggregation);
  return j.dump();
}

std::string RoundMetrics::ToJson() const {
  if (privacy) return PublicJson();
  Json j;
  j["round"] = round;
  AddTime(*this, &j);
  AddCounts(*this, &j);
  j["updated"] = updated;
  j["examples"] = examples >= 0 ? Json(examples) : Json(nullptr);
  j["train_loss"] = Maybe(train_loss);
  j["test_accuracy"] = Maybe(test_accuracy);
  j["test_loss"] = Maybe(test_loss);
  if (federated_eval) j["evaluation"] = FederatedJson(*federated_eval);
  if (async) j["async"] = AsyncJson(*async, /*observed=*/true);
  if (secure_aggregation) {
    Json a = SecAggSettings(*secure_aggregation);
    a.update(SecAggOutcome(*secure_aggregation));
    j["secure_aggregation"] = a;
  }
  AddTimings(*this, &j);
  return j.dump();
}

std::string RoundMetrics::ProgressLine() const {
  std::string line = async ? fmt::format(
                                 "step {}/{} | updates {}/{} (staleness mean {:.1f}, max {}), {} "
                                 "dispatched, {} in flight",
                                 round, total_rounds, results, async->buffer, async->staleness_mean,
                                 async->staleness_max, clients_sampled, async->in_flight)
                           : fmt::format("round {}/{} | updates {}/{}", round, total_rounds,
                                         results, clients_sampled);
  if (dropped > 0) line += fmt::format(" ({} dropped)", dropped);
  if (async && async->refused_stale > 0) {
    line += fmt::format(" | {} too stale", async->refused_stale);
  }
  if (rejected + stale + malformed > 0) {
    line +=
        fmt::format(" | refused {} rejected, {} stale, {} malformed", rejected, stale, malformed);
  }
  if (auth_rejected > 0) line += fmt::format(" | {} auth refused", auth_rejected);
  if (rate_limited > 0) line += fmt::format(" | {} rate-limited", rate_limited);
  if (declined > 0) line += fmt::format(" | {} declined by their privacy policy", declined);
  if (failed > 0) line += fmt::format(" | {} failed to train", failed);
  if (clipped > 0) line += fmt::format(" | {} clipped", clipped);
  if (weight_capped > 0) line += fmt::format(" | {} weights capped", weight_capped);
  if (connections_cut > 0) line += fmt::format(" | {} connections cut", connections_cut);
  if (secure_aggregation) {
    const SecureAggregation& a = *secure_aggregation;
    line += a.released ? fmt::format(" | secure sum of {} (t {})", a.masked, a.threshold)
                       : " | secure aggregation released nothing";
    if (!a.blamed.empty()) line += fmt::format(", {} blamed", a.blamed.size());
  }
  if (!updated)
    line += secure_aggregation && !secure_aggregation->released ? ", model unchanged"
                                                                : " | no quorum, model unchanged";
  if (test_accuracy)
    line += fmt::format(" | test acc {:.4f} loss {:.4f}", *test_accuracy, *test_loss);
  if (federated_eval && test_accuracy) {
    line +=
        fmt::format(" (federated, {}/{} clients)", federated_eval->answered, federated_eval->asked);
  } else if (federated_eval) {
    line += fmt::format(" | federated evaluation: no answers ({} clients asked)",
                        federated_eval->asked);
  }
  if (privacy && !privacy->is_private) {
    line += fmt::format(" | NOT PRIVATE (seeded noise; nominal eps {:.4g})", privacy->epsilon);
  } else if (privacy) {
    line += fmt::format(" | eps {:.4g}", privacy->epsilon);
    if (privacy->budget_epsilon) line += fmt::format("/{:.4g}", *privacy->budget_epsilon);
    line += fmt::format(" (delta {:.0e})", privacy->delta);
  }
  line += fmt::format(" | {:.2f} s", duration_s);
  return line;
}

}  // namespace huddle::coordinator
