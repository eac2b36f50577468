// One rank of a `huddle datacenter` job: one model trained synchronously across ranks
// (docs/datacenter.md). cli/datacenter_cmd.cc is the shell around it: flags, the launcher of
// local ranks, the rendezvous key, signals and exit codes.
//
// RunRank, in order:
//   1. loads the whole training set (every rank) and, on rank 0, the evaluation set; plans the
//      DP-SGD steps (train.dp_sgd);
//   2. rank 0 prepares: the privacy ledger's start rules (datacenter/privacy_session.h), the
//      checkpoint to resume from, and the metrics files cut back to it; a --resume of a job that
//      ran to its end changes nothing;
//   3. opens the compute backend, serves a tcp:// rendezvous (rank 0, when asked), agrees on the
//      run id and joins the collective (Gloo on CPUs, NCCL on GPUs);
//   4. trains (datacenter::TrainDataParallel); rank 0 evaluates, appends OUT/metrics.jsonl,
//      checkpoints and writes the model after each epoch (datacenter/reporter.h);
//   5. rank 0 writes summary.json (and privacy.json) and prints the outcome.
// Nothing is written before every check that can fail alone has passed.
//
// Stopping: when *RankOptions::stop turns true while training, every rank stops after the same
// step; without DP-SGD this rank writes a checkpoint that --resume continues from exactly.
//
// Thread-safety: RunRank runs on the calling thread; one job per output directory.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"
#include "datacenter/collective.h"
#include "datacenter/job_options.h"
#include "transport/kv_store.h"

namespace huddle::datacenter {

// The command the job's messages start with.
inline constexpr char kJobCommand[] = "huddle datacenter";
// RankOptions::run_id when none was given: rank 0 then draws one for the job.
inline constexpr char kDefaultRunId[] = "default";

struct RankOptions {
  // rank, world_size, timeout and host, validated (ValidateCollectiveOptions); the job sets
  // key_prefix from the run id.
  CollectiveOptions collective;
  bool use_cuda = false;   // NCCL on GPU local_rank (or rank modulo the GPUs); else Gloo on CPUs
  int local_rank = -1;     // the GPU of this rank (-1: rank modulo the GPUs present)
  std::string rendezvous;  // tcp://HOST:PORT or file:///DIR
  std::optional<transport::KvAuth> auth;  // the job's rendezvous key (tcp://); none: not
                                          // authenticated
  bool serve_rendezvous = true;           // rank 0 serves a tcp:// rendezvous itself
  std::string run_id = kDefaultRunId;     // separates jobs sharing a rendezvous
  bool resume = false;                    // continue from OUT/checkpoint.bin
  // Set (by a signal handler) to stop training after the same step on every rank. Not owned;
  // may be null.
  const std::atomic<bool>* stop = nullptr;
  // Called once, right before training starts (after loading and joining the others).
  std::function<void()> on_training_start;
};

// Runs rank collective.rank of the job. OK when the job trained to its end (or a --resume found
// it complete). Errors carry, in front of their message, what failed ("training data: ...",
// "rank 1: ..."), exactly as the command prints them; IsRefusal and IsStop classify them.
Status RunRank(const DatacenterConfig& c, const RankOptions& o);

// A RunRank error that refused the configuration or flags before anything was trained.
bool IsRefusal(const Status& st);
// A RunRank error for training stopped on request (*RankOptions::stop).
bool IsStop(const Status& st);

// The launcher's --resume: whether the job's checkpoint says it ran to its end (then it says so
// on stdout). No checkpoint, or one the ranks will refuse, is false: the ranks say why.
StatusOr<bool> ResumesAFinishedJob(const DatacenterConfig& c);

}  // namespace huddle::datacenter
