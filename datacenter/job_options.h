// The options of a `huddle datacenter` job: one model trained synchronously across ranks
// (docs/datacenter.md). The job YAML maps onto them in one place (cli/datacenter_config.cc); every
// key, its default and its range is listed in README.md ("Configuration reference").
//
// Plain values; no thread-safety of their own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "data/client_data.h"
#include "models/dp_sgd.h"
#include "models/model.h"
#include "privacy/accountant.h"

namespace huddle::datacenter {

// `train.dp_sgd` of a datacenter job: DP-SGD across the ranks (datacenter::DataParallelDpSgd).
struct DatacenterDpSgd {
  models::DpSgdOptions dp;  // expected_batch_size: the global expected batch
  double delta = 1e-5;
  std::optional<double> epsilon_budget;  // refuse to start when the run would spend more
  privacy::AccountantKind accountant = privacy::AccountantKind::kRdp;
};

// `datacenter.parameter_server`: the parameter-server mode (datacenter/parameter_server.h,
// docs/datacenter.md "Parameter-server mode"). Ranks [0, servers) hold the parameters' shards;
// the other ranks are workers.
struct ParameterServerConfig {
  int64_t servers = 1;
  bool async = true;  // mode: async (apply each gradient on arrival) | sync (one step per version)
  // Async only: SSP, a worker that completed c steps may start another only while c <= the
  // slowest live worker's count + staleness_bound. Absent: unbounded (plain asynchronous SGD).
  std::optional<int64_t> staleness_bound;
  int64_t backup_workers = 0;  // sync only: a step takes the first workers - b gradients
  // Tests only (`kill_for_testing: {rank: R, after_steps: S}`): worker rank R SIGKILLs itself
  // after S of its own steps, as a machine failing then would. -1: never.
  int64_t kill_rank_for_testing = -1;
  int64_t kill_after_steps_for_testing = 0;
};

// `huddle datacenter`: one model trained synchronously across ranks (docs/datacenter.md).
struct DatacenterConfig {
  std::string job_name = "datacenter";
  uint64_t seed = 0;
  models::ModelSpec model;
  models::TrainOptions train;  // batch_size is per rank
  std::optional<DatacenterDpSgd> dp_sgd;
  data::DataSpec data;  // every rank loads all of it (no partition)
  std::string eval_data = data::kDefaultFashionMnistDir;  // test split; "" = no evaluation
  int64_t eval_every = 1;                                 // epochs (0: only after the last)
  double target_accuracy = 0;  // the summary reports when test accuracy first reached it
  int64_t nproc = 1;           // ranks `--nproc` starts when the flag is absent
  std::string device = "cpu";  // cpu | cuda | auto: every rank on the CPU (Gloo) or a GPU (NCCL)
  int64_t bucket_bytes = 25 << 20;
  int64_t first_bucket_bytes = 1 << 20;
  int64_t checksum_every = 100;  // steps
  bool overlap = true;
  int64_t timeout_ms = 60000;    // any collective; a rank silent this long ends the job
  int64_t checkpoint_every = 1;  // epochs (0: only after the last)
  std::string out_dir;           // default runs/<name>
  std::string log_level = "info";
  // Fault injection for tests only (`datacenter.crash_for_testing: {after: ledger|metrics|
  // checkpoint, epoch: E}`): rank 0 SIGKILLs itself right after that write of (1-based) epoch E,
  // as a machine failing at that point would. Empty: never.
  std::string crash_after_for_testing;
  int64_t crash_epoch_for_testing = 0;
  // The parameter-server mode instead of the all-reduce one; none: all-reduce.
  std::optional<ParameterServerConfig> parameter_server;
  // Figures and tests only (`datacenter.slowdown_for_testing: {rank: R, sleep_ms: X,
  // every_rank_ms: B}`): every compute rank sleeps B ms after each of its training steps (device
  // time that this machine's cores do not spend: emulated devices, so that ranks sharing a few
  // cores do not hide a slow one), and rank R X ms more, to emulate one slow machine. -1: none.
  int64_t slow_rank_for_testing = -1;
  int64_t slow_sleep_ms_for_testing = 0;
  int64_t every_rank_sleep_ms_for_testing = 0;
};

// What datacenter.slowdown_for_testing makes compute rank `rank` sleep after each step (ms).
inline int64_t SleepAfterStepForTesting(const DatacenterConfig& c, int64_t rank) {
  return c.every_rank_sleep_ms_for_testing +
         (c.slow_rank_for_testing == rank ? c.slow_sleep_ms_for_testing : 0);
}

// The job's output file `file` in `out_dir`.
inline std::string OutPath(const std::string& out_dir, const char* file) {
  return out_dir + "/" + file;
}

}  // namespace huddle::datacenter
