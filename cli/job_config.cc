#include "cli/job_config.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "cli/config_sections.h"
#include "cli/job_checks.h"
#include "cli/simulation.h"
#include "client/silo.h"
#include "common/config_reader.h"
#include "common/tensor_io.h"
#include "kernels/backend.h"
#include "proto/messages.h"

namespace huddle::cli {
namespace {

Status ReadPrivacy(ConfigMap& m, privacy::PrivacyOptions* p) {
  std::string mode = privacy::PrivacyModeName(p->mode);
  HUDDLE_RETURN_IF_ERROR(
      m.OptionalChoice("mode", &mode, {"none", "central", "local", "distributed"}));
  p->mode = mode == "central"       ? privacy::PrivacyMode::kCentral
            : mode == "local"       ? privacy::PrivacyMode::kLocal
            : mode == "distributed" ? privacy::PrivacyMode::kDistributed
                                    : privacy::PrivacyMode::kNone;
  HUDDLE_RETURN_IF_ERROR(m.Optional("clip_norm", &p->clip_norm, 1e-9, 1e9));
  if (m.Has("epsilon")) {
    double eps = 0;
    HUDDLE_RETURN_IF_ERROR(m.Optional("epsilon", &eps, 1e-6, 1e6));
    p->total_epsilon = eps;
  }
  HUDDLE_RETURN_IF_ERROR(m.Optional("delta", &p->delta, 1e-300, 0.5));
  std::string accountant = privacy::AccountantName(p->accountant);
  HUDDLE_RETURN_IF_ERROR(m.OptionalChoice("accountant", &accountant, {"rdp", "pld"}));
  p->accountant =
      accountant == "pld" ? privacy::AccountantKind::kPld : privacy::AccountantKind::kRdp;
  if (m.Has("noise_seed")) {
    int64_t seed = 0;
    HUDDLE_RETURN_IF_ERROR(m.Optional("noise_seed", &seed, 0, INT64_MAX));
    p->noise_seed = static_cast<uint64_t>(seed);
  }
  if (m.Has("expected_cohort_size")) {
    double size = 0;
    HUDDLE_RETURN_IF_ERROR(m.Optional("expected_cohort_size", &size, 1, 1e9));
    p->expected_cohort_size = size;
  }
  HUDDLE_RETURN_IF_ERROR(m.Optional("stop_at_budget", &p->stop_at_budget));
  if (m.Has("max_participations")) {
    int64_t most = 0;
    HUDDLE_RETURN_IF_ERROR(m.Optional("max_participations", &most, 1, 1000000));
    p->max_participations = most;
  }
  HUDDLE_RETURN_IF_ERROR(m.Optional("min_separation", &p->min_separation, 1, 1000000));
  if (m.Has("adaptive_clipping")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap a, m.Child("adaptive_clipping"));
    p->adaptive.enabled = true;
    HUDDLE_RETURN_IF_ERROR(a.Optional("enabled", &p->adaptive.enabled));
    HUDDLE_RETURN_IF_ERROR(a.Optional("target_quantile", &p->adaptive.target_quantile, 0.0, 1.0));
    HUDDLE_RETURN_IF_ERROR(a.Optional("learning_rate", &p->adaptive.learning_rate, 0.0, 10.0));
    HUDDLE_RETURN_IF_ERROR(a.Optional("count_stddev", &p->adaptive.count_stddev, 0.0, 1e9));
    HUDDLE_RETURN_IF_ERROR(a.Finish());
  }
  HUDDLE_ASSIGN_OR_RETURN(std::vector<ConfigMap> ranges, m.ChildList("schedule"));
  for (ConfigMap& r : ranges) {
    privacy::ScheduleRange range;
    std::vector<int64_t> rounds;
    HUDDLE_RETURN_IF_ERROR(r.Optional("rounds", &rounds, 1, 1000000));
    if (rounds.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.Where("rounds"), ": give [first, last] (inclusive, 1-based)"));
    }
    range.first_round = rounds[0];
    range.last_round = rounds[1];
    double v = 0;
    if (r.Has("noise_multiplier")) {
      HUDDLE_RETURN_IF_ERROR(r.Optional("noise_multiplier", &v, 1e-6, 1e6));
      range.noise_multiplier = v;
    }
    if (r.Has("epsilon")) {
      HUDDLE_RETURN_IF_ERROR(r.Optional("epsilon", &v, 1e-6, 1e6));
      range.epsilon = v;
    }
    if (r.Has("clip_norm")) {
      HUDDLE_RETURN_IF_ERROR(r.Optional("clip_norm", &v, 1e-9, 1e9));
      range.clip_norm = v;
    }
    HUDDLE_RETURN_IF_ERROR(r.Finish());
    p->schedule.push_back(range);
  }
  return m.Finish();
}

Status ReadDpSgd(ConfigMap& m, wire::TrainConfig* t) {
  wire::DpSgdConfig dp;
  HUDDLE_RETURN_IF_ERROR(m.Optional("noise_multiplier", &dp.noise_multiplier, 1e-6, 1e6));
  HUDDLE_RETURN_IF_ERROR(m.Optional("clip_norm", &dp.clip_norm, 1e-9, 1e9));
  HUDDLE_RETURN_IF_ERROR(m.Optional("expected_batch_size", &dp.expected_batch_size, 1, 1 << 24));
  HUDDLE_RETURN_IF_ERROR(m.Optional("delta", &dp.delta, 1e-300, 0.5));
  HUDDLE_RETURN_IF_ERROR(m.Finish());
  t->dp_sgd = dp;
  return absl::OkStatus();
}

}  // namespace

namespace {

// `async:` (coordinator::AsyncOptions): buffered asynchronous training.
Status ReadAsync(ConfigMap& top, coordinator::AsyncOptions* a) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap async, top.Child("async"));
  a->enabled = true;
  HUDDLE_RETURN_IF_ERROR(async.Optional("concurrency", &a->concurrency, 1, 1 << 20));
  HUDDLE_RETURN_IF_ERROR(async.Optional("buffer", &a->buffer, 1, 1 << 20));
  HUDDLE_RETURN_IF_ERROR(async.Optional("max_staleness", &a->max_staleness, 0, 1 << 20));
  HUDDLE_RETURN_IF_ERROR(async.Optional("over_selection", &a->over_selection, 1.0, 4.0));
  if (async.Has("staleness")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap st, async.Child("staleness"));
    std::string weight = "polynomial";
    HUDDLE_RETURN_IF_ERROR(
        st.OptionalChoice("weight", &weight, {"constant", "polynomial", "hinge"}));
    using S = coordinator::AsyncOptions::Staleness;
    a->weight = weight == "constant" ? S::kConstant
                : weight == "hinge"  ? S::kHinge
                                     : S::kPolynomial;
    if (a->weight != S::kPolynomial && st.Has("exponent")) {
      return absl::InvalidArgumentError(absl::StrCat(
          st.Where("exponent"), " applies to staleness.weight polynomial, not ", weight));
    }
    for (const char* key : {"hinge_after", "hinge_slope"}) {
      if (a->weight != S::kHinge && st.Has(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat(st.Where(key), " applies to staleness.weight hinge, not ", weight));
      }
    }
    HUDDLE_RETURN_IF_ERROR(st.Optional("exponent", &a->exponent, 0.0, 16.0));
    HUDDLE_RETURN_IF_ERROR(st.Optional("hinge_after", &a->hinge_after, 0, 1 << 20));
    HUDDLE_RETURN_IF_ERROR(st.Optional("hinge_slope", &a->hinge_slope, 1e-6, 1e6));
    HUDDLE_RETURN_IF_ERROR(st.Finish());
  }
  return async.Finish();
}

// The `evaluation` section: every `every` rounds and after the last, by the coordinator on its
// test set (`mode: server`, the default: `data`, `format`, `scale_255`; ResolveEvaluationData
// settles them once the data section is read) or by the clients on their own data
// (`mode: federated`: `clients`, `deadline_s`, `max_weight_ratio`). An external model cannot be
// evaluated by the coordinator: server mode then evaluates nothing.
Status ReadEvaluation(ConfigMap& eval, JobConfig* job) {
  coordinator::CoordinatorOptions& o = job->coordinator;
  std::string mode = "server";
  HUDDLE_RETURN_IF_ERROR(eval.OptionalChoice("mode", &mode, {"server", "federated"}));
  HUDDLE_RETURN_IF_ERROR(eval.Optional("every", &o.eval_every, 0, 1000000));
  if (mode == "server") {
    for (std::string_view key : {"clients", "deadline_s", "max_weight_ratio"}) {
      if (eval.Has(key)) {
        return absl::InvalidArgumentError(absl::StrCat(
            eval.Where(key), " is for mode: federated (the clients evaluate the model)"));
      }
    }
    if (o.model.external() && (eval.Has("data") || (eval.Has("every") && o.eval_every > 0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          eval.Where(eval.Has("data") ? "data" : "every"),
          ": the model is external (only its tensors are known), so the coordinator cannot "
          "evaluate it; use evaluation: {mode: federated} to have the clients evaluate it with "
          "their own trainers"));
    }
    HUDDLE_RETURN_IF_ERROR(eval.OptionalPath("data", &job->eval_data));
    HUDDLE_RETURN_IF_ERROR(eval.OptionalChoice("format", &job->eval_format, {"idx", "csv"}));
    HUDDLE_RETURN_IF_ERROR(eval.Optional("scale_255", &job->eval_scale_255));
    if (o.model.external()) o.eval_every = 0;  // nothing on the server can run it
    return eval.Finish();
  }
  for (std::string_view key : {"data", "format", "scale_255"}) {
    if (eval.Has(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(eval.Where(key),
                       " is for mode: server; federated evaluation uses the clients' own data"));
    }
  }
  o.eval_mode = coordinator::CoordinatorOptions::EvalMode::kFederated;
  coordinator::FederatedEvalOptions& f = o.federated_eval;
  HUDDLE_RETURN_IF_ERROR(eval.Optional("clients", &f.clients, 1, 1 << 24));
  HUDDLE_RETURN_IF_ERROR(eval.OptionalSeconds("deadline_s", &f.deadline_ms, 0.1, 7 * 86400));
  HUDDLE_RETURN_IF_ERROR(eval.Optional("max_weight_ratio", &f.max_weight_ratio, 1.0, 1e6));
  return eval.Finish();
}

Status ReadSecureAggregation(ConfigMap& m, coordinator::SecureAggregationOptions* a) {
  HUDDLE_RETURN_IF_ERROR(m.Optional("enabled", &a->enabled));
  HUDDLE_RETURN_IF_ERROR(m.Optional("corrupt_fraction", &a->graph.corrupt_fraction, 0.0, 0.499));
  HUDDLE_RETURN_IF_ERROR(m.Optional("dropout_fraction", &a->graph.dropout_fraction, 0.0, 0.99));
  int64_t bits = a->graph.security_bits, reliability = a->graph.reliability_bits;
  HUDDLE_RETURN_IF_ERROR(m.Optional("security_bits", &bits, 8, 128));
  HUDDLE_RETURN_IF_ERROR(m.Optional("reliability_bits", &reliability, 1, 64));
  a->graph.security_bits = static_cast<int>(bits);
  a->graph.reliability_bits = static_cast<int>(reliability);
  int64_t neighbours = 0, threshold = 0, word_bits = 0;
  HUDDLE_RETURN_IF_ERROR(m.Optional("neighbours", &neighbours, 1, 400));
  HUDDLE_RETURN_IF_ERROR(m.Optional("threshold", &threshold, 1, 400));
  if ((neighbours > 0) != (threshold > 0) || threshold > neighbours) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure_aggregation: neighbours (", neighbours, ") and threshold (", threshold,
                     ") go together, with threshold <= neighbours (or leave both out: chosen from "
                     "corrupt_fraction and dropout_fraction)"));
  }
  a->neighbours = static_cast<int>(neighbours);
  a->threshold = static_cast<int>(threshold);
  HUDDLE_RETURN_IF_ERROR(m.Optional("min_survivors", &a->min_survivor_fraction, 0.0, 1.0));
  HUDDLE_RETURN_IF_ERROR(
      m.OptionalSeconds("stage_timeout_s", &a->stage_timeout_ms, 0.1, 7 * 86400));
  HUDDLE_RETURN_IF_ERROR(m.Optional("bits", &word_bits, 32, 64));
  if (word_bits != 0 && word_bits != 32 && word_bits != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure_aggregation.bits is ", word_bits, ": 32 or 64 (or leave it out)"));
  }
  a->bits = static_cast<int>(word_bits);
  return m.Finish();
}

}  // namespace

StatusOr<JobConfig> LoadJobConfig(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::LoadFile(path));
  JobConfig job;
  coordinator::CoordinatorOptions& o = job.coordinator;
  int64_t seed = static_cast<int64_t>(o.seed);
  HUDDLE_RETURN_IF_ERROR(top.Optional("name", &o.job_name));
  HUDDLE_RETURN_IF_ERROR(top.Optional("seed", &seed, 0, INT64_MAX));
  o.seed = static_cast<uint64_t>(seed);
  HUDDLE_RETURN_IF_ERROR(top.Optional("rounds", &o.rounds, 1, 1000000));
  HUDDLE_RETURN_IF_ERROR(top.OptionalChoice("log_level", &job.log_level,
                                            {"trace", "debug", "info", "warn", "error", "off"}));

  HUDDLE_RETURN_IF_ERROR(ReadModel(top, &o.model, &o.initial_model));

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap train, top.Child("train"));
  HUDDLE_RETURN_IF_ERROR(ReadSgd(train, &o.train, /*max_epochs=*/1000));
  if (train.Has("dp_sgd")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap dp, train.Child("dp_sgd"));
    HUDDLE_RETURN_IF_ERROR(ReadDpSgd(dp, &o.train));
    // An external model's DP-SGD is its clients' own trainers' (they report what they ran).
    if (!o.model.external()) HUDDLE_RETURN_IF_ERROR(DpSgdFitsModel(train, o.model));
  }
  HUDDLE_RETURN_IF_ERROR(train.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap cohort, top.Child("cohort"));
  std::string sampling = "fixed";
  HUDDLE_RETURN_IF_ERROR(cohort.OptionalChoice("sampling", &sampling, {"fixed", "poisson"}));
  o.cohort.sampling = sampling == "poisson" ? coordinator::CohortOptions::Sampling::kPoisson
                                            : coordinator::CohortOptions::Sampling::kFixed;
  HUDDLE_RETURN_IF_ERROR(cohort.Optional("size", &o.cohort.size, 1, 1 << 24));
  HUDDLE_RETURN_IF_ERROR(cohort.Optional("rate", &o.cohort.rate, 1e-9, 1.0));
  HUDDLE_RETURN_IF_ERROR(cohort.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap round, top.Child("round"));
  HUDDLE_RETURN_IF_ERROR(round.OptionalSeconds("deadline_s", &o.round_deadline_ms, 0.1, 7 * 86400));
  HUDDLE_RETURN_IF_ERROR(round.Optional("quorum", &o.quorum, 1, 1 << 24));
  HUDDLE_RETURN_IF_ERROR(round.Optional("upload_slots", &o.upload_slots, 1, 4096));
  HUDDLE_RETURN_IF_ERROR(
      round.OptionalSeconds("upload_timeout_s", &o.upload_timeout_ms, 0.1, 7 * 86400));
  const bool has_quorum = round.Has("quorum");
  HUDDLE_RETURN_IF_ERROR(round.Finish());
  if (top.Has("async")) {
    HUDDLE_RETURN_IF_ERROR(ReadAsync(top, &o.async));
    // What lock-step rounds alone use: refused rather than silently ignored.
    for (const char* key : {"size", "rate", "sampling"}) {
      if (cohort.Has(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat(cohort.Where(key),
                         " does not apply with async (its clients are drawn one task at a "
                         "time: async.concurrency sets how many train at once)"));
      }
    }
    if (has_quorum) {
      return absl::InvalidArgumentError(
          "round.quorum does not apply with async (every server step takes async.buffer "
          "updates)");
    }
  }

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap server, top.Child("server"));
  HUDDLE_RETURN_IF_ERROR(server.Optional("learning_rate", &o.server.learning_rate, 1e-9, 100.0));
  HUDDLE_RETURN_IF_ERROR(server.Optional("momentum", &o.server.momentum, 0.0, 0.999));
  HUDDLE_RETURN_IF_ERROR(server.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap agg, top.Child("aggregation"));
  HUDDLE_RETURN_IF_ERROR(agg.Optional("max_update_abs", &o.aggregation.max_abs_value, 1e-6, 1e12));
  HUDDLE_RETURN_IF_ERROR(
      agg.Optional("max_examples", &o.aggregation.max_weight, 1, int64_t{1} << 40));
  // max_update_norm: auto (the default: a multiple of recent updates' median norm), off or 0
  // (no norm bound), or a fixed L2 norm.
  std::string norm_bound = "auto";
  HUDDLE_RETURN_IF_ERROR(agg.Optional("max_update_norm", &norm_bound));
  HUDDLE_RETURN_IF_ERROR(agg.Optional("auto_norm_factor", &o.auto_norm_factor, 1.0, 1e6));
  if (norm_bound == "off") {
    o.max_update_norm = 0;
    o.auto_norm_factor = 0;
  } else if (norm_bound != "auto") {
    double x = 0;
    if (!absl::SimpleAtod(norm_bound, &x) || !std::isfinite(x) || x < 0 || x > 1e12) {
      return absl::InvalidArgumentError(
          absl::StrCat(agg.Where("max_update_norm"), ": '", norm_bound,
                       "' is not auto, off or an L2 norm in [0, 1e12] (0: off)"));
    }
    o.max_update_norm = x;
    if (x == 0) o.auto_norm_factor = 0;
  }
  if (norm_bound != "auto" && agg.Has("auto_norm_factor")) {
    return absl::InvalidArgumentError(
        absl::StrCat(agg.Where("auto_norm_factor"),
                     " applies only with max_update_norm: auto (it is '", norm_bound, "')"));
  }
  HUDDLE_RETURN_IF_ERROR(agg.Optional("max_weight_ratio", &o.max_weight_ratio, 0.0, 1e12));
  HUDDLE_RETURN_IF_ERROR(agg.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap eval, top.Child("evaluation"));
  HUDDLE_RETURN_IF_ERROR(ReadEvaluation(eval, &job));

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap coord, top.Child("coordinator"));
  const bool coord_has_min_clients = coord.Has("min_clients");
  HUDDLE_RETURN_IF_ERROR(coord.Optional("bind", &job.bind));
  // Default: a fixed-size cohort waits for a full cohort; Poisson sampling and asynchronous
  // training (which sends work to each client as it joins) for one client.
  o.min_clients =
      o.cohort.sampling == coordinator::CohortOptions::Sampling::kFixed && !o.async.enabled
          ? o.cohort.size
          : 1;
  HUDDLE_RETURN_IF_ERROR(coord.Optional("min_clients", &o.min_clients, 1, 1 << 24));
  HUDDLE_RETURN_IF_ERROR(
      coord.OptionalSeconds("wait_for_clients_s", &o.wait_for_clients_ms, 0.1, 7 * 86400));
  HUDDLE_RETURN_IF_ERROR(
      coord.OptionalSeconds("heartbeat_interval_s", &o.heartbeat_interval_ms, 0.05, 3600));
  HUDDLE_RETURN_IF_ERROR(coord.OptionalSeconds("client_timeout_s", &o.client_timeout_ms, 0, 86400));
  HUDDLE_RETURN_IF_ERROR(
      coord.Optional("max_rounds_without_update", &o.max_rounds_without_update, 1, 1000000));
  HUDDLE_RETURN_IF_ERROR(coord.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap data, top.Child("data"));
  // A service job names the data set its agents declare (`huddle serve`; `huddle run` ignores it).
  HUDDLE_RETURN_IF_ERROR(data.Optional("name", &job.data_name));
  if (!job.data_name.empty() && !wire::IsValidClientId(job.data_name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(data.Where("name"), " '", job.data_name.substr(0, 64),
                     "' is not a data set name: 1-128 characters of [A-Za-z0-9._-]"));
  }
  job.client_data.partitioned = true;
  job.client_data.partition.seed = o.seed;
  HUDDLE_RETURN_IF_ERROR(data::ReadDataSpec(data, &job.client_data, /*shard_keys=*/false));
  HUDDLE_RETURN_IF_ERROR(CheckClientData(data, job));
  HUDDLE_RETURN_IF_ERROR(ResolveEvaluationData(eval, job.client_data, &job));

  HUDDLE_RETURN_IF_ERROR(top.Optional("clients", &job.local_clients, 1, 4096));
  {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap client, top.Child("client"));
    HUDDLE_RETURN_IF_ERROR(client::ReadDevice(client, &job.client_device));
    HUDDLE_RETURN_IF_ERROR(client::ReadSilo(client, &job.client_silo_nproc));
    HUDDLE_RETURN_IF_ERROR(client.Finish());
  }
  if (top.Has("simulation")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap sim, top.Child("simulation"));
    SimulationOptions s;
    HUDDLE_RETURN_IF_ERROR(ReadSimulation(sim, &s));
    job.simulation = s;
    if (!coord_has_min_clients) o.min_clients = s.clients;
  } else {
    (void)top.Child("simulation");
  }

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap sec, top.Child("security"));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("server_secret_key", &job.security.server_secret_key));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("allowed_clients", &job.security.allowed_clients));
  HUDDLE_RETURN_IF_ERROR(
      sec.OptionalSeconds("reload_interval_s", &job.security.reload_interval_ms, 0.1, 86400));
  HUDDLE_RETURN_IF_ERROR(
      sec.Optional("max_messages_per_s", &job.security.max_messages_per_s, 0, 1e6));
  HUDDLE_RETURN_IF_ERROR(sec.Optional("burst_messages", &job.security.burst_messages, 1, 1e6));
  HUDDLE_RETURN_IF_ERROR(sec.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap priv, top.Child("privacy"));
  HUDDLE_RETURN_IF_ERROR(ReadPrivacy(priv, &o.privacy));

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap secagg, top.Child("secure_aggregation"));
  HUDDLE_RETURN_IF_ERROR(ReadSecureAggregation(secagg, &o.secure_aggregation));

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap output, top.Child("output"));
  HUDDLE_RETURN_IF_ERROR(output.Optional("dir", &o.out_dir));
  HUDDLE_RETURN_IF_ERROR(output.Finish());
  HUDDLE_RETURN_IF_ERROR(top.Finish());

  if (job.simulation && job.client_silo_nproc > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": client.silo.nproc (", job.client_silo_nproc,
        ") applies to the client processes `huddle run` starts; simulated clients train on one "
        "thread each (remove the simulation section or client.silo)"));
  }
  if (Status st = coordinator::ValidateOptions(o); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
  }
  // The clients the job's own configuration names: those `huddle run` simulates or starts.
  std::optional<int64_t> population;
  if (job.simulation) {
    population = job.simulation->clients;
  } else if (top.Has("clients")) {
    population = job.local_clients;
  }
  HUDDLE_RETURN_IF_ERROR(CheckPrivacyPlan(path, population, &job));
  return job;
}

void LogStartNotes(const JobConfig& job) {
  for (const std::string& note : job.notes) spdlog::info("{}", note);
  for (const std::string& warning : job.warnings) spdlog::warn("{}", warning);
}

}  // namespace huddle::cli
