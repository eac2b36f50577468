#include "client/silo.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <numeric>
#include <thread>

#include "common/clock.h"
#include "common/secure_random.h"
#include "datacenter/data_parallel.h"

namespace huddle::client {
namespace {

using Kind = kernels::DeviceRequest::Kind;

// Where the ranks go: the CPU, or GPUs first_gpu .. first_gpu + nproc - 1.
struct Placement {
  bool cuda = false;
  int first_gpu = 0;
};

StatusOr<Placement> Place(const SiloOptions& o) {
  // A CPU silo never loads the CUDA plugin; `auto` only where a driver is present.
  if (o.device.kind == Kind::kCpu) return Placement{};
  if (o.device.kind == Kind::kAuto) return Placement{kernels::CudaDeviceCount() >= o.nproc, 0};
  StatusOr<int> counted = kernels::CountCudaDevices();
  if (!counted.ok()) {
    return absl::FailedPreconditionError(fmt::format("silo device {}: {} (or use device: cpu)",
                                                     o.device.ToString(),
                                                     counted.status().message()));
  }
  const int gpus = *counted;
  if (o.device.index + o.nproc > gpus) {
    return absl::InvalidArgumentError(fmt::format(
        "silo.nproc {} with device {} needs GPUs cuda:{}..cuda:{}, one per rank (NCCL refuses two "
        "ranks on one GPU); this host has {} GPU(s)",
        o.nproc, o.device.ToString(), o.device.index, o.device.index + o.nproc - 1, gpus));
  }
  return Placement{true, o.device.index};
}

// Runs fn(rank) on one thread per rank and waits for all of them.
void OnEveryRank(int64_t nproc, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < nproc; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

StatusOr<std::unique_ptr<Silo>> Silo::Create(const SiloOptions& options) {
  if (options.nproc < 1 || options.nproc > kMaxSiloRanks) {
    return absl::InvalidArgumentError(
        fmt::format("silo.nproc is {}; it must be in [1, {}]", options.nproc, kMaxSiloRanks));
  }
  if (options.timeout <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(
        fmt::format("silo timeout is {} ms; it must be positive", options.timeout.count()));
  }
  HUDDLE_ASSIGN_OR_RETURN(const Placement place, Place(options));
  std::unique_ptr<Silo> silo(new Silo());
  silo->options_ = options;
  silo->cuda_ = place.cuda;
  silo->first_gpu_ = place.first_gpu;
  silo->description_ = place.cuda
                           ? fmt::format("{} x cuda (cuda:{}..cuda:{})", options.nproc,
                                         place.first_gpu, place.first_gpu + options.nproc - 1)
                           : fmt::format("{} x cpu", options.nproc);
  for (int r = 0; r < options.nproc; ++r) {
    if (!place.cuda) {
      silo->backends_.push_back(kernels::OpenCpuBackend());
      continue;
    }
    auto opened = kernels::OpenBackend({Kind::kCuda, place.first_gpu + r});
    if (!opened.ok()) {
      return Status(opened.status().code(),
                    fmt::format("silo rank {}: {}", r, opened.status().message()));
    }
    silo->backends_.push_back(std::move(opened).value());
  }
  HUDDLE_ASSIGN_OR_RETURN(silo->rendezvous_, transport::KvServer::Start("tcp://127.0.0.1:0"));
  silo->run_id_ = fmt::format("{:016x}", SecureRandomU64());
  HUDDLE_RETURN_IF_ERROR(silo->Connect());
  return silo;
}

Silo::~Silo() = default;

std::string Silo::RankName(int rank) const {
  return fmt::format("silo rank {} of {} ({})", rank, nproc(),
                     cuda_ ? fmt::format("cuda:{}", first_gpu_ + rank) : "cpu");
}

Status Silo::Connect() {
  const int64_t n = nproc();
  datacenter::CollectiveOptions co;
  co.world_size = static_cast<int>(n);
  co.timeout = options_.timeout;
  co.key_prefix = fmt::format("huddle/silo/{}/{}", run_id_, generation_++);
  collectives_.clear();
  collectives_.resize(static_cast<size_t>(n));
  std::vector<Status> status(static_cast<size_t>(n));
  OnEveryRank(n, [&](int r) {
    auto store = transport::OpenKvStore(rendezvous_->url(), options_.timeout);
    if (!store.ok()) {
      status[r] = store.status();
      return;
    }
    datacenter::CollectiveOptions mine = co;
    mine.rank = r;
    auto connected = cuda_ ? datacenter::ConnectNccl(**store, mine, first_gpu_ + r)
                           : datacenter::ConnectGloo(**store, mine);
    if (connected.ok()) {
      collectives_[r] = std::move(connected).value();
    } else {
      status[r] = connected.status();
    }
  });
  for (int r = 0; r < n; ++r) {
    if (status[r].ok()) continue;
    collectives_.clear();
    return Status(status[r].code(),
                  fmt::format("{}: connecting the ranks: {}", RankName(r), status[r].message()));
  }
  return absl::OkStatus();
}

StatusOr<models::Update> Silo::TrainUpdate(const models::ModelSpec& spec,
                                           const models::UpdateOptions& options,
                                           const data::DatasetView& data,
                                           const TensorList& global) {
  const Clock* clock = options.train.clock != nullptr ? options.train.clock : SteadyClock::Get();
  const int64_t start_ms = clock->NowMs();
  HUDDLE_RETURN_IF_ERROR(models::CheckUpdateOptions(options));
  const int64_t n = nproc();
  bool broken = collectives_.empty();
  for (const auto& c : collectives_) broken = broken || c == nullptr;
  if (broken) {
    spdlog::info("silo: connecting the {} ranks again after a failure", n);
    HUDDLE_RETURN_IF_ERROR(Connect());
  }

  datacenter::DataParallelOptions base;
  base.train = options.train;
  base.seed = options.seed;
  base.global_batch_size = options.train.batch_size;  // one client's batch, split over the ranks
  base.checksum_every = 0;                            // replicas compared at the end only
  if (options.dp_sgd) base.dp_sgd = datacenter::DataParallelDpSgd{*options.dp_sgd, nullptr};

  struct RankRun {
    Status status;
    datacenter::DataParallelStats stats;
    int failure_order = -1;
  };
  std::vector<RankRun> runs(static_cast<size_t>(n));
  std::atomic<int> failures{0};
  std::vector<double> epoch_loss, epoch_accuracy;  // rank 0's reports (over all ranks)
  TensorList local = global;                       // rank 0's model: the result
  OnEveryRank(n, [&](int r) {
    datacenter::DataParallelOptions o = base;
    o.train.backend = backends_[r].get();
    if (o.dp_sgd && r == 0) o.dp_sgd->noise = options.noise;
    o.on_epoch = [&, r](const datacenter::EpochReport& report) -> Status {
      if (r == 0) {
        epoch_loss.push_back(report.loss);
        epoch_accuracy.push_back(report.accuracy);
      }
      if (options_.after_epoch_for_testing) {
        return options_.after_epoch_for_testing(r, report.epoch);
      }
      return absl::OkStatus();
    };
    TensorList copy;
    TensorList* params = &local;
    if (r != 0) params = &(copy = global);
    auto trained = datacenter::TrainDataParallel(*collectives_[r], spec, o, data, params);
    if (trained.ok()) {
      runs[r].stats = *trained;
      return;
    }
    runs[r].failure_order = failures++;
    runs[r].status = trained.status();
    // Closing this rank's connections stops the others now rather than at the timeout.
    collectives_[r].reset();
  });
  for (int r = 0; r < n; ++r) {
    const RankRun& run = runs[r];
    if (run.failure_order != 0) continue;
    // The first failure is the cause; the others ("a rank's connection closed") follow from it.
    for (auto& c : collectives_) c.reset();  // connected again at the next call
    return Status(run.status.code(), fmt::format("{}: {}", RankName(r), run.status.message()));
  }

  HUDDLE_ASSIGN_OR_RETURN(models::Update update,
                          models::UpdateFromTrained(std::move(local), global, options.clip_norm));
  // SGD: every epoch has n examples, so this is the mean over all of them (as TrainModel's);
  // DP-SGD: the mean of the epochs' means.
  update.train.loss = Mean(epoch_loss);
  update.train.accuracy = Mean(epoch_accuracy);
  update.train.steps = runs[0].stats.steps;
  for (const RankRun& run : runs) update.train.examples += run.stats.examples;
  update.train.seconds = static_cast<double>(clock->NowMs() - start_ms) / 1000.0;
  if (const auto& event = runs[0].stats.dp_event) {
    models::DpSgdStats& dp = update.dp_sgd.emplace();
    dp.train = update.train;
    dp.steps = event->steps;
    dp.sampling_rate = event->sampling_rate;
    dp.noise_multiplier = event->noise_multiplier;
    dp.private_noise = runs[0].stats.private_noise;
  }
  return update;
}

}  // namespace huddle::client
