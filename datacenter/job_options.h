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
};

// The job's output file `file` in `out_dir`.
inline std::string OutPath(const std::string& out_dir, const char* file) {
  return out_dir + "/" + file;
}

}  // namespace huddle::datacenter
