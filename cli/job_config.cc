#include "cli/job_config.h"

#include <algorithm>
#include <type_traits>

#include "client/silo.h"
#include "common/config_reader.h"
#include "kernels/backend.h"

namespace huddle::cli {
namespace {

// Reads seconds (a float) into milliseconds.
Status OptionalSeconds(ConfigMap& m, const char* key, int64_t* out_ms, double lo, double hi) {
  double s = static_cast<double>(*out_ms) / 1000.0;
  HUDDLE_RETURN_IF_ERROR(m.Optional(key, &s, lo, hi));
  *out_ms = static_cast<int64_t>(s * 1000.0);
  return absl::OkStatus();
}

Status ReadDataSpec(ConfigMap& m, data::DataSpec* spec, bool shard_keys) {
  HUDDLE_RETURN_IF_ERROR(m.OptionalPath("path", &spec->path));
  HUDDLE_RETURN_IF_ERROR(m.OptionalChoice("format", &spec->format, {"idx", "csv"}));
  std::string partition =
      spec->partitioned
          ? (spec->partition.kind == data::PartitionOptions::Kind::kIid ? "iid" : "dirichlet")
          : "none";
  HUDDLE_RETURN_IF_ERROR(m.OptionalChoice("partition", &partition, {"none", "iid", "dirichlet"}));
  spec->partitioned = partition != "none";
  spec->partition.kind = partition == "dirichlet" ? data::PartitionOptions::Kind::kDirichlet
                                                  : data::PartitionOptions::Kind::kIid;
  HUDDLE_RETURN_IF_ERROR(m.Optional("alpha", &spec->partition.alpha, 1e-3, 1e6));
  HUDDLE_RETURN_IF_ERROR(m.Optional("num_classes", &spec->num_classes, 2, 1 << 16));
  HUDDLE_RETURN_IF_ERROR(m.Optional("scale_255", &spec->csv_scale_255));
  int64_t seed = static_cast<int64_t>(spec->partition.seed);
  HUDDLE_RETURN_IF_ERROR(m.Optional("seed", &seed, 0, INT64_MAX));
  spec->partition.seed = static_cast<uint64_t>(seed);
  if (shard_keys) {
    HUDDLE_RETURN_IF_ERROR(m.Optional("num_shards", &spec->partition.num_shards, 1, 1 << 20));
    HUDDLE_RETURN_IF_ERROR(m.Optional("shard", &spec->shard, 0, (1 << 20) - 1));
  }
  return m.Finish();
}

Status ReadPrivacy(ConfigMap& m, privacy::PrivacyOptions* p) {
  std::string mode = privacy::PrivacyModeName(p->mode);
  HUDDLE_RETURN_IF_ERROR(m.OptionalChoice("mode", &mode, {"none", "central", "local"}));
  p->mode = mode == "central" ? privacy::PrivacyMode::kCentral
            : mode == "local" ? privacy::PrivacyMode::kLocal
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

// A key that must be present, in [lo, hi].
template <typename T>
Status Required(ConfigMap& m, std::string_view key, T* out, std::type_identity_t<T> lo,
                std::type_identity_t<T> hi) {
  if (!m.Has(key)) return absl::InvalidArgumentError(absl::StrCat(m.Where(key), " is required"));
  return m.Optional(key, out, lo, hi);
}

// One entry of `model.layers`: a mapping with one key, the layer kind, whose value holds the
// layer's options (or is empty).
Status ReadLayer(ConfigMap& item, models::LayerSpec* layer) {
  const std::vector<std::string> keys = item.Keys();
  if (keys.size() != 1) {
    std::string where = item.Where("");
    where.pop_back();  // the '.' before an empty key
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     " must be a mapping with one key, the layer kind (e.g. {conv2d: {out: 32, "
                     "kernel: 5}} or {relu: {}}); it has ",
                     keys.size()));
  }
  StatusOr<models::LayerKind> kind = models::ParseLayerKind(keys[0]);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(item.Where(keys[0]), ": ", kind.status().message()));
  }
  layer->kind = *kind;
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap options, item.Child(keys[0]));
  constexpr int64_t kMax = int64_t{1} << 24;
  switch (layer->kind) {
    case models::LayerKind::kDense:
      HUDDLE_RETURN_IF_ERROR(Required(options, "out", &layer->out, 1, kMax));
      break;
    case models::LayerKind::kConv2d:
      HUDDLE_RETURN_IF_ERROR(Required(options, "out", &layer->out, 1, kMax));
      HUDDLE_RETURN_IF_ERROR(Required(options, "kernel", &layer->kernel, 1, 64));
      HUDDLE_RETURN_IF_ERROR(options.Optional("stride", &layer->stride, 1, 64));
      HUDDLE_RETURN_IF_ERROR(options.Optional("padding", &layer->padding, 0, 63));
      break;
    case models::LayerKind::kMaxPool2d:
    case models::LayerKind::kAvgPool2d:
      HUDDLE_RETURN_IF_ERROR(Required(options, "kernel", &layer->kernel, 1, 64));
      HUDDLE_RETURN_IF_ERROR(options.Optional("stride", &layer->stride, 1, 64));
      HUDDLE_RETURN_IF_ERROR(options.Optional("padding", &layer->padding, 0, 32));
      break;
    case models::LayerKind::kGroupNorm:
      HUDDLE_RETURN_IF_ERROR(Required(options, "groups", &layer->groups, 1, kMax));
      break;
    case models::LayerKind::kDropout:
      HUDDLE_RETURN_IF_ERROR(Required(options, "rate", &layer->rate, 0.0, 0.99));
      break;
    case models::LayerKind::kScattering2d:
      layer->scales = 2;
      layer->angles = 8;
      HUDDLE_RETURN_IF_ERROR(options.Optional("scales", &layer->scales, 1, 4));
      HUDDLE_RETURN_IF_ERROR(options.Optional("angles", &layer->angles, 1, 16));
      break;
    default:
      break;
  }
  HUDDLE_RETURN_IF_ERROR(options.Finish());
  return item.Finish();
}

// The `model` section: `kind: mlp` (the default; input_dim, hidden defaulting to [128],
// num_classes, batch_norm) or a layer list (`input` and `layers`, kind `layers`).
Status ReadModel(ConfigMap& top, models::ModelSpec* spec) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap model, top.Child("model"));
  const bool has_layers = model.Has("layers");
  std::string kind = has_layers ? "layers" : "mlp";
  HUDDLE_RETURN_IF_ERROR(model.OptionalChoice("kind", &kind, {"mlp", "layers"}));
  if (kind == "mlp") {
    if (has_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(model.Where("layers"),
                       " is for kind: layers; kind: mlp takes input_dim, "
                       "hidden, num_classes and batch_norm"));
    }
    models::MlpSpec mlp;
    HUDDLE_RETURN_IF_ERROR(model.Optional("input_dim", &mlp.input_dim, 1, 1 << 24));
    HUDDLE_RETURN_IF_ERROR(model.Optional("hidden", &mlp.hidden, 1, 1 << 16));
    HUDDLE_RETURN_IF_ERROR(model.Optional("num_classes", &mlp.num_classes, 2, 1 << 16));
    HUDDLE_RETURN_IF_ERROR(model.Optional("batch_norm", &mlp.batch_norm));
    HUDDLE_RETURN_IF_ERROR(model.Finish());
    if (mlp.hidden.empty()) mlp.hidden = {128};
    *spec = mlp;
    return absl::OkStatus();
  }
  for (std::string_view mlp_key : {"input_dim", "hidden", "num_classes", "batch_norm"}) {
    if (model.Has(mlp_key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          model.Where(mlp_key), " is for kind: mlp; a layer list takes input and layers"));
    }
  }
  models::ModelSpec layers;
  layers.input.clear();
  HUDDLE_RETURN_IF_ERROR(model.Optional("input", &layers.input, 1, 1 << 24));
  if (layers.input.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model.Where("input"),
                     " is required with layers: one example's shape, [features] or "
                     "[channels, height, width] (e.g. [1, 28, 28])"));
  }
  HUDDLE_ASSIGN_OR_RETURN(std::vector<ConfigMap> items, model.ChildList("layers"));
  for (ConfigMap& item : items) {
    HUDDLE_RETURN_IF_ERROR(ReadLayer(item, &layers.layers.emplace_back()));
  }
  HUDDLE_RETURN_IF_ERROR(model.Finish());
  if (Status st = models::ValidateModelSpec(layers); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(model.Where("layers"), ": ", st.message()));
  }
  *spec = std::move(layers);
  return absl::OkStatus();
}

// `train.dp_sgd` cannot train every model (models::CheckDpSgdModel).
Status DpSgdFitsModel(ConfigMap& train, const models::ModelSpec& model) {
  if (Status st = models::CheckDpSgdModel(model); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(train.Where("dp_sgd"), ": ", st.message()));
  }
  return absl::OkStatus();
}

// The SGD keys of a `train` section (a client's local epochs in a federated job, a datacenter
// job's epochs), into wire::TrainConfig or models::TrainOptions.
template <typename Train>
Status ReadSgd(ConfigMap& train, Train* t, int64_t max_epochs) {
  HUDDLE_RETURN_IF_ERROR(train.Optional("epochs", &t->epochs, 1, max_epochs));
  HUDDLE_RETURN_IF_ERROR(train.Optional("batch_size", &t->batch_size, 1, 65536));
  HUDDLE_RETURN_IF_ERROR(train.Optional("learning_rate", &t->learning_rate, 1e-9, 100.0));
  HUDDLE_RETURN_IF_ERROR(train.Optional("momentum", &t->momentum, 0.0, 0.999));
  return train.Optional("weight_decay", &t->weight_decay, 0.0, 1.0);
}

// `device: auto | cpu | cuda[:N]`, checked here so a typo fails before anything starts.
Status ReadDevice(ConfigMap& map, std::string* device) {
  HUDDLE_RETURN_IF_ERROR(map.Optional("device", device));
  if (Status st = kernels::ParseDeviceRequest(*device).status(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(map.Where("device"), ": ", st.message()));
  }
  return absl::OkStatus();
}

// `silo: {nproc: N}` in a client's settings: N ranks train as that one client (client/silo.h).
Status ReadSilo(ConfigMap& parent, int64_t* nproc) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap silo, parent.Child("silo"));
  HUDDLE_RETURN_IF_ERROR(silo.Optional("nproc", nproc, 1, client::kMaxSiloRanks));
  return silo.Finish();
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

  HUDDLE_RETURN_IF_ERROR(ReadModel(top, &o.model));

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap train, top.Child("train"));
  HUDDLE_RETURN_IF_ERROR(ReadSgd(train, &o.train, /*max_epochs=*/1000));
  if (train.Has("dp_sgd")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap dp, train.Child("dp_sgd"));
    HUDDLE_RETURN_IF_ERROR(ReadDpSgd(dp, &o.train));
    HUDDLE_RETURN_IF_ERROR(DpSgdFitsModel(train, o.model));
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
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(round, "deadline_s", &o.round_deadline_ms, 0.1, 7 * 86400));
  HUDDLE_RETURN_IF_ERROR(round.Optional("quorum", &o.quorum, 1, 1 << 24));
  HUDDLE_RETURN_IF_ERROR(round.Optional("upload_slots", &o.upload_slots, 1, 4096));
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(round, "upload_timeout_s", &o.upload_timeout_ms, 0.1, 7 * 86400));
  HUDDLE_RETURN_IF_ERROR(round.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap server, top.Child("server"));
  HUDDLE_RETURN_IF_ERROR(server.Optional("learning_rate", &o.server.learning_rate, 1e-9, 100.0));
  HUDDLE_RETURN_IF_ERROR(server.Optional("momentum", &o.server.momentum, 0.0, 0.999));
  HUDDLE_RETURN_IF_ERROR(server.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap agg, top.Child("aggregation"));
  HUDDLE_RETURN_IF_ERROR(agg.Optional("max_update_abs", &o.aggregation.max_abs_value, 1e-6, 1e12));
  HUDDLE_RETURN_IF_ERROR(
      agg.Optional("max_examples", &o.aggregation.max_weight, 1, int64_t{1} << 40));
  HUDDLE_RETURN_IF_ERROR(agg.Optional("max_update_norm", &o.max_update_norm, 0.0, 1e12));
  HUDDLE_RETURN_IF_ERROR(agg.Optional("max_weight_ratio", &o.max_weight_ratio, 0.0, 1e12));
  HUDDLE_RETURN_IF_ERROR(agg.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap eval, top.Child("evaluation"));
  HUDDLE_RETURN_IF_ERROR(eval.Optional("every", &o.eval_every, 0, 1000000));
  HUDDLE_RETURN_IF_ERROR(eval.OptionalPath("data", &job.eval_data));
  HUDDLE_RETURN_IF_ERROR(eval.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap coord, top.Child("coordinator"));
  const bool coord_has_min_clients = coord.Has("min_clients");
  HUDDLE_RETURN_IF_ERROR(coord.Optional("bind", &job.bind));
  // Default: a fixed-size cohort waits for a full cohort; Poisson sampling for one client.
  o.min_clients =
      o.cohort.sampling == coordinator::CohortOptions::Sampling::kFixed ? o.cohort.size : 1;
  HUDDLE_RETURN_IF_ERROR(coord.Optional("min_clients", &o.min_clients, 1, 1 << 24));
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(coord, "wait_for_clients_s", &o.wait_for_clients_ms, 0.1, 7 * 86400));
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(coord, "heartbeat_interval_s", &o.heartbeat_interval_ms, 0.05, 3600));
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(coord, "client_timeout_s", &o.client_timeout_ms, 0, 86400));
  HUDDLE_RETURN_IF_ERROR(
      coord.Optional("max_rounds_without_update", &o.max_rounds_without_update, 1, 1000000));
  HUDDLE_RETURN_IF_ERROR(coord.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap data, top.Child("data"));
  job.client_data.partitioned = true;
  job.client_data.partition.seed = o.seed;
  HUDDLE_RETURN_IF_ERROR(ReadDataSpec(data, &job.client_data, /*shard_keys=*/false));

  HUDDLE_RETURN_IF_ERROR(top.Optional("clients", &job.local_clients, 1, 4096));
  {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap client, top.Child("client"));
    HUDDLE_RETURN_IF_ERROR(ReadDevice(client, &job.client_device));
    HUDDLE_RETURN_IF_ERROR(ReadSilo(client, &job.client_silo_nproc));
    HUDDLE_RETURN_IF_ERROR(client.Finish());
  }
  if (top.Has("simulation")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap sim, top.Child("simulation"));
    SimulationOptions s;
    HUDDLE_RETURN_IF_ERROR(sim.Optional("clients", &s.clients, 1, 1 << 20));
    HUDDLE_RETURN_IF_ERROR(sim.Optional("threads", &s.threads, 1, 256));
    HUDDLE_RETURN_IF_ERROR(sim.Finish());
    job.simulation = s;
    if (!coord_has_min_clients) o.min_clients = s.clients;
  } else {
    (void)top.Child("simulation");
  }

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap sec, top.Child("security"));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("server_secret_key", &job.security.server_secret_key));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("allowed_clients", &job.security.allowed_clients));
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(sec, "reload_interval_s", &job.security.reload_interval_ms, 0.1, 86400));
  HUDDLE_RETURN_IF_ERROR(
      sec.Optional("max_messages_per_s", &job.security.max_messages_per_s, 0, 1e6));
  HUDDLE_RETURN_IF_ERROR(sec.Optional("burst_messages", &job.security.burst_messages, 1, 1e6));
  HUDDLE_RETURN_IF_ERROR(sec.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap priv, top.Child("privacy"));
  HUDDLE_RETURN_IF_ERROR(ReadPrivacy(priv, &o.privacy));

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap output, top.Child("output"));
  HUDDLE_RETURN_IF_ERROR(output.Optional("dir", &o.out_dir));
  HUDDLE_RETURN_IF_ERROR(output.Finish());
  HUDDLE_RETURN_IF_ERROR(top.Finish());

  if (o.quorum > o.cohort.size &&
      o.cohort.sampling == coordinator::CohortOptions::Sampling::kFixed) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": round.quorum (", o.quorum,
                                                   ") exceeds cohort.size (", o.cohort.size,
                                                   "): no round could ever update the model"));
  }
  if (o.privacy.mode != privacy::PrivacyMode::kNone && o.max_update_norm > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": aggregation.max_update_norm applies to jobs without client-level DP; under "
        "privacy.mode every update is already bounded by privacy.clip_norm (remove one)"));
  }
  if (job.simulation && job.client_silo_nproc > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": client.silo.nproc (", job.client_silo_nproc,
        ") applies to the client processes `huddle run` starts; simulated clients train on one "
        "thread each (remove the simulation section or client.silo)"));
  }
  if (o.privacy.mode == privacy::PrivacyMode::kCentral &&
      o.cohort.sampling != coordinator::CohortOptions::Sampling::kPoisson) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": privacy.mode central needs cohort.sampling: poisson (the accountant's "
                     "amplification by sampling holds only for Poisson-sampled cohorts)"));
  }
  if (o.privacy.mode == privacy::PrivacyMode::kCentral && !o.privacy.expected_cohort_size) {
    // The DP mean's fixed denominator: the population the job's own configuration names (the
    // clients `huddle run` starts or simulates), never the clients that happen to enrol.
    const double population =
        static_cast<double>(job.simulation ? job.simulation->clients : job.local_clients);
    o.privacy.expected_cohort_size = std::max(1.0, o.cohort.rate * population);
  }
  if (o.privacy.mode != privacy::PrivacyMode::kNone) {
    // Validates the budget now, so a typo or an impossible budget fails before any client joins.
    auto plan = privacy::PrivacyPlan::Create(o.privacy, o.cohort.rate, o.rounds);
    if (!plan.ok())
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", plan.status().message()));
  }
  return job;
}

StatusOr<DatacenterConfig> LoadDatacenterConfig(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::LoadFile(path));
  DatacenterConfig c;
  HUDDLE_RETURN_IF_ERROR(top.Optional("name", &c.job_name));
  int64_t seed = 0;
  HUDDLE_RETURN_IF_ERROR(top.Optional("seed", &seed, 0, INT64_MAX));
  c.seed = static_cast<uint64_t>(seed);
  HUDDLE_RETURN_IF_ERROR(top.OptionalChoice("log_level", &c.log_level,
                                            {"trace", "debug", "info", "warn", "error", "off"}));
  HUDDLE_RETURN_IF_ERROR(ReadModel(top, &c.model));

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap train, top.Child("train"));
  HUDDLE_RETURN_IF_ERROR(ReadSgd(train, &c.train, /*max_epochs=*/100000));
  if (train.Has("dp_sgd")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap dp, train.Child("dp_sgd"));
    DatacenterDpSgd d;
    HUDDLE_RETURN_IF_ERROR(dp.Optional("noise_multiplier", &d.dp.noise_multiplier, 0.0, 1e6));
    HUDDLE_RETURN_IF_ERROR(dp.Optional("clip_norm", &d.dp.clip_norm, 1e-9, 1e9));
    HUDDLE_RETURN_IF_ERROR(
        dp.Optional("expected_batch_size", &d.dp.expected_batch_size, 1, int64_t{1} << 24));
    HUDDLE_RETURN_IF_ERROR(dp.Optional("delta", &d.delta, 1e-300, 0.5));
    if (dp.Has("epsilon")) {
      double eps = 0;
      HUDDLE_RETURN_IF_ERROR(dp.Optional("epsilon", &eps, 1e-6, 1e6));
      d.epsilon_budget = eps;
    }
    std::string accountant = "rdp";
    HUDDLE_RETURN_IF_ERROR(dp.OptionalChoice("accountant", &accountant, {"rdp", "pld"}));
    d.accountant =
        accountant == "pld" ? privacy::AccountantKind::kPld : privacy::AccountantKind::kRdp;
    HUDDLE_RETURN_IF_ERROR(dp.Finish());
    HUDDLE_RETURN_IF_ERROR(DpSgdFitsModel(train, c.model));
    c.dp_sgd = d;
  }
  HUDDLE_RETURN_IF_ERROR(train.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap data, top.Child("data"));
  HUDDLE_RETURN_IF_ERROR(data.OptionalPath("path", &c.data.path));
  HUDDLE_RETURN_IF_ERROR(data.OptionalChoice("format", &c.data.format, {"idx", "csv"}));
  HUDDLE_RETURN_IF_ERROR(data.Optional("num_classes", &c.data.num_classes, 2, 1 << 16));
  HUDDLE_RETURN_IF_ERROR(data.Optional("scale_255", &c.data.csv_scale_255));
  HUDDLE_RETURN_IF_ERROR(data.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap eval, top.Child("evaluation"));
  HUDDLE_RETURN_IF_ERROR(eval.Optional("every", &c.eval_every, 0, 1000000));
  HUDDLE_RETURN_IF_ERROR(eval.OptionalPath("data", &c.eval_data));
  HUDDLE_RETURN_IF_ERROR(eval.Optional("target_accuracy", &c.target_accuracy, 0.0, 1.0));
  HUDDLE_RETURN_IF_ERROR(eval.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap dc, top.Child("datacenter"));
  HUDDLE_RETURN_IF_ERROR(dc.Optional("nproc", &c.nproc, 1, 1024));
  HUDDLE_RETURN_IF_ERROR(dc.OptionalChoice("device", &c.device, {"cpu", "cuda", "auto"}));
  double mib = static_cast<double>(c.bucket_bytes) / (1 << 20);
  HUDDLE_RETURN_IF_ERROR(dc.Optional("bucket_mb", &mib, 1e-3, 4096.0));
  c.bucket_bytes = static_cast<int64_t>(mib * (1 << 20));
  mib = static_cast<double>(c.first_bucket_bytes) / (1 << 20);
  HUDDLE_RETURN_IF_ERROR(dc.Optional("first_bucket_mb", &mib, 1e-3, 4096.0));
  c.first_bucket_bytes = static_cast<int64_t>(mib * (1 << 20));
  HUDDLE_RETURN_IF_ERROR(dc.Optional("checksum_every", &c.checksum_every, 0, int64_t{1} << 40));
  HUDDLE_RETURN_IF_ERROR(dc.Optional("overlap", &c.overlap));
  HUDDLE_RETURN_IF_ERROR(OptionalSeconds(dc, "timeout_s", &c.timeout_ms, 0.1, 86400));
  if (dc.Has("crash_for_testing")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap crash, dc.Child("crash_for_testing"));
    c.crash_after_for_testing = "metrics";
    c.crash_epoch_for_testing = 1;
    HUDDLE_RETURN_IF_ERROR(crash.OptionalChoice("after", &c.crash_after_for_testing,
                                                {"ledger", "metrics", "checkpoint"}));
    HUDDLE_RETURN_IF_ERROR(crash.Optional("epoch", &c.crash_epoch_for_testing, 1, 1000000));
    HUDDLE_RETURN_IF_ERROR(crash.Finish());
  }
  HUDDLE_RETURN_IF_ERROR(dc.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap ckpt, top.Child("checkpoint"));
  HUDDLE_RETURN_IF_ERROR(ckpt.Optional("every_epochs", &c.checkpoint_every, 0, 1000000));
  HUDDLE_RETURN_IF_ERROR(ckpt.Finish());

  HUDDLE_ASSIGN_OR_RETURN(ConfigMap output, top.Child("output"));
  HUDDLE_RETURN_IF_ERROR(output.Optional("dir", &c.out_dir));
  HUDDLE_RETURN_IF_ERROR(output.Finish());
  HUDDLE_RETURN_IF_ERROR(top.Finish());
  if (c.out_dir.empty()) c.out_dir = "runs/" + c.job_name;
  return c;
}

// The client's `privacy` section (client::ClientPrivacyPolicy).
Status ReadClientPrivacy(ConfigMap& m, client::ClientPrivacyPolicy* p) {
  HUDDLE_RETURN_IF_ERROR(m.OptionalPath("ledger", &p->ledger_path));
  if (m.Has("local")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap l, m.Child("local"));
    client::LocalDpPolicy local;
    HUDDLE_RETURN_IF_ERROR(l.Optional("require", &local.require));
    HUDDLE_RETURN_IF_ERROR(
        l.Optional("min_noise_multiplier", &local.min_noise_multiplier, 0.0, 1e6));
    if (l.Has("max_epsilon")) {
      double eps = 0;
      HUDDLE_RETURN_IF_ERROR(l.Optional("max_epsilon", &eps, 1e-6, 1e6));
      local.max_epsilon = eps;
    }
    HUDDLE_RETURN_IF_ERROR(l.Optional("delta", &local.delta, 1e-300, 0.5));
    if (l.Has("clip_norm")) {
      double c = 0;
      HUDDLE_RETURN_IF_ERROR(l.Optional("clip_norm", &c, 1e-9, 1e9));
      local.clip_norm = c;
    }
    HUDDLE_RETURN_IF_ERROR(
        l.OptionalChoice("adjacency", &local.adjacency, {"replace_one", "add_remove"}));
    HUDDLE_RETURN_IF_ERROR(l.Finish());
    p->local = local;
  }
  if (m.Has("dp_sgd")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap d, m.Child("dp_sgd"));
    client::DpSgdPolicy dp;
    HUDDLE_RETURN_IF_ERROR(d.Optional("require", &dp.require));
    HUDDLE_RETURN_IF_ERROR(d.Optional("min_noise_multiplier", &dp.min_noise_multiplier, 0.0, 1e6));
    if (d.Has("max_epsilon")) {
      double eps = 0;
      HUDDLE_RETURN_IF_ERROR(d.Optional("max_epsilon", &eps, 1e-6, 1e6));
      dp.max_epsilon = eps;
    }
    HUDDLE_RETURN_IF_ERROR(d.Optional("delta", &dp.delta, 1e-300, 0.5));
    std::string accountant = privacy::AccountantName(dp.accountant);
    HUDDLE_RETURN_IF_ERROR(d.OptionalChoice("accountant", &accountant, {"rdp", "pld"}));
    dp.accountant =
        accountant == "pld" ? privacy::AccountantKind::kPld : privacy::AccountantKind::kRdp;
    HUDDLE_RETURN_IF_ERROR(d.Finish());
    p->dp_sgd = dp;
  }
  if (p->any() && p->ledger_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        m.Where("ledger"),
        ": required with privacy.local or privacy.dp_sgd (the client's own durable record of "
        "what it released; keep it with the client's data, and never delete it)"));
  }
  return m.Finish();
}

StatusOr<ClientConfig> LoadClientConfig(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::LoadFile(path));
  ClientConfig c;
  HUDDLE_RETURN_IF_ERROR(top.Optional("coordinator", &c.coordinator));
  HUDDLE_RETURN_IF_ERROR(top.Optional("client_id", &c.client_id));
  HUDDLE_RETURN_IF_ERROR(ReadDevice(top, &c.device));
  HUDDLE_RETURN_IF_ERROR(ReadSilo(top, &c.silo_nproc));
  HUDDLE_RETURN_IF_ERROR(top.OptionalChoice("log_level", &c.log_level,
                                            {"trace", "debug", "info", "warn", "error", "off"}));
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap data, top.Child("data"));
  HUDDLE_RETURN_IF_ERROR(ReadDataSpec(data, &c.data, /*shard_keys=*/true));
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap sec, top.Child("security"));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("server_public_key", &c.security.server_public_key));
  HUDDLE_RETURN_IF_ERROR(sec.OptionalPath("secret_key", &c.security.secret_key));
  HUDDLE_RETURN_IF_ERROR(sec.Finish());
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap conn, top.Child("connection"));
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(conn, "coordinator_timeout_s", &c.runner.coordinator_timeout_ms, 0.1, 86400));
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(conn, "backoff_initial_s", &c.runner.backoff_initial_ms, 0.01, 3600));
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(conn, "backoff_max_s", &c.runner.backoff_max_ms, 0.01, 3600));
  HUDDLE_RETURN_IF_ERROR(
      OptionalSeconds(conn, "give_up_after_s", &c.runner.give_up_after_ms, 0, 7 * 86400));
  HUDDLE_RETURN_IF_ERROR(conn.Finish());
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap priv, top.Child("privacy"));
  HUDDLE_RETURN_IF_ERROR(ReadClientPrivacy(priv, &c.privacy));
  HUDDLE_RETURN_IF_ERROR(top.Finish());
  return c;
}

Status ValidateClientConfig(const ClientConfig& c) {
  if (c.coordinator.empty()) {
    return absl::InvalidArgumentError("no coordinator given (--coordinator tcp://HOST:PORT)");
  }
  if (c.client_id.empty()) {
    return absl::InvalidArgumentError("no client id given (--client-id, or a key file --key)");
  }
  if (c.data.partitioned && c.data.shard >= c.data.partition.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", c.data.shard, " is out of range for ",
                                                   c.data.partition.num_shards, " shards"));
  }
  return absl::OkStatus();
}

}  // namespace huddle::cli
