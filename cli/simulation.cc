#include "cli/simulation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "models/dp_sgd.h"

namespace huddle::cli {
namespace {

constexpr uint64_t kSlowdownStream = 0x736c6f77;  // "slow"
constexpr uint64_t kDropoutStream = 0x64726f70;   // "drop"
// An evaluation is a forward pass: about a third of a training step's forward and backward.
constexpr double kEvaluateShare = 1.0 / 3.0;

// The q-quantile of sorted, non-empty `v`, interpolated linearly between ranks.
double Quantile(const std::vector<double>& v, double q) {
  const double rank = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

}  // namespace

// The `simulation` section (SimulationOptions). The virtual clock's settings are refused with
// `clock: real`, naming both keys.
Status ReadSimulation(ConfigMap& sim, SimulationOptions* s) {
  HUDDLE_RETURN_IF_ERROR(sim.Optional("clients", &s->clients, 1, 1 << 20));
  HUDDLE_RETURN_IF_ERROR(sim.Optional("threads", &s->threads, 1, 256));
  std::string clock = "real";
  HUDDLE_RETURN_IF_ERROR(sim.OptionalChoice("clock", &clock, {"real", "virtual"}));
  s->virtual_clock = clock == "virtual";
  if (!s->virtual_clock) {
    for (std::string_view key :
         {"slowdown", "seconds_per_example", "latency_s", "bandwidth_mbit_s", "dropout"}) {
      if (sim.Has(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat(sim.Where(key), " needs ", sim.Where("clock"),
                         ": virtual (with clock: real the simulated clients work in real time)"));
      }
    }
    return sim.Finish();
  }
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap slowdown, sim.Child("slowdown"));
  std::string distribution = "constant";
  HUDDLE_RETURN_IF_ERROR(
      slowdown.OptionalChoice("distribution", &distribution, {"constant", "lognormal"}));
  s->lognormal_slowdown = distribution == "lognormal";
  if (!s->lognormal_slowdown && slowdown.Has("sigma")) {
    return absl::InvalidArgumentError(
        absl::StrCat(slowdown.Where("sigma"), " needs ", slowdown.Where("distribution"),
                     ": lognormal (a constant slowdown is 1 for every client)"));
  }
  HUDDLE_RETURN_IF_ERROR(slowdown.Optional("sigma", &s->slowdown_sigma, 0.0, 5.0));
  HUDDLE_RETURN_IF_ERROR(slowdown.Finish());
  HUDDLE_RETURN_IF_ERROR(sim.Optional("seconds_per_example", &s->seconds_per_example, 0.0, 3600.0));
  HUDDLE_RETURN_IF_ERROR(sim.Optional("latency_s", &s->latency_s, 0.0, 3600.0));
  HUDDLE_RETURN_IF_ERROR(sim.Optional("bandwidth_mbit_s", &s->bandwidth_mbit_s, 1e-3, 1e6));
  HUDDLE_RETURN_IF_ERROR(sim.Optional("dropout", &s->dropout, 0.0, 1.0));
  return sim.Finish();
}

std::vector<double> DrawSlowdowns(const SimulationOptions& sim, uint64_t seed) {
  std::vector<double> out(static_cast<size_t>(std::max<int64_t>(0, sim.clients)), 1.0);
  if (!sim.lognormal_slowdown) return out;
  for (size_t i = 0; i < out.size(); ++i) {
    Rng rng(DeriveSeed(seed, kSlowdownStream, i));
    out[i] = std::exp(sim.slowdown_sigma * rng.Normal());
  }
  return out;
}

int64_t ExamplesTrained(const wire::TrainConfig& train, int64_t shard_size) {
  const int64_t n = std::max<int64_t>(1, shard_size);
  if (train.dp_sgd) {
    // DP-SGD: Poisson batches of the expected size, for the steps the run takes.
    const int64_t batch = std::min(train.dp_sgd->expected_batch_size, n);
    StatusOr<int64_t> steps = models::DpSgdSteps(train.epochs, n, batch);
    if (steps.ok()) return *steps * batch;
  }
  return std::max<int64_t>(1, train.epochs) * n;
}

double ComputeSeconds(const wire::Message& msg, int64_t shard_size, double slowdown,
                      double seconds_per_example) {
  const double per_example = slowdown * seconds_per_example;
  switch (msg.type()) {
    case wire::MessageType::kFitInstruction: {
      const auto& fit = std::get<wire::FitInstruction>(msg.body);
      return per_example * static_cast<double>(ExamplesTrained(fit.train, shard_size));
    }
    case wire::MessageType::kEvaluateInstruction:
      return per_example * kEvaluateShare * static_cast<double>(std::max<int64_t>(1, shard_size));
    default:
      return 0;
  }
}

transport::SimulatedTransportOptions TransportOptions(const SimulationOptions& sim, uint64_t seed,
                                                      std::vector<int64_t> shard_sizes,
                                                      std::vector<double> slowdowns) {
  transport::SimulatedTransportOptions t;
  t.threads = static_cast<int>(sim.threads);
  t.latency_s = sim.latency_s;
  t.bandwidth_bytes_per_s = sim.bandwidth_mbit_s * 1e6 / 8;
  t.dropout.assign(shard_sizes.size(), sim.dropout);
  t.seed = DeriveSeed(seed, kDropoutStream);
  t.compute = [shards = std::move(shard_sizes), slow = std::move(slowdowns),
               spe = sim.seconds_per_example](size_t peer, const wire::Message& msg) {
    if (peer >= shards.size() || peer >= slow.size()) return 0.0;
    return ComputeSeconds(msg, shards[peer], slow[peer], spe);
  };
  return t;
}

SlowdownSummary Summarize(std::vector<double> slowdowns) {
  SlowdownSummary s;
  if (slowdowns.empty()) return s;
  std::sort(slowdowns.begin(), slowdowns.end());
  s.median = Quantile(slowdowns, 0.5);
  s.p10 = Quantile(slowdowns, 0.1);
  s.p90 = Quantile(slowdowns, 0.9);
  const size_t tenth = std::max<size_t>(1, (slowdowns.size() + 9) / 10);
  const double slowest =
      std::accumulate(slowdowns.end() - static_cast<std::ptrdiff_t>(tenth), slowdowns.end(), 0.0) /
      static_cast<double>(tenth);
  s.slowest_decile_ratio = s.median > 0 ? slowest / s.median : 1;
  return s;
}

std::string DescribeVirtualSimulation(const SimulationOptions& sim,
                                      const std::vector<double>& slowdowns) {
  const SlowdownSummary s = Summarize(slowdowns);
  const std::string distribution = sim.lognormal_slowdown
                                       ? fmt::format("lognormal (sigma {:g})", sim.slowdown_sigma)
                                       : std::string("constant");
  return fmt::format(
      "simulating {} clients in-process on {} threads, on a VIRTUAL clock (elapsed times are "
      "simulated): slowdown {}: median {:.3g}, 10th percentile {:.3g}, 90th {:.3g}, slowest tenth "
      "{:.3g}x the median; {:g} s per example, latency {:g} s, {:g} Mbit/s, dropout {:g}",
      sim.clients, sim.threads, distribution, s.median, s.p10, s.p90, s.slowest_decile_ratio,
      sim.seconds_per_example, sim.latency_s, sim.bandwidth_mbit_s, sim.dropout);
}

std::string SimulationJson(const SimulationOptions& sim, uint64_t seed,
                           const std::vector<std::string>& ids,
                           const std::vector<double>& slowdowns, std::optional<uint64_t> dropouts) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["clock"] = sim.virtual_clock ? "virtual" : "real";
  j["clients"] = sim.clients;
  j["threads"] = sim.threads;
  j["seed"] = seed;
  j["slowdown"] = {{"distribution", sim.lognormal_slowdown ? "lognormal" : "constant"}};
  if (sim.lognormal_slowdown) j["slowdown"]["sigma"] = sim.slowdown_sigma;
  const SlowdownSummary s = Summarize(slowdowns);
  j["slowdown"]["median"] = s.median;
  j["slowdown"]["p10"] = s.p10;
  j["slowdown"]["p90"] = s.p90;
  j["slowdown"]["slowest_decile_ratio"] = s.slowest_decile_ratio;
  j["seconds_per_example"] = sim.seconds_per_example;
  j["latency_s"] = sim.latency_s;
  j["bandwidth_mbit_s"] = sim.bandwidth_mbit_s;
  j["dropout"] = sim.dropout;
  if (dropouts) j["instructions_dropped"] = *dropouts;
  Json per_client = Json::object();
  for (size_t i = 0; i < ids.size() && i < slowdowns.size(); ++i) per_client[ids[i]] = slowdowns[i];
  j["client_slowdown"] = std::move(per_client);
  return j.dump(2) + "\n";
}

}  // namespace huddle::cli
