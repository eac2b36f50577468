#include "service/service_metrics.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/version.h"

namespace huddle::service {
namespace {

using nlohmann::json;

double Number(const json& row, const char* key, double otherwise = 0) {
  auto it = row.find(key);
  return it != row.end() && it->is_number() ? it->get<double>() : otherwise;
}

// Bounds of the upload-duration histogram: Prometheus's default buckets (5 ms - 10 s), then up to
// a minute (round.upload_timeout_s is 30 s by default); longer uploads count in +Inf.
Histogram UploadHistogram() {
  return *Histogram::Create({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
}

}  // namespace

ServiceMetrics::ServiceMetrics() = default;

void ServiceMetrics::OnJobStart(const std::string& job, int64_t planned_rounds) {
  absl::MutexLock lock(&mu_);
  Job& j = jobs_[job];
  j.planned_rounds = planned_rounds;
  if (!j.round_seconds) j.round_seconds = *Histogram::Exponential(0.05, 2, 14);  // 50 ms - 7 min
  if (!j.upload_seconds) j.upload_seconds = UploadHistogram();
  finished_.erase(std::remove(finished_.begin(), finished_.end(), job), finished_.end());
}

void ServiceMetrics::OnRound(const std::string& job, const std::string& public_row,
                             const std::string& operator_row) {
  const json pub = json::parse(public_row, nullptr, /*allow_exceptions=*/false);
  const json op = json::parse(operator_row, nullptr, /*allow_exceptions=*/false);
  if (!pub.is_object() || !op.is_object()) return;
  absl::MutexLock lock(&mu_);
  Job& j = jobs_[job];
  j.round = static_cast<int64_t>(Number(pub, "round"));
  if (pub.contains("test_accuracy") && pub["test_accuracy"].is_number()) {
    j.has_accuracy = true;
    j.test_accuracy = Number(pub, "test_accuracy");
    j.test_loss = Number(pub, "test_loss");
  }
  if (pub.contains("epsilon") && pub["epsilon"].is_number()) {
    j.dp = true;
    j.epsilon = Number(pub, "epsilon");
    if (pub.contains("privacy") && pub["privacy"].is_object()) {
      j.budget_epsilon = Number(pub["privacy"], "budget_epsilon");
    }
  }
  if (!j.round_seconds) j.round_seconds = *Histogram::Exponential(0.05, 2, 14);
  j.round_seconds->Observe(Number(op, "duration_s"));
  if (!j.upload_seconds) j.upload_seconds = UploadHistogram();
  // One per contributing member (at most the round's cohort): each member's upload.
  if (auto it = op.find("upload_seconds"); it != op.end() && it->is_array()) {
    for (const json& seconds : *it) {
      if (seconds.is_number()) j.upload_seconds->Observe(seconds.get<double>());
    }
  }
  j.members["contributed"] += Number(op, "results");
  for (const char* outcome : {"dropped", "rejected", "declined", "failed"}) {
    j.members[outcome] += Number(op, outcome);
  }
  j.bytes_in += Number(op, "bytes_in");
  j.bytes_out += Number(op, "bytes_out");
}

void ServiceMetrics::OnJobEnd(const std::string& job) {
  absl::MutexLock lock(&mu_);
  finished_.erase(std::remove(finished_.begin(), finished_.end(), job), finished_.end());
  finished_.push_back(job);
  while (finished_.size() > kFinishedJobsKept) {
    jobs_.erase(finished_.front());
    finished_.pop_front();
  }
}

void ServiceMetrics::OnOperatorRequest(const std::string& command, bool ok) {
  absl::MutexLock lock(&mu_);
  requests_[{command, ok ? "ok" : "refused"}] += 1;
}

std::vector<MetricFamily> ServiceMetrics::Families(const ServiceCounts& counts,
                                                   bool operator_families) const {
  std::vector<MetricFamily> out;
  out.push_back(MetricFamily::Info("huddle_build_info", "The huddle build serving",
                                   {{"version", Version()}, {"revision", BuildRevision()}}));
  MetricFamily jobs = MetricFamily::Gauge("huddle_jobs", "Jobs of the service by state");
  for (const auto& [state, n] : counts.jobs_by_state) {
    jobs.Add({{"state", state}}, static_cast<double>(n));
  }
  out.push_back(std::move(jobs));
  out.push_back(MetricFamily::Gauge("huddle_agents", "Agents known to the service by liveness")
                    .Add({{"state", "live"}}, static_cast<double>(counts.agents_live))
                    .Add({{"state", "not_live"}},
                         static_cast<double>(counts.agents_known - counts.agents_live)));
  absl::MutexLock lock(&mu_);
  MetricFamily round = MetricFamily::Gauge("huddle_job_round", "The job's last completed round");
  MetricFamily planned =
      MetricFamily::Gauge("huddle_job_rounds_planned", "The job's planned rounds");
  MetricFamily accuracy = MetricFamily::Gauge(
      "huddle_job_test_accuracy",
      "Accuracy of the job's released model on the server's test set (a ratio in [0, 1])");
  MetricFamily loss = MetricFamily::Gauge("huddle_job_test_loss",
                                          "Loss of the job's released model on the test set");
  MetricFamily epsilon = MetricFamily::Gauge(
      "huddle_job_privacy_epsilon", "Privacy spent by the job so far, as its accountant states it");
  MetricFamily budget =
      MetricFamily::Gauge("huddle_job_privacy_epsilon_budget", "The job's privacy budget");
  for (const auto& [name, j] : jobs_) {
    const Labels l = {{"huddle_job", name}};
    round.Add(l, static_cast<double>(j.round));
    planned.Add(l, static_cast<double>(j.planned_rounds));
    if (j.has_accuracy) {
      accuracy.Add(l, j.test_accuracy);
      loss.Add(l, j.test_loss);
    }
    if (j.dp) {
      epsilon.Add(l, j.epsilon);
      budget.Add(l, j.budget_epsilon);
    }
  }
  for (MetricFamily* f : {&round, &planned, &accuracy, &loss, &epsilon, &budget}) {
    out.push_back(std::move(*f));
  }
  MetricFamily requests = MetricFamily::Counter("huddle_api_requests_total",
                                                "Operators' requests by command and outcome");
  for (const auto& [key, n] : requests_) {
    requests.Add({{"command", key.first}, {"outcome", key.second}}, n);
  }
  out.push_back(std::move(requests));
  if (!operator_families) return out;
  // Operator-only: counts, traffic and timings computed without noise.
  MetricFamily seconds = MetricFamily::HistogramFamily(
      "huddle_operator_round_duration_seconds", "Operator-only: duration of the job's rounds");
  MetricFamily uploads = MetricFamily::HistogramFamily(
      "huddle_operator_upload_duration_seconds",
      "Operator-only: duration of each contributing member's upload, from its upload grant to its "
      "whole update received");
  MetricFamily members =
      MetricFamily::Counter("huddle_operator_round_members_total",
                            "Operator-only: sampled clients by what became of them in a round");
  MetricFamily in = MetricFamily::Counter("huddle_operator_job_received_bytes_total",
                                          "Operator-only: bytes the job received");
  MetricFamily sent = MetricFamily::Counter("huddle_operator_job_sent_bytes_total",
                                            "Operator-only: bytes the job sent");
  for (const auto& [name, j] : jobs_) {
    const Labels l = {{"huddle_job", name}};
    if (j.round_seconds) seconds.Add(l, *j.round_seconds);
    if (j.upload_seconds) uploads.Add(l, *j.upload_seconds);
    for (const auto& [outcome, n] : j.members) {
      members.Add({{"huddle_job", name}, {"outcome", outcome}}, n);
    }
    in.Add(l, j.bytes_in);
    sent.Add(l, j.bytes_out);
  }
  for (MetricFamily* f : {&seconds, &uploads, &members, &in, &sent}) out.push_back(std::move(*f));
  out.push_back(MetricFamily::Counter("huddle_operator_received_bytes_total",
                                      "Operator-only: bytes received on the agents' endpoint")
                    .Add(static_cast<double>(counts.bytes_in)));
  out.push_back(MetricFamily::Counter("huddle_operator_sent_bytes_total",
                                      "Operator-only: bytes sent on the agents' endpoint")
                    .Add(static_cast<double>(counts.bytes_out)));
  out.push_back(MetricFamily::Counter(
                    "huddle_operator_handshakes_refused_total",
                    "Operator-only: handshakes refused (keys not enrolled or revoked, throttled)")
                    .Add(static_cast<double>(counts.handshakes_refused)));
  out.push_back(MetricFamily::Counter("huddle_operator_messages_rate_limited_total",
                                      "Operator-only: messages dropped by the rate limit")
                    .Add(static_cast<double>(counts.rate_limited)));
  out.push_back(MetricFamily::Counter(
                    "huddle_operator_connections_cut_total",
                    "Operator-only: connections cut (over their bound, or their key revoked)")
                    .Add(static_cast<double>(counts.connections_cut)));
  return out;
}

}  // namespace huddle::service
