// A silo: several devices of one site that join a federation as ONE client, whose local training
// is synchronous data-parallel SGD across them (`client.silo.nproc: N`, docs/datacenter.md, "A
// silo as one federated client").
//
// A Silo owns N ranks that are threads of the client process: N backends (CPU backends, or GPUs
// cuda:K..cuda:K+N-1 for `device: cuda:K`), a rendezvous store on 127.0.0.1 under a random run
// id, and N collectives (Gloo on the CPU, NCCL on GPUs) connected once, by Create. Each round,
// TrainUpdate is models::TrainUpdate's contract (models/update.h) computed by the group:
//   1. every rank starts from `global` and runs datacenter::TrainDataParallel on the client's
//      data with the round's seed and a global batch of train.batch_size rows (split over the
//      ranks), so the group follows one client's trajectory up to the order of float sums;
//      with DP-SGD, one release per global step with rank 0 drawing from `options.noise`
//      (datacenter::DataParallelDpSgd): the same DpEvent a single client spends;
//   2. delta = local - global, its norm and the clip to clip_norm, on the host, by TrainUpdate's
//      own rule (models::UpdateFromTrained).
// The caller then adds local-DP noise as for any client (client/agent.cc).
//
// Faults: a rank that fails stops its collective, so the others stop at once with Unavailable
// (at the latest after `timeout`); TrainUpdate then returns the first failure, naming the rank
// and its device. A group broken that way is connected again at the next call.
//
// Thread-safety: one TrainUpdate at a time (the agent's worker thread); the Silo runs its ranks'
// threads inside the call.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "data/dataset.h"
#include "datacenter/collective.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/update.h"
#include "transport/kv_store.h"

namespace huddle::client {

// Most ranks one silo may hold (as `huddle datacenter --nproc`).
inline constexpr int64_t kMaxSiloRanks = 1024;

struct SiloOptions {
  // Ranks, in [1, kMaxSiloRanks]. A client with nproc 1 trains without a Silo (the agent's own
  // backend); a one-rank Silo works but only adds overhead.
  int64_t nproc = 2;
  // Where the ranks train: cpu (N CPU backends, Gloo); cuda[:K] (GPUs K..K+N-1, NCCL; refused
  // when the host has fewer); auto (GPUs 0..N-1 when the host has N usable ones, else the CPU).
  kernels::DeviceRequest device{kernels::DeviceRequest::Kind::kCpu, 0};
  // Bound on every collective operation and on connecting the ranks.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // Fault injection for tests: called on every rank after each epoch of training; an error stops
  // that rank there, as a failing device would.
  std::function<Status(int rank, int64_t epoch)> after_epoch_for_testing;
};

class Silo {
 public:
  // Opens the backends and connects the ranks. Errors: InvalidArgument for nproc out of range or
  // more GPUs than the host has (naming them); FailedPrecondition for cuda in a build or on a
  // host without CUDA; a backend's or a rank's connection error, naming the rank.
  static StatusOr<std::unique_ptr<Silo>> Create(const SiloOptions& options);
  ~Silo();
  Silo(const Silo&) = delete;
  Silo& operator=(const Silo&) = delete;

  int64_t nproc() const { return static_cast<int64_t>(backends_.size()); }
  // "2 x cpu", "4 x cuda (cuda:0..cuda:3)": for logs.
  const std::string& description() const { return description_; }

  // models::TrainUpdate's result (models/update.h), trained by the group as described above.
  // options.train.backend is not used (each rank has its own); options.noise is rank 0's.
  // Errors: those of TrainUpdate (bad options, divergence) and of the group (a rank failed:
  // the first failure's code, "silo rank R of N (DEVICE): ..."). No partial result is returned.
  StatusOr<models::Update> TrainUpdate(const models::ModelSpec& spec,
                                       const models::UpdateOptions& options,
                                       const data::DatasetView& data, const TensorList& global);

 private:
  Silo() = default;
  // Connects every rank's collective under a fresh key prefix (one thread per rank).
  Status Connect();
  // "silo rank R of N (DEVICE)", for errors.
  std::string RankName(int rank) const;

  SiloOptions options_;
  bool cuda_ = false;
  int first_gpu_ = 0;
  std::string description_;
  std::string run_id_;
  int64_t generation_ = 0;  // connections made so far (a key prefix each)
  std::unique_ptr<transport::KvServer> rendezvous_;
  std::vector<std::unique_ptr<kernels::Backend>> backends_;
  // Null for a rank whose collective was dropped after a failure (the group is then reconnected).
  std::vector<std::unique_ptr<datacenter::Collective>> collectives_;
};

}  // namespace huddle::client
