#include "datacenter/parameter_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "datacenter/ps_plan.h"
#include "datacenter/ps_shard.h"
#include "datacenter/ps_wire.h"
#include "models/trainer.h"

namespace huddle::datacenter {
namespace {

using std::chrono::milliseconds;
using SteadyTime = std::chrono::steady_clock;

int64_t NowMs() {
  return std::chrono::duration_cast<milliseconds>(SteadyTime::now().time_since_epoch()).count();
}
double SecondsSince(SteadyTime::time_point start) {
  return std::chrono::duration<double>(SteadyTime::now() - start).count();
}

int64_t TotalFloats(const TensorList& params) {
  int64_t total = 0;
  for (const Tensor& t : params) total += t.NumElements();
  return total;
}

Msg ErrorMsg(const Msg& request, std::string text) {
  Msg m;
  m.type = MsgType::kError;
  m.seq = request.seq;
  m.text = std::move(text);
  return m;
}

// A worker's task request that server 0 answers later (the SSP gate, the epoch barrier, the rest
// of a sync step): answered when there is work, or with kWait after a quarter of the timeout so
// that a waiting worker re-asks and stays heard.
struct Pending {
  std::string peer;
  int64_t seq = 0;
  int64_t since_ms = 0;
};

// Server 0's part: the dispatcher, the other servers, the epoch reports.
class Coordinator {
 public:
  Coordinator(const PsJob& job, const PsServerOptions& o, Dispatcher dispatcher, Shard& shard,
              std::vector<ShardRange> ranges)
      : job_(job), o_(o), d_(std::move(dispatcher)), shard_(shard), ranges_(std::move(ranges)) {}

  Status ConnectServers(transport::KvStore& store, uint64_t tag, int64_t max_values) {
    for (int k = 1; k < static_cast<int>(ranges_.size()); ++k) {
      HUDDLE_ASSIGN_OR_RETURN(std::string url, store.Get(absl::StrCat(job_.key_prefix, "/ps/", k),
                                                         milliseconds(job_.timeout_ms)));
      HUDDLE_ASSIGN_OR_RETURN(auto dealer, PsDealer::Connect(url, job_.auth, tag, max_values));
      servers_.push_back(std::move(dealer));
    }
    return absl::OkStatus();
  }

  // A resume: every other server's shard from the checkpoint.
  Status Restore(const std::vector<float>& params, const std::vector<float>& velocity,
                 int64_t version) {
    for (size_t k = 1; k < ranges_.size(); ++k) {
      const ShardRange& r = ranges_[k];
      Msg m;
      m.type = MsgType::kRestore;
      m.version = version;
      m.values.assign(params.begin() + r.begin, params.begin() + r.begin + r.count);
      if (!velocity.empty()) {
        m.values.insert(m.values.end(), velocity.begin() + r.begin,
                        velocity.begin() + r.begin + r.count);
      }
      HUDDLE_RETURN_IF_ERROR(Call(k, std::move(m)).status());
    }
    return absl::OkStatus();
  }

  // A worker's kNext: its finished batch (if any), then its next task (now or later).
  void OnNext(PsRouter& router, const std::string& peer, const Msg& m) {
    const int64_t w = m.worker;
    if (w < 0 || w >= job_.world_size - job_.ps.servers) {
      if (Status st = router.Send(peer, ErrorMsg(m, absl::StrCat("no worker ", w))); !st.ok()) {
        spdlog::warn("{}", st.message());
      }
      return;
    }
    if (m.batch >= 0) {
      const bool counted = d_.Done(w, m.epoch, m.batch, m.version, NowMs());
      stats_.late_dropped += m.dropped > 0 ? 1 : 0;
      if (counted) {
        ++stats_.gradients;
        loss_sum_ += m.loss_sum;
        correct_ += static_cast<double>(m.correct);
        rows_ += m.rows;
        if (job_.ps.async) {
          ++stats_.staleness_count;
          stats_.staleness_sum += static_cast<double>(m.staleness);
          stats_.staleness_max = std::max(stats_.staleness_max, m.staleness);
        }
      }
    }
    pending_[w] = Pending{peer, m.seq, NowMs()};
    Answer(router, w, /*final=*/false);
  }

  // Answers worker w's pending request if there is something to say (or `final`: kWait).
  void Answer(PsRouter& router, int64_t w, bool final) {
    auto it = pending_.find(w);
    if (it == pending_.end()) return;
    const Task t = d_.Next(w, NowMs());
    if (t.kind == Task::Kind::kWait && !final) return;
    Msg reply;
    reply.type = MsgType::kTask;
    reply.seq = it->second.seq;
    reply.flags = static_cast<uint16_t>(t.kind);
    reply.epoch = t.epoch;
    reply.batch = t.batch;
    reply.version = t.version;
    reply.need = t.need;
    if (t.kind == Task::Kind::kFinished) told_finished_.insert(w);
    if (Status st = router.Send(it->second.peer, reply); !st.ok()) {
      spdlog::warn("worker rank {}: {}", job_.ps.servers + w, st.message());
    }
    pending_.erase(it);
  }

  // Once per loop: liveness, pending answers, epoch reports, pings. OK(true) when the job is over.
  StatusOr<bool> Tick(PsRouter& router) {
    if (o_.stop != nullptr && o_.stop->load() && !d_.finished()) {
      return absl::CancelledError(absl::StrCat("stopped on request in epoch ", d_.epoch() + 1,
                                               "; --resume continues from the last checkpoint"));
    }
    const int64_t now = NowMs();
    for (int64_t w : d_.CheckLiveness(now)) {
      const int64_t rank = job_.ps.servers + w;
      stats_.dead_ranks.push_back(rank);
      pending_.erase(w);
      spdlog::warn(
          "worker rank {} is silent for {} ms: declared dead; its batches go to the "
          "others ({} workers left)",
          rank, job_.timeout_ms, d_.live_workers());
    }
    if (d_.live_workers() == 0 && !d_.finished()) {
      return absl::UnavailableError(absl::StrCat("every worker is dead (ranks ",
                                                 absl::StrJoin(stats_.dead_ranks, ", "), ")"));
    }
    if (d_.epoch_complete()) {
      HUDDLE_RETURN_IF_ERROR(ReportEpoch());
      d_.AdvanceEpoch();
      if (d_.finished()) finished_at_ms_ = NowMs();
    }
    std::vector<int64_t> waiting;
    for (const auto& [w, p] : pending_) waiting.push_back(w);
    for (int64_t w : waiting) {
      Answer(router, w, /*final=*/now - pending_[w].since_ms > job_.timeout_ms / 4);
    }
    if (now - last_ping_ms_ > job_.timeout_ms / 4) {
      for (size_t k = 1; k < ranges_.size(); ++k) {
        Msg ping;
        ping.type = MsgType::kPing;
        HUDDLE_RETURN_IF_ERROR(Call(k, std::move(ping)).status());
      }
      last_ping_ms_ = NowMs();
    }
    if (!d_.finished()) return false;
    // Over when every live worker was told, or a timeout after the end (the rest are gone).
    bool all_told = true;
    for (int64_t w = 0; w < job_.world_size - job_.ps.servers; ++w) {
      const bool dead = std::find(stats_.dead_ranks.begin(), stats_.dead_ranks.end(),
                                  job_.ps.servers + w) != stats_.dead_ranks.end();
      if (!dead && !told_finished_.contains(w)) all_told = false;
    }
    return all_told || now - finished_at_ms_ > job_.timeout_ms;
  }

  // The other servers end (best effort: the job is over either way).
  void StopServers() {
    for (size_t k = 1; k < ranges_.size(); ++k) {
      Msg stop;
      stop.type = MsgType::kStop;
      if (auto st = Call(k, std::move(stop)); !st.ok()) {
        spdlog::warn("server rank {}: {}", k, st.status().message());
      }
    }
  }

  PsStats Stats() {
    stats_.steps = shard_.version();
    stats_.seconds = SecondsSince(start_);
    stats_.ssp_waits = d_.ssp_waits();
    stats_.ssp_wait_seconds = d_.ssp_wait_seconds();
    stats_.requeued = d_.requeued();
    return stats_;
  }
  bool finished() const { return d_.finished(); }
  void set_training_start(SteadyTime::time_point t) {
    start_ = epoch_start_ = t;
    finished_at_ms_ = NowMs();  // a resume of a finished job: over when its workers are told
  }

 private:
  StatusOr<Msg> Call(size_t k, Msg m) {
    auto reply = servers_[k - 1]->Request(std::move(m), milliseconds(job_.timeout_ms));
    if (!reply.ok()) {
      return Status(reply.status().code(),
                    absl::StrCat("server rank ", k, ": ", reply.status().message()));
    }
    return reply;
  }

  // The epoch just completed: every shard gathered (nothing is in flight at the barrier), the
  // state and the report handed to on_epoch.
  Status ReportEpoch() {
    const int64_t total = TotalFloats(job_.init);
    std::vector<float> params(static_cast<size_t>(total));
    std::vector<float> velocity;
    const bool momentum = job_.train.momentum != 0.0;
    if (momentum) velocity.assign(static_cast<size_t>(total), 0.0f);
    std::copy(shard_.params().begin(), shard_.params().end(), params.begin());
    if (momentum) std::copy(shard_.velocity().begin(), shard_.velocity().end(), velocity.begin());
    for (size_t k = 1; k < ranges_.size(); ++k) {
      Msg ask;
      ask.type = MsgType::kSnapshot;
      HUDDLE_ASSIGN_OR_RETURN(Msg got, Call(k, std::move(ask)));
      const ShardRange& r = ranges_[k];
      const auto expect = static_cast<size_t>(r.count * (momentum ? 2 : 1));
      if (got.type != MsgType::kShardState || got.values.size() != expect) {
        return absl::DataLossError(absl::StrCat("server rank ", k, " sent a shard of ",
                                                got.values.size(), " values; ", expect,
                                                " expected"));
      }
      std::copy(got.values.begin(), got.values.begin() + r.count, params.begin() + r.begin);
      if (momentum) {
        std::copy(got.values.begin() + r.count, got.values.end(), velocity.begin() + r.begin);
      }
    }
    state_.epochs_done = d_.epoch() + 1;
    state_.steps = shard_.version();
    state_.seed = job_.seed;
    state_.world_size = job_.world_size;
    state_.batch_size = job_.train.batch_size;
    state_.seconds = o_.seconds_before + SecondsSince(start_);
    state_.dp_sgd = false;
    state_.params = job_.init;
    UnflattenParams(params, &state_.params);
    state_.velocity.clear();
    if (momentum) {
      state_.velocity = job_.init;
      UnflattenParams(velocity, &state_.velocity);
    }
    const double rows = static_cast<double>(std::max<int64_t>(rows_, 1));
    stats_.loss = loss_sum_ / rows;
    stats_.accuracy = correct_ / rows;
    loss_sum_ = correct_ = 0;
    rows_ = 0;
    EpochReport report{d_.epoch(),
                       state_.steps,
                       stats_.loss,
                       stats_.accuracy,
                       state_.seconds,
                       SecondsSince(epoch_start_),
                       job_.train.epochs,
                       d_.epoch() + 1 == job_.train.epochs,
                       &state_};
    if (!std::isfinite(stats_.loss)) {
      return models::LossDiverged(d_.epoch(), job_.train.learning_rate);
    }
    if (o_.on_epoch) HUDDLE_RETURN_IF_ERROR(o_.on_epoch(report, Stats()));
    epoch_start_ = SteadyTime::now();
    return absl::OkStatus();
  }

  const PsJob& job_;
  const PsServerOptions& o_;
  Dispatcher d_;
  Shard& shard_;
  std::vector<ShardRange> ranges_;
  std::vector<std::unique_ptr<PsDealer>> servers_;  // server k at k - 1
  std::map<int64_t, Pending> pending_;
  std::set<int64_t> told_finished_;
  PsStats stats_;
  double loss_sum_ = 0, correct_ = 0;
  int64_t rows_ = 0;
  TrainingState state_;
  SteadyTime::time_point start_ = SteadyTime::now(), epoch_start_ = SteadyTime::now();
  int64_t last_ping_ms_ = 0, finished_at_ms_ = 0;
};

// A message for the shard (any server): kPull, kPush. Anything else is for the caller.
std::optional<Msg> ServeShard(Shard& shard, const Msg& m) {
  Msg reply;
  reply.seq = m.seq;
  if (m.type == MsgType::kPull) {
    reply.type = MsgType::kParams;
    reply.version = shard.version();
    reply.values = shard.params();
    return reply;
  }
  if (m.type != MsgType::kPush) return std::nullopt;
  auto pushed = shard.Push(m.version, m.rows, m.need, m.values);
  if (!pushed.ok()) return ErrorMsg(m, std::string(pushed.status().message()));
  reply.type = MsgType::kPushed;
  reply.flags = pushed->accepted ? 1 : 0;
  reply.staleness = pushed->staleness;
  reply.version = pushed->version;
  return reply;
}

}  // namespace

Status ValidatePsJob(const PsJob& job) {
  const ParameterServerConfig& ps = job.ps;
  const int64_t workers = job.world_size - ps.servers;
  if (workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "datacenter.parameter_server.servers is ", ps.servers, " with ", job.world_size,
        " ranks: at least one rank must be left for a worker (ranks [0, servers) are servers)"));
  }
  if (ps.backup_workers >= workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "datacenter.parameter_server.backup_workers is ", ps.backup_workers, " with ", workers,
        " workers: it must be below the workers (a step takes workers - backup_workers "
        "gradients)"));
  }
  if (ps.servers > TotalFloats(job.init)) {
    return absl::InvalidArgumentError(absl::StrCat("datacenter.parameter_server.servers is ",
                                                   ps.servers, " for a model of ",
                                                   TotalFloats(job.init), " parameters"));
  }
  if (job.examples < 1) return absl::InvalidArgumentError("the training set is empty");
  return models::CheckTrainOptions(job.train);
}

uint64_t PsJobTag(const PsJob& job) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the values the ranks must share
  const auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  const auto bits = [](double d) {
    uint64_t b = 0;
    std::memcpy(&b, &d, sizeof b);
    return b;
  };
  mix(static_cast<uint64_t>(TotalFloats(job.init)));
  for (const Tensor& t : job.init) mix(static_cast<uint64_t>(t.NumElements()));
  mix(job.seed);
  mix(static_cast<uint64_t>(job.train.epochs));
  mix(static_cast<uint64_t>(job.train.batch_size));
  mix(bits(job.train.learning_rate));
  mix(bits(job.train.momentum));
  mix(bits(job.train.weight_decay));
  mix(static_cast<uint64_t>(job.world_size));
  mix(static_cast<uint64_t>(job.examples));
  mix(static_cast<uint64_t>(job.ps.servers));
  mix(job.ps.async ? 1 : 0);
  mix(static_cast<uint64_t>(job.ps.staleness_bound.value_or(-1)));
  mix(static_cast<uint64_t>(job.ps.backup_workers));
  return h;
}

std::string PsJobDescription(const PsJob& job) {
  return fmt::format(
      "{} parameters, seed {}, {} epochs of batch {}, learning rate {:g}, momentum {:g}, weight "
      "decay {:g}, world size {}, {} training examples, {} server(s), {}{}{}",
      TotalFloats(job.init), job.seed, job.train.epochs, job.train.batch_size,
      job.train.learning_rate, job.train.momentum, job.train.weight_decay, job.world_size,
      job.examples, job.ps.servers, job.ps.async ? "async" : "sync",
      job.ps.staleness_bound ? fmt::format(", staleness_bound {}", *job.ps.staleness_bound) : "",
      job.ps.backup_workers > 0 ? fmt::format(", backup_workers {}", job.ps.backup_workers) : "");
}

std::vector<float> FlattenParams(const TensorList& params) {
  std::vector<float> flat;
  flat.reserve(static_cast<size_t>(TotalFloats(params)));
  for (const Tensor& t : params) flat.insert(flat.end(), t.data.begin(), t.data.end());
  return flat;
}

void UnflattenParams(const std::vector<float>& flat, TensorList* params) {
  size_t at = 0;
  for (Tensor& t : *params) {
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at),
              flat.begin() + static_cast<std::ptrdiff_t>(at + t.data.size()), t.data.begin());
    at += t.data.size();
  }
}

StatusOr<PsStats> RunPsServer(transport::KvStore& store, const PsJob& job,
                              const PsServerOptions& o) {
  HUDDLE_RETURN_IF_ERROR(ValidatePsJob(job));
  const int64_t total = TotalFloats(job.init);
  const std::vector<ShardRange> ranges = PlanShards(total, static_cast<int>(job.ps.servers));
  const ShardRange range = ranges[static_cast<size_t>(o.server)];
  const uint64_t tag = PsJobTag(job);
  const int64_t max_values = 2 * total;  // kRestore/kShardState: params and velocity

  // The shard, from the initial parameters or (server 0) the checkpoint.
  std::vector<float> flat = FlattenParams(o.resume ? o.resume->params : job.init);
  std::vector<float> velocity;
  if (o.resume && !o.resume->velocity.empty()) velocity = FlattenParams(o.resume->velocity);
  const auto cut = [&](const std::vector<float>& v) {
    if (v.empty()) return std::vector<float>();
    return std::vector<float>(v.begin() + range.begin, v.begin() + range.begin + range.count);
  };
  const kernels::SgdHyper hyper{static_cast<float>(job.train.learning_rate),
                                static_cast<float>(job.train.momentum),
                                static_cast<float>(job.train.weight_decay)};
  const int64_t version = o.resume ? o.resume->steps : 0;
  Shard shard(range, cut(flat), cut(velocity), version, hyper, job.ps.async);

  HUDDLE_ASSIGN_OR_RETURN(
      auto router, PsRouter::Bind(job.host, job.auth, tag, max_values, PsJobDescription(job)));
  HUDDLE_RETURN_IF_ERROR(store.Set(absl::StrCat(job.key_prefix, "/ps/", o.server), router->url()));
  spdlog::info("parameter server {} of {}: floats [{}, {}) of {}, on {} ({})", o.server,
               job.ps.servers, range.begin, range.begin + range.count, total, router->url(),
               job.auth ? "CurveZMQ, the job's key" : "NOT authenticated");

  std::optional<Coordinator> coordinator;
  if (o.server == 0) {
    DispatcherOptions d;
    d.workers = job.world_size - job.ps.servers;
    d.batches_per_epoch = (job.examples + job.train.batch_size - 1) / job.train.batch_size;
    d.epochs = job.train.epochs;
    d.first_epoch = o.resume ? o.resume->epochs_done : 0;
    d.first_version = version;
    d.async = job.ps.async;
    d.staleness_bound = job.ps.staleness_bound;
    d.backup_workers = job.ps.backup_workers;
    d.timeout_ms = job.timeout_ms;
    HUDDLE_ASSIGN_OR_RETURN(Dispatcher dispatcher, Dispatcher::Create(d, NowMs()));
    coordinator.emplace(job, o, std::move(dispatcher), shard, ranges);
    HUDDLE_RETURN_IF_ERROR(coordinator->ConnectServers(store, tag, max_values));
    if (o.resume) HUDDLE_RETURN_IF_ERROR(coordinator->Restore(flat, velocity, version));
    coordinator->set_training_start(SteadyTime::now());
  }
  int64_t last_heard_ms = NowMs();
  std::set<std::string> warned;  // peers whose malformed message was logged
  for (;;) {
    std::string peer;
    auto got = router->Receive(milliseconds(20), &peer);
    const int64_t now = NowMs();
    if (got.ok()) {
      last_heard_ms = now;
      const Msg& m = *got;
      if (auto served = ServeShard(shard, m)) {
        HUDDLE_RETURN_IF_ERROR(router->Send(peer, *served));
      } else if (coordinator && m.type == MsgType::kNext) {
        coordinator->OnNext(*router, peer, m);
      } else if (!coordinator && m.type != MsgType::kNext) {
        Msg reply;
        reply.seq = m.seq;
        reply.type = m.type == MsgType::kSnapshot ? MsgType::kShardState : MsgType::kAck;
        if (m.type == MsgType::kSnapshot) {
          reply.version = shard.version();
          reply.dropped = shard.dropped();
          reply.values = shard.params();
          reply.values.insert(reply.values.end(), shard.velocity().begin(), shard.velocity().end());
        } else if (m.type == MsgType::kRestore) {
          const auto n = static_cast<size_t>(range.count);
          if (m.values.size() != n && m.values.size() != 2 * n) {
            return absl::DataLossError(
                absl::StrCat("a restore of ", m.values.size(), " values for a shard of ", n));
          }
          std::vector<float> p(m.values.begin(), m.values.begin() + range.count);
          std::vector<float> v;
          if (m.values.size() == 2 * n) v.assign(m.values.begin() + range.count, m.values.end());
          shard = Shard(range, std::move(p), std::move(v), m.version, hyper, job.ps.async);
        }
        HUDDLE_RETURN_IF_ERROR(router->Send(peer, reply));
        if (m.type == MsgType::kStop) return PsStats{};
      } else {
        HUDDLE_RETURN_IF_ERROR(router->Send(peer, ErrorMsg(m, "not a request for this server")));
      }
    } else if (absl::IsInvalidArgument(got.status())) {
      if (warned.insert(peer).second) {
        spdlog::warn("parameter server {}: dropped a message: {}", o.server,
                     got.status().message());
      }
    } else if (!absl::IsNotFound(got.status())) {
      return got.status();
    }
    if (coordinator) {
      auto over = coordinator->Tick(*router);
      if (!over.ok()) {
        coordinator->StopServers();
        return over.status();
      }
      if (*over) {
        coordinator->StopServers();
        return coordinator->Stats();
      }
    } else if (o.stop != nullptr && o.stop->load()) {
      return absl::CancelledError(
          absl::StrCat("parameter server ", o.server, ": stopped on request"));
    } else if (now - last_heard_ms > job.timeout_ms) {
      return absl::DeadlineExceededError(absl::StrCat("parameter server ", o.server,
                                                      ": nothing from server 0 or any worker for ",
                                                      job.timeout_ms, " ms (did server 0 stop?)"));
    }
  }
}

}  // namespace huddle::datacenter
