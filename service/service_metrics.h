// What `huddle serve` exposes on /metrics (service/prometheus.h renders it, http_endpoint.h
// serves it). Names follow Prometheus's conventions: the `huddle_` prefix, base units, `_total`
// counters, labels of bounded cardinality (a job's name, an outcome, a state; never a client id).
// A job's name is the label `huddle_job`, not `job`: Prometheus sets `job` on every series to the
// scrape job's name and would rename ours to `exported_job`.
//
// Public families carry only what may be published under DP: configuration (the build, planned
// rounds, the budget), what the released models show (accuracy and loss on the server's test
// set, evaluated on the noised model: post-processing), the privacy spent as the accountant states
// it, the jobs' and agents' states (presence, not training data), operators' requests. Everything
// computed from the clients' participation without noise (results, drops, refusals, bytes,
// durations) is in the `huddle_operator_` families, as in `operator_metrics.jsonl`; set
// `http.operator_metrics: false` when the scrape is not the operator's alone.
//
// A job's series live while it runs and for the last kFinishedJobsKept jobs after it ended, so
// the label's cardinality stays bounded over a long-lived service.
//
// Thread-safety: every method is thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "service/prometheus.h"

namespace huddle::service {

// What the service counts itself (its dispatcher's transport, its queue and agents), read when
// /metrics is scraped.
struct ServiceCounts {
  std::map<std::string, int64_t> jobs_by_state;  // every state, 0 included
  int64_t agents_live = 0;
  int64_t agents_known = 0;
  uint64_t bytes_in = 0;  // the agents' endpoint, every job and session
  uint64_t bytes_out = 0;
  uint64_t handshakes_refused = 0;
  uint64_t rate_limited = 0;
  uint64_t connections_cut = 0;
};

class ServiceMetrics {
 public:
  static constexpr size_t kFinishedJobsKept = 32;

  ServiceMetrics();

  // A job started (planned rounds, the privacy budget when it has one: 0 otherwise).
  void OnJobStart(const std::string& job, int64_t planned_rounds);
  // A round of `job` ended: its public row and its operator row (the same row without DP).
  void OnRound(const std::string& job, const std::string& public_row,
               const std::string& operator_row);
  // `job` ended: its series are kept among the last kFinishedJobsKept finished jobs.
  void OnJobEnd(const std::string& job);
  void OnOperatorRequest(const std::string& command, bool ok);

  // The families, public then (with `operator_families`) the operator's.
  std::vector<MetricFamily> Families(const ServiceCounts& counts, bool operator_families) const;

 private:
  struct Job {
    int64_t planned_rounds = 0;
    int64_t round = 0;
    bool has_accuracy = false;
    double test_accuracy = 0;
    double test_loss = 0;
    bool dp = false;
    double epsilon = 0;
    double budget_epsilon = 0;
    // Operator-only.
    std::optional<Histogram> round_seconds;
    // Each contributing member's upload, grant to update received (the operator row's
    // `upload_seconds`: coordinator/round_metrics.h); 5 ms - 60 s.
    std::optional<Histogram> upload_seconds;
    std::map<std::string, double> members;  // outcome -> cumulative count
    double bytes_in = 0;
    double bytes_out = 0;
  };

  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> finished_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, double> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace huddle::service
