#include "privacy/report.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace huddle::privacy {

std::vector<ReportReleases> GroupReleases(std::span<const LedgerEntry> entries) {
  std::vector<ReportReleases> runs;
  for (const LedgerEntry& e : entries) {
    const DpEvent event = e.event();
    if (!runs.empty()) {
      ReportReleases& last = runs.back();
      if (last.sampling_rate == e.sampling_rate && last.noise_multiplier == e.noise_multiplier &&
          last.clip_norm == e.clip_norm && last.adjacency == e.adjacency && last.noise == e.noise &&
          last.mechanism == e.mechanism && last.tau == e.tau) {
        last.last_round = std::max(last.last_round, e.round);
        last.first_round = std::min(last.first_round, e.round);
        ++last.entries;
        last.steps += e.steps;
        continue;
      }
    }
    ReportReleases run;
    run.first_round = run.last_round = e.round;
    run.entries = 1;
    run.steps = e.steps;
    run.sampling_rate = e.sampling_rate;
    run.noise_multiplier = e.noise_multiplier;
    run.accounted_noise_multiplier = event.noise_multiplier;
    run.clip_norm = e.clip_norm;
    run.adjacency = e.adjacency;
    run.noise = e.noise;
    run.mechanism = e.mechanism;
    run.tau = e.tau;
    runs.push_back(std::move(run));
  }
  return runs;
}

std::string PrivacyReportJson(const PrivacyReport& r) {
  nlohmann::ordered_json j;
  j["job"] = r.job;
  j["scope"] = r.scope;
  j["private"] = r.is_private;
  const bool stated = r.is_private && r.epsilon_kept_by.empty();
  j["epsilon"] = stated ? nlohmann::ordered_json(r.nominal_epsilon) : nullptr;
  if (!r.epsilon_kept_by.empty()) j["epsilon_kept_by"] = r.epsilon_kept_by;
  j["delta"] = r.delta;
  if (!r.is_private) {
    j["not_private_because"] = r.not_private_because;
    j["nominal_epsilon"] = r.nominal_epsilon;
  }
  j["budget_epsilon"] = r.budget_epsilon ? nlohmann::ordered_json(*r.budget_epsilon) : nullptr;
  if (r.plan) {
    const ReportPlan& p = *r.plan;
    j["rounds"] = {{"planned", p.rounds_planned}, {"run", p.rounds_run}};
    j["planned_epsilon"] = p.epsilon ? nlohmann::ordered_json(*p.epsilon) : nullptr;
    j["stop_at_budget"] = p.stop_at_budget;
    nlohmann::ordered_json schedule = nlohmann::ordered_json::array();
    for (const PlannedRange& range : p.noise_schedule) {
      nlohmann::ordered_json g;
      g["rounds"] = {range.first_round, range.last_round};
      g["noise_multiplier"] = range.noise_multiplier;
      g["clip_norm"] = range.clip_norm;
      schedule.push_back(std::move(g));
    }
    j["noise_schedule"] = std::move(schedule);
    if (p.participation) {
      j["participation"] = {{"max_participations", p.participation->max_participations},
                            {"min_separation", p.participation->min_separation}};
    }
  }
  j["unit_of_privacy"] = r.unit;
  j["adjacency"] = r.adjacency;
  j["mechanism"] = r.mechanism;
  j["sampling"] = r.sampling;
  j["accountant"] = r.accountant;
  j["noise_source"] = r.noise_source;
  nlohmann::ordered_json releases = nlohmann::ordered_json::array();
  for (const ReportReleases& run : r.releases) {
    nlohmann::ordered_json g;
    g["rounds"] = {run.first_round, run.last_round};
    g["releases"] = run.entries;
    g["steps"] = run.steps;
    g["sampling_rate"] = run.sampling_rate;
    g["noise_multiplier"] = run.noise_multiplier;
    g["accounted_noise_multiplier"] = run.accounted_noise_multiplier;
    if (run.mechanism == kMechanismDistributed) {
      g["mechanism"] = run.mechanism;
      g["tau"] = run.tau;
    }
    g["clip_norm"] = run.clip_norm;
    g["adjacency"] = run.adjacency;
    g["noise"] = run.noise;
    releases.push_back(std::move(g));
  }
  j["releases"] = std::move(releases);
  j["ledger"] = r.ledger;
  j["assumptions"] = r.assumptions;
  j["not_covered"] = r.not_covered;
  if (!r.stopped_early.empty()) j["stopped_early"] = r.stopped_early;
  return j.dump(2) + "\n";
}

Status WritePrivacyReport(const std::string& dir, const PrivacyReport& report) {
  return WriteFileAtomic((std::filesystem::path(dir) / kPrivacyReportFile).string(),
                         PrivacyReportJson(report));
}

}  // namespace huddle::privacy
