#include "coordinator/round_metrics.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace huddle::coordinator {

std::string RoundMetrics::ToJson() const {
  nlohmann::ordered_json j;
  j["round"] = round;
  j["clients_enrolled"] = clients_enrolled;
  j["clients_sampled"] = clients_sampled;
  j["results"] = results;
  j["dropped"] = dropped;
  j["rejected"] = rejected;
  j["stale"] = stale;
  j["malformed"] = malformed;
  j["auth_rejected"] = auth_rejected;
  j["rate_limited"] = rate_limited;
  j["updated"] = updated;
  j["examples"] = examples;
  j["train_loss"] = train_loss ? nlohmann::ordered_json(*train_loss) : nullptr;
  j["test_accuracy"] = test_accuracy ? nlohmann::ordered_json(*test_accuracy) : nullptr;
  j["test_loss"] = test_loss ? nlohmann::ordered_json(*test_loss) : nullptr;
  j["duration_s"] = duration_s;
  j["bytes_in"] = bytes_in;
  j["bytes_out"] = bytes_out;
  j["elapsed_s"] = elapsed_s;
  if (privacy) {
    const Privacy& p = *privacy;
    j["epsilon"] = p.epsilon;
    j["delta"] = p.delta;
    j["privacy"] = {
        {"mode", p.mode},
        {"accountant", p.accountant},
        {"budget_epsilon", p.budget_epsilon ? nlohmann::ordered_json(*p.budget_epsilon) : nullptr},
        {"noise_multiplier", p.noise_multiplier},
        {"clip_norm", p.clip_norm},
        {"noise_stddev", p.noise_stddev},
        {"within_clip", p.within_clip >= 0 ? nlohmann::ordered_json(p.within_clip) : nullptr},
        {"next_clip_norm", p.next_clip_norm ? nlohmann::ordered_json(*p.next_clip_norm) : nullptr},
        {"noise_seconds", p.noise_seconds}};
  }
  return j.dump();
}

std::string RoundMetrics::ProgressLine() const {
  std::string line =
      fmt::format("round {}/{} | updates {}/{}", round, total_rounds, results, clients_sampled);
  if (dropped > 0) line += fmt::format(" ({} dropped)", dropped);
  if (rejected + stale + malformed > 0) {
    line +=
        fmt::format(" | refused {} rejected, {} stale, {} malformed", rejected, stale, malformed);
  }
  if (auth_rejected > 0) line += fmt::format(" | {} auth refused", auth_rejected);
  if (rate_limited > 0) line += fmt::format(" | {} rate-limited", rate_limited);
  if (!updated) line += " | no quorum, model unchanged";
  if (test_accuracy)
    line += fmt::format(" | test acc {:.4f} loss {:.4f}", *test_accuracy, *test_loss);
  if (privacy) {
    line += fmt::format(" | eps {:.4g}", privacy->epsilon);
    if (privacy->budget_epsilon) line += fmt::format("/{:.4g}", *privacy->budget_epsilon);
    line += fmt::format(" (delta {:.0e})", privacy->delta);
  }
  line += fmt::format(" | {:.2f} s", duration_s);
  return line;
}

}  // namespace huddle::coordinator
