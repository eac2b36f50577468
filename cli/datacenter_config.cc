// `huddle datacenter`'s YAML onto datacenter::DatacenterConfig (datacenter/job_options.h), in one
// place. Every key, its default and its range is listed in README.md ("Configuration reference").
#include "cli/config_sections.h"
#include "cli/job_config.h"

namespace huddle::cli {
namespace {

// `datacenter.parameter_server` (docs/datacenter.md, "Parameter-server mode"), with the refusals
// of combinations the mode does not support, each naming its keys and saying why.
Status ReadParameterServer(ConfigMap& dc, const DatacenterConfig& c,
                           datacenter::ParameterServerConfig* ps) {
  const std::string where = dc.Where("parameter_server");
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap p, dc.Child("parameter_server"));
  HUDDLE_RETURN_IF_ERROR(p.Optional("servers", &ps->servers, 1, 64));
  std::string mode = "async";
  HUDDLE_RETURN_IF_ERROR(p.OptionalChoice("mode", &mode, {"async", "sync"}));
  ps->async = mode == "async";
  if (p.Has("staleness_bound")) {
    if (!ps->async) {
      return absl::InvalidArgumentError(absl::StrCat(
          p.Where("staleness_bound"), ": bounds the staleness of mode async; mode sync has none"));
    }
    int64_t s = 0;
    HUDDLE_RETURN_IF_ERROR(p.Optional("staleness_bound", &s, 0, 1000000));
    ps->staleness_bound = s;
  }
  HUDDLE_RETURN_IF_ERROR(p.Optional("backup_workers", &ps->backup_workers, 0, 1024));
  if (ps->backup_workers > 0 && ps->async) {
    return absl::InvalidArgumentError(
        absl::StrCat(p.Where("backup_workers"),
                     ": backup workers are for mode sync (mode async waits for no one)"));
  }
  if (p.Has("kill_for_testing")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap kill, p.Child("kill_for_testing"));
    ps->kill_rank_for_testing = 0;
    ps->kill_after_steps_for_testing = 1;
    HUDDLE_RETURN_IF_ERROR(kill.Optional("rank", &ps->kill_rank_for_testing, 0, 1 << 20));
    HUDDLE_RETURN_IF_ERROR(
        kill.Optional("after_steps", &ps->kill_after_steps_for_testing, 1, int64_t{1} << 40));
    HUDDLE_RETURN_IF_ERROR(kill.Finish());
  }
  HUDDLE_RETURN_IF_ERROR(p.Finish());
  if (c.dp_sgd) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " with train.dp_sgd: refused. ",
        ps->async ? "In mode async the release of each step depends on the arrival order and the "
                    "staleness of the gradients, which no accountant here bounds"
                  : "DP-SGD's exact cross-rank sum is built for the all-reduce mode only",
        "; use the all-reduce mode (no parameter_server) for DP-SGD"));
  }
  if (c.model.has_batch_norm()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        " with batch normalization in the model: refused (SyncBatchNorm needs every "
        "worker's batch statistics at once, which the parameter servers do not gather); use "
        "the all-reduce mode, or group_norm"));
  }
  if (c.device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " with datacenter.device ", c.device,
                     ": the parameter-server mode runs on the CPU only for now (device: cpu)"));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<DatacenterConfig> LoadDatacenterConfig(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(ConfigMap top, ConfigMap::LoadFile(path));
  DatacenterConfig c;
  HUDDLE_RETURN_IF_ERROR(top.Optional("name", &c.job_name));
  int64_t seed = 0;
  HUDDLE_RETURN_IF_ERROR(top.Optional("seed", &seed, 0, INT64_MAX));
  c.seed = static_cast<uint64_t>(seed);
  HUDDLE_RETURN_IF_ERROR(top.OptionalChoice("log_level", &c.log_level,
                                            {"trace", "debug", "info", "warn", "error", "off"}));
  HUDDLE_RETURN_IF_ERROR(ReadModel(top, &c.model, /*initial=*/nullptr));

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
  HUDDLE_RETURN_IF_ERROR(dc.OptionalSeconds("timeout_s", &c.timeout_ms, 0.1, 86400));
  if (dc.Has("crash_for_testing")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap crash, dc.Child("crash_for_testing"));
    c.crash_after_for_testing = "metrics";
    c.crash_epoch_for_testing = 1;
    HUDDLE_RETURN_IF_ERROR(crash.OptionalChoice("after", &c.crash_after_for_testing,
                                                {"ledger", "metrics", "checkpoint"}));
    HUDDLE_RETURN_IF_ERROR(crash.Optional("epoch", &c.crash_epoch_for_testing, 1, 1000000));
    HUDDLE_RETURN_IF_ERROR(crash.Finish());
  }
  if (dc.Has("slowdown_for_testing")) {
    HUDDLE_ASSIGN_OR_RETURN(ConfigMap slow, dc.Child("slowdown_for_testing"));
    c.slow_rank_for_testing = 0;
    HUDDLE_RETURN_IF_ERROR(slow.Optional("rank", &c.slow_rank_for_testing, 0, 1 << 20));
    HUDDLE_RETURN_IF_ERROR(slow.Optional("sleep_ms", &c.slow_sleep_ms_for_testing, 0, 60000));
    HUDDLE_RETURN_IF_ERROR(
        slow.Optional("every_rank_ms", &c.every_rank_sleep_ms_for_testing, 0, 60000));
    HUDDLE_RETURN_IF_ERROR(slow.Finish());
  }
  if (dc.Has("parameter_server")) {
    datacenter::ParameterServerConfig ps;
    HUDDLE_RETURN_IF_ERROR(ReadParameterServer(dc, c, &ps));
    c.parameter_server = ps;
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

}  // namespace huddle::cli
