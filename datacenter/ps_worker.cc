// A worker of the parameter-server mode (datacenter/parameter_server.h): ask, pull, compute with
// the one training loop, push.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "datacenter/parameter_server.h"
#include "datacenter/ps_plan.h"
#include "datacenter/ps_wire.h"
#include "kernels/flush_denormals.h"
#include "models/trainer.h"

namespace huddle::datacenter {

using std::chrono::milliseconds;

StatusOr<PsWorkerStats> RunPsWorker(transport::KvStore& store, const PsJob& job,
                                    const PsWorkerOptions& o, const data::DatasetView& data) {
  HUDDLE_RETURN_IF_ERROR(ValidatePsJob(job));
  kernels::FlushDenormalsScope flush_denormals;
  const int64_t rank = job.ps.servers + o.worker;
  const std::vector<float> init = FlattenParams(job.init);
  const auto total = static_cast<int64_t>(init.size());
  const std::vector<ShardRange> ranges = PlanShards(total, static_cast<int>(job.ps.servers));
  const uint64_t tag = PsJobTag(job);
  const milliseconds timeout(job.timeout_ms);
  if (data.size() != job.examples) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", rank, " has ", data.size(), " training examples; the job ", job.examples));
  }

  // The one training loop, as a trainer of one rank whose batch is one worker step.
  models::TrainOptions train = job.train;
  train.backend = o.backend;
  models::Trainer::Loop loop;
  loop.seed = job.seed;
  loop.global_batch = job.train.batch_size;
  HUDDLE_ASSIGN_OR_RETURN(std::unique_ptr<models::Trainer> trainer,
                          models::Trainer::Create(job.spec, train, data, loop));
  if (trainer->backend().kind() != kernels::DeviceKind::kCpu) {
    return absl::FailedPreconditionError("the parameter-server mode runs on the CPU only");
  }
  trainer->UploadParams(job.init);
  const models::GradientLayout& layout = trainer->layout();
  if (layout.sizes.size() != job.init.size()) {
    return absl::FailedPreconditionError(
        "the parameter-server mode needs a model whose tensors are all trainable (no batch norm)");
  }
  for (size_t i = 0; i < layout.sizes.size(); ++i) {
    if (layout.sizes[i] != job.init[i].NumElements()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", job.init[i].name(), " has ", job.init[i].NumElements(),
                       " values; the trainer's layout ", layout.sizes[i]));
    }
  }

  std::vector<std::unique_ptr<PsDealer>> servers;
  for (int64_t k = 0; k < job.ps.servers; ++k) {
    HUDDLE_ASSIGN_OR_RETURN(std::string url,
                            store.Get(absl::StrCat(job.key_prefix, "/ps/", k), timeout));
    HUDDLE_ASSIGN_OR_RETURN(auto dealer, PsDealer::Connect(url, job.auth, tag, total * 2));
    servers.push_back(std::move(dealer));
  }
  const auto failed = [&](int64_t k, const Status& st) {
    if (o.stop != nullptr && o.stop->load()) {
      return absl::CancelledError(absl::StrCat("worker rank ", rank, ": stopped on request"));
    }
    // A server's refusal (kError) may be of this rank's configuration: say what it is.
    const std::string mine = absl::IsFailedPrecondition(st)
                                 ? absl::StrCat(" (this rank's job: ", PsJobDescription(job), ")")
                                 : "";
    return Status(st.code(), absl::StrCat("worker rank ", rank, ", server rank ", k, ": ",
                                          st.message(), mine));
  };

  PsWorkerStats stats;
  std::vector<int64_t> order(static_cast<size_t>(job.examples));
  int64_t order_epoch = -1;
  const int64_t batches = (job.examples + job.train.batch_size - 1) / job.train.batch_size;
  std::vector<float> flat(static_cast<size_t>(total));
  std::vector<int64_t> versions(ranges.size());
  Msg done;  // the previous batch's report (batch -1: none)
  done.type = MsgType::kNext;
  done.worker = o.worker;
  for (;;) {
    if (o.stop != nullptr && o.stop->load()) {
      return absl::CancelledError(absl::StrCat("worker rank ", rank, ": stopped on request"));
    }
    auto reply = servers[0]->Request(done, timeout);
    if (!reply.ok()) return failed(0, reply.status());
    if (reply->type != MsgType::kTask) {
      return failed(0, absl::DataLossError("a reply that is not a task"));
    }
    done.batch = -1;
    done.dropped = done.staleness = done.rows = done.correct = 0;
    done.loss_sum = 0;
    const auto kind = static_cast<Task::Kind>(reply->flags);
    if (kind == Task::Kind::kFinished) return stats;
    if (kind == Task::Kind::kExcluded) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker rank ", rank, ": server 0 declared this worker dead (silent for more than ",
          job.timeout_ms, " ms); its batches went to the others"));
    }
    if (kind != Task::Kind::kRun) continue;  // kWait: ask again
    const int64_t epoch = reply->epoch, batch = reply->batch;
    if (epoch < 0 || epoch >= job.train.epochs || batch < 0 || batch >= batches) {
      return failed(
          0, absl::DataLossError(absl::StrCat("a task of epoch ", epoch, ", batch ", batch)));
    }
    if (epoch != order_epoch) {  // the all-reduce mode's order of this epoch (models/trainer.cc)
      std::iota(order.begin(), order.end(), int64_t{0});
      Rng rng(DeriveSeed(job.seed, static_cast<uint64_t>(epoch)));
      rng.Shuffle(order);
      HUDDLE_RETURN_IF_ERROR(trainer->SetOrder(order));
      order_epoch = epoch;
    }
    // Pull every shard at once.
    Msg pull;
    pull.type = MsgType::kPull;
    pull.worker = o.worker;
    for (auto& s : servers) HUDDLE_RETURN_IF_ERROR(s->Send(pull));
    bool late = false;
    for (size_t k = 0; k < servers.size(); ++k) {
      auto got = servers[k]->Receive(timeout);
      if (!got.ok()) return failed(static_cast<int64_t>(k), got.status());
      const ShardRange& r = ranges[k];
      if (got->type != MsgType::kParams || got->values.size() != static_cast<size_t>(r.count)) {
        return failed(static_cast<int64_t>(k),
                      absl::DataLossError(absl::StrCat("a shard of ", got->values.size(),
                                                       " values; ", r.count, " expected")));
      }
      std::copy(got->values.begin(), got->values.end(), flat.begin() + r.begin);
      versions[k] = got->version;
      if (!job.ps.async && got->version != reply->version) late = true;
    }
    done.epoch = epoch;
    done.batch = batch;
    done.version = reply->version;
    if (late) {  // sync: the step closed meanwhile; this batch's gradient would be dropped
      done.dropped = job.ps.servers;
      continue;
    }
    const std::span<float> params = trainer->params();
    for (size_t i = 0, at = 0; i < layout.sizes.size(); ++i) {
      std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at),
                flat.begin() + static_cast<std::ptrdiff_t>(at + layout.sizes[i]),
                params.begin() + layout.offsets[i]);
      at += static_cast<size_t>(layout.sizes[i]);
    }
    trainer->set_steps(epoch * batches + batch);  // dropout's masks: one per batch of the run
    const int64_t begin = batch * job.train.batch_size;
    const int64_t rows = std::min(job.train.batch_size, job.examples - begin);
    HUDDLE_RETURN_IF_ERROR(trainer->ComputeGradient(begin, rows).status());
    HUDDLE_ASSIGN_OR_RETURN(const kernels::LossAccumulator totals, trainer->ReadTotals());
    trainer->ResetTotals();
    const std::span<float> grads = trainer->gradients();
    for (size_t i = 0, at = 0; i < layout.sizes.size(); ++i) {
      std::copy(grads.begin() + layout.offsets[i],
                grads.begin() + layout.offsets[i] + layout.sizes[i],
                flat.begin() + static_cast<std::ptrdiff_t>(at));
      at += static_cast<size_t>(layout.sizes[i]);
    }
    if (o.sleep_ms_per_step > 0) {
      std::this_thread::sleep_for(milliseconds(o.sleep_ms_per_step));
    }
    // Push each shard its slice, all at once.
    for (size_t k = 0; k < servers.size(); ++k) {
      const ShardRange& r = ranges[k];
      Msg push;
      push.type = MsgType::kPush;
      push.worker = o.worker;
      push.version = job.ps.async ? versions[k] : reply->version;
      push.need = reply->need;
      push.rows = rows;
      push.values.assign(flat.begin() + r.begin, flat.begin() + r.begin + r.count);
      HUDDLE_RETURN_IF_ERROR(servers[k]->Send(std::move(push)));
    }
    for (size_t k = 0; k < servers.size(); ++k) {
      auto got = servers[k]->Receive(timeout);
      if (!got.ok()) return failed(static_cast<int64_t>(k), got.status());
      if (got->type != MsgType::kPushed) {
        return failed(static_cast<int64_t>(k), absl::DataLossError("a reply that is not kPushed"));
      }
      done.staleness = std::max(done.staleness, got->staleness);
      if ((got->flags & 1) == 0) ++done.dropped;
    }
    done.rows = rows;
    done.loss_sum = totals.loss_sum;
    done.correct = totals.correct;
    ++stats.steps;
    stats.examples += rows;
    if (o.vanish_after_step && o.vanish_after_step(stats.steps)) {
      spdlog::warn("worker rank {}: vanishing after step {} (fault injection)", rank, stats.steps);
      return absl::AbortedError(absl::StrCat("worker rank ", rank, " vanished for testing"));
    }
  }
}

}  // namespace huddle::datacenter
