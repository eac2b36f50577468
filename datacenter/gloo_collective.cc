// The Gloo backend of Collective (collective.h): new-style Gloo operations (allreduce with BCUBE,
// broadcast, allgather, barrier) on unbound buffers, so that no per-buffer state has to be created
// in the same order on every rank, each with an end-to-end timeout.
#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <type_traits>
#include <vector>

#include "datacenter/collective.h"

namespace huddle::datacenter {
namespace {

using std::chrono::milliseconds;

// Gloo's rendezvous::Store over our KvStore. Gloo expects exceptions; ConnectGloo catches them.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(transport::KvStore& store, std::string prefix, milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = store_.Set(prefix_ + key, std::string_view(data.data(), data.size()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    StatusOr<std::string> value = store_.Get(prefix_ + key, timeout_);
    if (!value.ok()) throw gloo::IoException(std::string(value.status().message()));
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    for (const std::string& key : keys) {
      StatusOr<std::string> value = store_.Get(prefix_ + key, timeout);
      if (!value.ok()) throw gloo::IoException(std::string(value.status().message()));
    }
  }

 private:
  transport::KvStore& store_;
  std::string prefix_;
  milliseconds timeout_;
};

// a + b: IEEE addition for floating point (no FMA contraction in this file); for int64, addition
// modulo 2^64 in uint64 (two's complement, never an undefined signed overflow).
template <typename T>
T Add(T a, T b) {
  if constexpr (std::is_same_v<T, int64_t>) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  } else {
    return a + b;
  }
}

// Element-wise c = a + b, in the same order on every rank.
template <typename T>
void Sum(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = Add(x[i], y[i]);
}

// x += y, element-wise (Gloo's legacy reduction signature).
template <typename T>
void SumInPlace(T* x, const T* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = Add(x[i], y[i]);
}
template <typename T>
const gloo::ReductionFunction<T> kSumInPlace(gloo::SUM, &SumInPlace<T>);

class GlooCollective final : public Collective {
 public:
  GlooCollective(const CollectiveOptions& options, std::shared_ptr<gloo::Context> context)
      : Collective(options.rank, options.world_size),
        timeout_(options.timeout),
        context_(std::move(context)) {}

  std::string_view backend() const override { return "gloo"; }

  Status AllReduceSum(std::span<float> data) override { return AllReduce(data, &Sum<float>); }
  Status AllReduceSum(std::span<double> data) override { return AllReduce(data, &Sum<double>); }
  Status AllReduceSum(std::span<int64_t> data) override { return AllReduce(data, &Sum<int64_t>); }

  StatusOr<std::unique_ptr<PreparedAllReduce>> PrepareAllReduceSum(std::span<float> data) override {
    return Prepare(data);
  }
  StatusOr<std::unique_ptr<PreparedAllReduce>> PrepareAllReduceSum(
      std::span<double> data) override {
    return Prepare(data);
  }
  StatusOr<std::unique_ptr<PreparedAllReduce>> PrepareAllReduceSum(
      std::span<int64_t> data) override {
    return Prepare(data);
  }

  Status Broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= world_size()) {
      return absl::InvalidArgumentError(
          fmt::format("broadcast from rank {} in a world of {}", root, world_size()));
    }
    return Run("broadcast", data.size(), [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(reinterpret_cast<char*>(data.data()), data.size());
      opts.setRoot(root);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  Status AllGather(std::span<const std::byte> in, std::span<std::byte> out) override {
    if (out.size() != in.size() * static_cast<size_t>(world_size())) {
      return absl::InvalidArgumentError(fmt::format(
          "all-gather of {} bytes per rank into {} bytes (needs {} for {} ranks)", in.size(),
          out.size(), in.size() * static_cast<size_t>(world_size()), world_size()));
    }
    return Run("all-gather", in.size(), [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<char*>(reinterpret_cast<const char*>(in.data())), in.size());
      opts.setOutput(reinterpret_cast<char*>(out.data()), out.size());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  Status Barrier() override {
    return Run("barrier", 0, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // Halving-doubling on a bound buffer: its pairs' buffers are registered once, in the same
  // order on every rank (preparation is collective), and reused by every Run.
  template <typename T>
  class Prepared final : public PreparedAllReduce {
   public:
    Prepared(GlooCollective& owner, std::unique_ptr<gloo::AllreduceHalvingDoubling<T>> a,
             size_t bytes)
        : owner_(owner), algorithm_(std::move(a)), bytes_(bytes) {}
    Status Run() override {
      return owner_.Run("all-reduce", bytes_, [&] { algorithm_->run(); });
    }

   private:
    GlooCollective& owner_;
    std::unique_ptr<gloo::AllreduceHalvingDoubling<T>> algorithm_;
    size_t bytes_;
  };

  template <typename T>
  StatusOr<std::unique_ptr<PreparedAllReduce>> Prepare(std::span<T> data) {
    if (data.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return Collective::PrepareAllReduceSum(data);
    }
    std::unique_ptr<gloo::AllreduceHalvingDoubling<T>> algorithm;
    HUDDLE_RETURN_IF_ERROR(Run("all-reduce set-up", data.size_bytes(), [&] {
      algorithm = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(
          context_, std::vector<T*>{data.data()}, static_cast<int>(data.size()), &kSumInPlace<T>);
    }));
    return std::unique_ptr<PreparedAllReduce>(
        std::make_unique<Prepared<T>>(*this, std::move(algorithm), data.size_bytes()));
  }

  template <typename T>
  Status AllReduce(std::span<T> data, void (*sum)(void*, const void*, const void*, size_t)) {
    return Run("all-reduce", data.size_bytes(), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(sum);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  template <typename F>
  Status Run(std::string_view op, size_t bytes, F&& body) {
    if (!broken_.ok()) return broken_;
    if (bytes == 0 && op != "barrier") return absl::OkStatus();
    try {
      body();
      return absl::OkStatus();
    } catch (const gloo::IoException& e) {
      std::string what = e.what();
      bool timed_out =
          what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
      std::string message =
          fmt::format("gloo {} of {} bytes failed on rank {} of {}: {} ({})", op, bytes, rank(),
                      world_size(), what,
                      timed_out ? fmt::format("a rank did not take part within {} ms: hung or "
                                              "stopped",
                                              timeout_.count())
                                : "a rank's connection closed: it has probably died");
      broken_ = timed_out ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
    } catch (const std::exception& e) {
      broken_ = absl::InternalError(fmt::format("gloo {} of {} bytes failed on rank {} of {}: {}",
                                                op, bytes, rank(), world_size(), e.what()));
    }
    return broken_;
  }

  milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  Status broken_;
};

}  // namespace

Status ValidateCollectiveOptions(const CollectiveOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        fmt::format("world size {}: must be at least 1", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(fmt::format("rank {} is outside 0..{} (world size {})",
                                                  options.rank, options.world_size - 1,
                                                  options.world_size));
  }
  if (options.timeout <= milliseconds(0)) {
    return absl::InvalidArgumentError(
        fmt::format("collective timeout {} ms: must be positive", options.timeout.count()));
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<Collective>> ConnectGloo(transport::KvStore& store,
                                                  const CollectiveOptions& options) {
  HUDDLE_RETURN_IF_ERROR(ValidateCollectiveOptions(options));
  // Every rank first announces itself and waits for the others, so that a missing rank is named.
  std::string prefix = options.key_prefix + "/gloo/";
  HUDDLE_RETURN_IF_ERROR(store.Set(fmt::format("{}here/{}", prefix, options.rank), "1"));
  auto deadline = std::chrono::steady_clock::now() + options.timeout;
  std::vector<int> missing;
  for (int r = 0; r < options.world_size; ++r) {
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    StatusOr<std::string> here =
        store.Get(fmt::format("{}here/{}", prefix, r), std::max(left, milliseconds(1)));
    if (absl::IsDeadlineExceeded(here.status())) {
      missing.push_back(r);
    } else if (!here.ok()) {
      return here.status();
    }
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(fmt::format(
        "rank {} of {}: rank(s) {} did not join through {} within {} ms", options.rank,
        options.world_size, fmt::join(missing, ", "), store.url(), options.timeout.count()));
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    context->setTimeout(options.timeout);
    GlooStore gloo_store(store, prefix + "mesh/", options.timeout);
    context->connectFullMesh(gloo_store, device);
    return std::unique_ptr<Collective>(std::make_unique<GlooCollective>(options, context));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        fmt::format("rank {} of {} could not connect to its peers (gloo, "
                    "listening on {}): {}",
                    options.rank, options.world_size, options.host, e.what()));
  }
}

}  // namespace huddle::datacenter
