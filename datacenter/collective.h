// Collective operations among the ranks of a datacenter job: all-reduce, broadcast, all-gather and
// barrier. Two backends, chosen by where the buffers live:
//
//   Gloo (ConnectGloo)   host buffers, TCP between ranks. All-reduce is Gloo's BCUBE algorithm,
//                        or halving-doubling for a prepared buffer: both give every rank the same
//                        bits and do not stall with 3+ ranks (the legacy AllreduceRing returns
//                        different bits on different ranks; the new-style default ring stalls):
//                        tests/datacenter checks them.
//   NCCL (ConnectNccl)   device buffers on one GPU per rank, from the CUDA plugin
//                        (kernels/cuda_plugin.h). NCCL's unique id travels through the rendezvous
//                        store.
//
// Every operation is collective: each rank calls the same operations with the same sizes in the
// same order. One thread uses a Collective at a time. Each operation ends within the timeout or
// returns an error (DeadlineExceeded for a rank that hangs, Unavailable for one that died) naming
// the operation; after an error the Collective is broken and every later call returns that error.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/kv_store.h"

namespace huddle::datacenter {

struct CollectiveOptions {
  int rank = 0;
  int world_size = 1;
  // Bound on every operation, and on the rendezvous that connects the ranks.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // Gloo: the address this rank's peers reach it at (an IP or a host name of this host).
  std::string host = "127.0.0.1";
  // Namespace of this group's keys in the store (several groups may share one store).
  std::string key_prefix = "huddle";
};

// An all-reduce (sum) of one fixed buffer, set up once and run many times: a data-parallel
// trainer's gradient buckets and batch-norm statistics. Backends that can arrange their transfers
// in advance do (Gloo: halving-doubling on the bound buffer, about 1 ms cheaper per call than a
// new-style all-reduce here); the others run the plain all-reduce. Every rank prepares the same
// buffers in the same order, runs them in the same order, and keeps the buffer alive while the
// object lives.
class PreparedAllReduce {
 public:
  virtual ~PreparedAllReduce() = default;
  virtual Status Run() = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  virtual std::string_view backend() const = 0;

  // Element-wise sum over all ranks, in place. Every rank ends with the same bits.
  virtual Status AllReduceSum(std::span<float> data) = 0;
  virtual Status AllReduceSum(std::span<double> data) = 0;
  // The int64 sum is exact and wraps modulo 2^64 (two's complement; computed as uint64, so no
  // overflow is undefined): the result is every rank's values added as integers, whatever the
  // order, and equals the true sum whenever that lies in [-2^63, 2^63). DP-SGD's exact gradient
  // sum (models/dp_sgd.h) depends on it.
  virtual Status AllReduceSum(std::span<int64_t> data) = 0;
  // The same sums, prepared once for repeated use on `data` (see PreparedAllReduce). The default
  // runs AllReduceSum each time.
  virtual StatusOr<std::unique_ptr<PreparedAllReduce>> PrepareAllReduceSum(std::span<float> data);
  virtual StatusOr<std::unique_ptr<PreparedAllReduce>> PrepareAllReduceSum(std::span<double> data);
  virtual StatusOr<std::unique_ptr<PreparedAllReduce>> PrepareAllReduceSum(std::span<int64_t> data);
  // Copies `root`'s bytes into every rank's `data` (same size everywhere).
  virtual Status Broadcast(std::span<std::byte> data, int root) = 0;
  // out.size() == in.size() * world_size(); rank r's `in` lands at out[r * in.size(), ...).
  virtual Status AllGather(std::span<const std::byte> in, std::span<std::byte> out) = 0;
  // Returns once every rank has entered it.
  virtual Status Barrier() = 0;

 protected:
  Collective(int rank, int world_size) : rank_(rank), world_size_(world_size) {}

 private:
  int rank_;
  int world_size_;
};

// Checks rank, world size and timeout; InvalidArgument naming the field otherwise.
Status ValidateCollectiveOptions(const CollectiveOptions& options);

// Connects this rank to the others through `store` (every rank calls it with the same store,
// prefix and world size). Returns once the full mesh is connected, or an error naming the ranks
// that did not show up within options.timeout.
StatusOr<std::unique_ptr<Collective>> ConnectGloo(transport::KvStore& store,
                                                  const CollectiveOptions& options);

// NCCL on GPU `device` (buffers passed to the Collective are device pointers on it), from the CUDA
// plugin, loaded on first use. FailedPrecondition naming what is missing where the plugin does not
// load (kernels::LoadCudaPlugin: a build without CUDA, no plugin file, a CUDA library) or no GPU
// is usable.
StatusOr<std::unique_ptr<Collective>> ConnectNccl(transport::KvStore& store,
                                                  const CollectiveOptions& options, int device);

}  // namespace huddle::datacenter
