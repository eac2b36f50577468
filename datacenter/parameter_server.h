// The parameter-server mode of `huddle datacenter` (docs/datacenter.md, "Parameter-server mode"):
// TensorFlow's ParameterServerStrategy counterpart. Of the job's ranks, [0, servers) are parameter
// servers and the others workers (worker w is rank servers + w).
//
//   - Each server k holds shard k of the flat parameter vector (ps_plan.h: contiguous, balanced),
//     its momentum and its version, and applies the optimizer step to it (ps_shard.h). Server 0
//     also runs the Dispatcher (ps_plan.h): the epochs' task queues of batches, the SSP gate and
//     the workers' liveness; at each epoch's end (an epoch barrier) it gathers every shard, and
//     reports the epoch (evaluation, metrics, checkpoint) through on_epoch.
//   - A worker loops: ask server 0 for a batch (reporting the one it finished), pull every shard,
//     compute the batch's gradient with the one training loop (models::Trainer::ComputeGradient,
//     a trainer of one rank), push each shard its slice, repeat. async: no barrier at all;
//     sync: every step's version v is taken by the shards from the first workers - backups
//     gradients, and the next step's batches are handed out when it closed.
//   - A worker silent for timeout_ms is dead: its batches go to the others, the job goes on and
//     the stats name it. A server that dies ends the job (its shard is nowhere else; resume from
//     the last checkpoint).
// Addresses go through the rendezvous KvStore (key prefix/ps/K); every socket is authenticated
// with the job's key when one is given (ps_wire.h). Every wait is bounded by timeout_ms.
//
// Thread-safety: each call runs one rank on the calling thread; ranks of one job may be threads of
// one process (the tests) or processes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "datacenter/data_parallel.h"
#include "datacenter/job_options.h"
#include "models/model.h"
#include "transport/kv_store.h"

namespace huddle::datacenter {

// What every rank of a parameter-server job must agree on (a digest of it tags every message).
struct PsJob {
  models::ModelSpec spec;
  models::TrainOptions train;  // epochs, batch_size (per worker step), learning rate, momentum...
  uint64_t seed = 0;           // data order (epoch e: as the all-reduce mode's)
  ParameterServerConfig ps;
  int64_t world_size = 0;                 // servers + workers
  int64_t examples = 0;                   // the training set's size
  int64_t timeout_ms = 60000;             // any wait; a worker silent this long is dead
  std::string host = "127.0.0.1";         // where this rank's server listens (servers only)
  std::optional<transport::KvAuth> auth;  // the job's key; none: plain TCP
  std::string key_prefix = "huddle";      // rendezvous keys (the run id's)
  TensorList init;                        // the initial parameters (the same on every rank)
};

// Checks the layout of ranks and options against the world size (InvalidArgument naming the keys:
// too few ranks for the servers, backup_workers >= workers, ...).
Status ValidatePsJob(const PsJob& job);
// The tag of every message of the job: ranks configured differently cannot talk.
uint64_t PsJobTag(const PsJob& job);
// What PsJobTag covers, in words (a differently configured rank is told it: ps_wire.h).
std::string PsJobDescription(const PsJob& job);

struct PsStats {
  int64_t steps = 0;  // async: gradients applied (shard 0's version); sync: steps
  double seconds = 0;
  double loss = 0, accuracy = 0;  // the last epoch's, over the batches that counted
  int64_t gradients = 0;          // batches done and counted
  int64_t staleness_count = 0, staleness_max = 0;
  double staleness_sum = 0;  // async: over every shard's applied gradients' worst
  int64_t ssp_waits = 0;     // task requests the SSP gate held
  double ssp_wait_seconds = 0;
  int64_t late_dropped = 0;  // sync: gradients dropped as late (backups)
  int64_t requeued = 0;      // batches given to others after their worker died
  std::vector<int64_t> dead_ranks;
};

struct PsServerOptions {
  int server = 0;  // this rank, < ps.servers
  // Server 0, a resume: the state to continue from (its params/velocity are sent to the shards).
  const TrainingState* resume = nullptr;
  // Server 0, after each epoch: the report (with its state) and the stats so far.
  std::function<Status(const EpochReport&, const PsStats&)> on_epoch;
  // Set to end the job (server 0: after the current epoch's report; no checkpoint of the part).
  const std::atomic<bool>* stop = nullptr;
  double seconds_before = 0;  // training time of the sessions before a resume
};

// Runs server `o.server`. Server 0 returns the job's stats when every epoch is done.
StatusOr<PsStats> RunPsServer(transport::KvStore& store, const PsJob& job,
                              const PsServerOptions& o);

struct PsWorkerOptions {
  int64_t worker = 0;                   // 0-based; rank ps.servers + worker
  kernels::Backend* backend = nullptr;  // the CPU (nullptr: one of its own)
  int64_t sleep_ms_per_step = 0;        // figures: emulate a slow machine
  // Tests: called after each of this worker's steps with their count; true makes the worker
  // vanish at once (return Aborted without a word to anyone), as a dead machine would.
  std::function<bool(int64_t steps)> vanish_after_step;
  // Set to stop after the current step (Cancelled). Not owned; may be null.
  const std::atomic<bool>* stop = nullptr;
};

struct PsWorkerStats {
  int64_t steps = 0, examples = 0;
};

// Runs worker `o.worker` until server 0 says the job is finished. Aborted when it vanished (tests);
// FailedPrecondition when server 0 declared it dead.
StatusOr<PsWorkerStats> RunPsWorker(transport::KvStore& store, const PsJob& job,
                                    const PsWorkerOptions& o, const data::DatasetView& data);

// The flat parameter vector of `params` (their values concatenated), and back into `params`'s
// shapes.
std::vector<float> FlattenParams(const TensorList& params);
void UnflattenParams(const std::vector<float>& flat, TensorList* params);

}  // namespace huddle::datacenter
