// The NCCL backend of Collective (collective.h), for buffers on one GPU per rank. The communicator
// is non-blocking (NCCL_CONFIG blocking = 0) so that every wait can be bounded: each operation is
// enqueued on this rank's stream, then polled until it completes, NCCL reports an asynchronous
// error, or the timeout passes, in which case the communicator is aborted (a rank that hangs
// never hangs the others for longer than the timeout). Compiled into the CUDA plugin alone.
#include "datacenter/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

namespace huddle::datacenter::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Status CudaError(cudaError_t err, std::string_view what) {
  return absl::FailedPreconditionError(fmt::format("{}: {}", what, cudaGetErrorString(err)));
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(const CollectiveOptions& options, int device)
      : Collective(options.rank, options.world_size), timeout_(options.timeout), device_(device) {}

  ~NcclCollective() override {
    if (comm_ != nullptr) {
      cudaSetDevice(device_);
      // A broken communicator may still have operations in flight: abort rather than finalize.
      if (broken_.ok()) {
        ncclCommFinalize(comm_);
        WaitComm("finalize").IgnoreError();
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  Status Init(transport::KvStore& store, const std::string& prefix) {
    if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
      return CudaError(err, fmt::format("rank {}: cannot use GPU {}", rank(), device_));
    }
    ncclUniqueId id;
    std::string key = prefix + "nccl/unique_id";
    if (rank() == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclError(r, "unique id");
      HUDDLE_RETURN_IF_ERROR(store.Set(key, std::string_view(id.internal, sizeof(id.internal))));
    } else {
      HUDDLE_ASSIGN_OR_RETURN(std::string value, store.Get(key, timeout_));
      if (value.size() != sizeof(id.internal)) {
        return absl::InvalidArgumentError(
            fmt::format("NCCL unique id under '{}' has {} bytes, not {}", key, value.size(),
                        sizeof(id.internal)));
      }
      std::memcpy(id.internal, value.data(), sizeof(id.internal));
    }
    if (cudaError_t err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
        err != cudaSuccess) {
      return CudaError(err, "cannot create the NCCL stream");
    }
    if (cudaError_t err = cudaMalloc(&scratch_, sizeof(float)); err != cudaSuccess) {
      return CudaError(err, "cannot allocate the barrier's scratch float");
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, world_size(), id, rank(), &config);
    if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, "communicator init");
    return WaitComm("communicator init");
  }

  std::string_view backend() const override { return "nccl"; }

  Status AllReduceSum(std::span<float> data) override {
    return Enqueue("all-reduce", data.size_bytes(), [&] {
      return ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm_,
                           stream_);
    });
  }
  Status AllReduceSum(std::span<double> data) override {
    return Enqueue("all-reduce", data.size_bytes(), [&] {
      return ncclAllReduce(data.data(), data.data(), data.size(), ncclDouble, ncclSum, comm_,
                           stream_);
    });
  }
  // ncclUint64: the same bits as a two's-complement int64 sum, with wrap-around defined.
  Status AllReduceSum(std::span<int64_t> data) override {
    return Enqueue("all-reduce", data.size_bytes(), [&] {
      return ncclAllReduce(data.data(), data.data(), data.size(), ncclUint64, ncclSum, comm_,
                           stream_);
    });
  }
  Status Broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= world_size()) {
      return absl::InvalidArgumentError(
          fmt::format("broadcast from rank {} in a world of {}", root, world_size()));
    }
    return Enqueue("broadcast", data.size(), [&] {
      return ncclBroadcast(data.data(), data.data(), data.size(), ncclUint8, root, comm_, stream_);
    });
  }
  Status AllGather(std::span<const std::byte> in, std::span<std::byte> out) override {
    if (out.size() != in.size() * static_cast<size_t>(world_size())) {
      return absl::InvalidArgumentError(
          fmt::format("all-gather of {} bytes per rank into {} bytes ({} ranks)", in.size(),
                      out.size(), world_size()));
    }
    return Enqueue("all-gather", in.size(), [&] {
      return ncclAllGather(in.data(), out.data(), in.size(), ncclUint8, comm_, stream_);
    });
  }
  Status Barrier() override {
    return Enqueue("barrier", sizeof(float), [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_);
    });
  }

 private:
  Status NcclError(ncclResult_t r, std::string_view what) const {
    return absl::UnavailableError(fmt::format("NCCL {} on rank {} of {} (GPU {}): {}", what, rank(),
                                              world_size(), device_, ncclGetErrorString(r)));
  }

  // Waits for a non-blocking communicator call (init, finalize) to finish.
  Status WaitComm(std::string_view what) {
    auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return Break(NcclError(state, what));
      if (Clock::now() >= deadline) {
        return Break(absl::DeadlineExceededError(fmt::format(
            "NCCL {} on rank {} of {} did not finish within {} ms: a rank hung or stopped", what,
            rank(), world_size(), timeout_.count())));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  template <typename F>
  Status Enqueue(std::string_view op, size_t bytes, F&& call) {
    if (!broken_.ok()) return broken_;
    if (bytes == 0) return absl::OkStatus();
    cudaSetDevice(device_);
    ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) return Break(NcclError(r, op));
    HUDDLE_RETURN_IF_ERROR(WaitComm(op));
    // Poll the stream, watching for asynchronous NCCL errors (a peer that died) and the timeout.
    auto deadline = Clock::now() + timeout_;
    for (;;) {
      cudaError_t done = cudaStreamQuery(stream_);
      if (done == cudaSuccess) return absl::OkStatus();
      if (done != cudaErrorNotReady) return Break(CudaError(done, fmt::format("NCCL {}", op)));
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) return Break(NcclError(state, op));
      if (Clock::now() >= deadline) {
        return Break(absl::DeadlineExceededError(fmt::format(
            "NCCL {} of {} bytes on rank {} of {} did not finish within {} ms: a rank hung or "
            "stopped",
            op, bytes, rank(), world_size(), timeout_.count())));
      }
      std::this_thread::yield();
    }
  }

  Status Break(Status s) {
    broken_ = s;
    return s;
  }

  milliseconds timeout_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  Status broken_;
};

}  // namespace

StatusOr<std::unique_ptr<Collective>> Connect(transport::KvStore& store,
                                              const CollectiveOptions& options, int device) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return CudaError(err, "NCCL needs a GPU, and none is usable");
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        fmt::format("NCCL on GPU {}: this host has {} GPU(s)", device, count));
  }
  auto collective = std::make_unique<NcclCollective>(options, device);
  HUDDLE_RETURN_IF_ERROR(collective->Init(store, options.key_prefix + "/"));
  return std::unique_ptr<Collective>(std::move(collective));
}

}  // namespace huddle::datacenter::nccl
