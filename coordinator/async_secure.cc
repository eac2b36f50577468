// The coordinator's buffered asynchronous steps with secure aggregation (secure_session.h): the
// sessions in flight, each a synchronous secure round of its own cohort, applied in order.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "coordinator/coordinator.h"
#include "privacy/sampling.h"

namespace huddle::coordinator {
namespace {

constexpr uint64_t kSessionSeedStream = 0x73657373;  // "sess"

}  // namespace

int64_t Coordinator::SessionsInFlight() const {
  return std::max<int64_t>(1, options_.async.concurrency / options_.async.buffer);
}

SecureSession* Coordinator::SessionFor(uint64_t number) {
  auto it = sessions_.find(number);
  return it == sessions_.end() ? nullptr : it->second.get();
}

SecureSession* Coordinator::SessionOf(const std::string& id) {
  auto it = session_of_.find(id);
  return it == session_of_.end() ? nullptr : SessionFor(it->second);
}

std::vector<std::string> Coordinator::SessionCandidates(uint64_t number) const {
  std::vector<std::string> idle;
  for (std::string& id : population_.LiveIds(secagg_excluded_)) {
    if (session_of_.contains(id)) continue;
    // A client is sent each model version once (it would train on nothing new).
    if (auto v = session_version_.find(id);
        v != session_version_.end() && v->second >= model_version_) {
      continue;
    }
    if (contributions_ && !contributions_->MaySend(id, number)) continue;
    idle.push_back(std::move(id));
  }
  return idle;
}

StatusOr<bool> Coordinator::StartSession(uint64_t number, bool partial) {
  std::vector<std::string> idle = SessionCandidates(number);
  const auto buffer = static_cast<size_t>(options_.async.buffer);
  // Over-selected: the training stage ends once `buffer` have trained.
  const auto selected = static_cast<size_t>(
      std::ceil(static_cast<double>(buffer) * options_.async.over_selection - 1e-9));
  if (idle.size() < std::max<size_t>(2, partial ? 2 : buffer)) return false;
  // A uniform draw of `selected` of them (a partial Fisher-Yates shuffle; under DP with private
  // noise from the OS CSPRNG, else the job's stream), sorted: a secure cohort's order.
  const size_t n = std::min(idle.size(), selected);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t left = idle.size() - i;
    const size_t j =
        i + static_cast<size_t>(secret_sampling() ? privacy_->sampler()->UniformBelow(left)
                                                  : rng_.UniformInt(left));
    std::swap(idle[i], idle[j]);
  }
  idle.resize(n);
  std::sort(idle.begin(), idle.end());
  if (partial && !std::exchange(warned_small_population_, true)) {
    spdlog::warn(
        "step {}: only {} clients can be sent the model, fewer than async.buffer {}: the session "
        "starts with them (a client is sent each model version once)",
        number, n, buffer);
  }

  // (The coordinator's hosts are private bases: converted here, where they are accessible.)
  SyncRoundHost* round_host = this;
  SecureRoundHost* secure_host = this;
  auto session = std::make_unique<SecureSession>(
      SchedulerParts{&options_, transport_, clock_, &population_, nullptr, &*aggregator_,
                     &*privacy_, layout_, round_host, &rng_},
      secure_host, model_version_);
  SecureSession& s = *session;
  Round& round = s.round;
  s.start_ms = clock_->NowMs();
  s.in0 = transport_->bytes_in();
  s.out0 = transport_->bytes_out();
  s.sched->Begin(&round, model_version_);
  BeginRound(round, number);
  round.deadline_ms = s.start_ms + options_.round_deadline_ms;
  if (dp()) {
    // Local DP: the session's clip norm and the norm bound of its noised updates.
    HUDDLE_RETURN_IF_ERROR(privacy_->Configure(number, &round.privacy, &*aggregator_));
  }
  round.client_seed = secret_sampling() ? privacy_->sampler()->NextU64()
                                        : DeriveSeed(options_.seed, kSessionSeedStream, number);
  for (const std::string& id : idle) {
    round.members.emplace(id, MemberState::kTraining);
    session_of_[id] = number;
    session_version_[id] = model_version_;
  }
  round.metrics.clients_sampled = static_cast<int64_t>(idle.size());
  round.weight_cap = s.sched->WeightCap();
  HUDDLE_ASSIGN_OR_RETURN(
      round.secure,
      StartSecureRound(round, idle, &s, n > buffer ? static_cast<int64_t>(buffer) : 0));
  for (const std::string& id : idle) {
    if (round.secure) {
      s.sched->SendFit(id);
    } else {
      round.members[id] = MemberState::kFailed;
      round.outcomes[id] = {"dropped", "the cohort is too small for secure aggregation"};
    }
  }
  sessions_.emplace(number, std::move(session));
  return true;
}

void Coordinator::StepSession(uint64_t number, SecureSession& s, int64_t* wait_ms) {
  if (s.over) return;
  int64_t wait = 100;
  bool going = false;
  if (s.round.secure) {
    going = s.round.secure->Step();
    wait = s.round.secure->TimeoutMs();
  } else {
    going = s.sched->Step(&wait);  // a cohort too small: every member has failed
  }
  if (going) {
    *wait_ms = std::min(*wait_ms, wait);
    return;
  }
  // Its members are free for other sessions; under DP those whose input the sum holds have
  // contributed to step `number` (contributions.h: durably recorded before its release).
  s.over = true;
  s.slots.Reset();
  const bool released = s.round.secure && s.round.secure->sum();
  for (const auto& [id, state] : s.round.members) {
    auto it = session_of_.find(id);
    if (it != session_of_.end() && it->second == number) session_of_.erase(it);
    if (released && contributions_ && state == MemberState::kDone) {
      contributions_->Contributed(id, number);
    }
  }
}

Status Coordinator::RunSecureStep(uint64_t number, const std::atomic<bool>* stop) {
  const int64_t sessions = SessionsInFlight();
  int64_t retry_waves = 0;
  auto end = [&](std::string why, bool failure) {
    (failure ? summary_.failure : summary_.stop_reason) = std::move(why);
    spdlog::warn("{}", failure ? summary_.failure : summary_.stop_reason);
    return absl::OkStatus();
  };
  for (;;) {
    if (stop != nullptr && stop->load()) {
      // The sessions in flight are dropped (nothing of them was applied); a resume starts anew
      // from the last step's checkpoint.
      sessions_.clear();
      session_of_.clear();
      return absl::CancelledError(absl::StrCat("stopped during step ", number));
    }
    // Sessions number .. number + sessions - 1 (none past the job's last step), started in order
    // while cohorts are free.
    const uint64_t last = std::min<uint64_t>(number + static_cast<uint64_t>(sessions) - 1,
                                             static_cast<uint64_t>(options_.rounds));
    for (uint64_t k = number; k <= last; ++k) {
      if (sessions_.contains(k)) continue;
      if (k > number && !sessions_.contains(k - 1)) break;
      HUDDLE_ASSIGN_OR_RETURN(const bool started, StartSession(k, /*partial=*/false));
      if (!started) break;
    }
    if (!sessions_.contains(number)) {
      bool busy = false;
      for (const auto& [k, s] : sessions_) busy = busy || !s->over;
      if (!busy) {
        // Nothing in flight and no full cohort: start with the clients there are, then let
        // those that already trained on this model train on it again (a session that released
        // nothing), at most max_rounds_without_update times.
        HUDDLE_ASSIGN_OR_RETURN(const bool started, StartSession(number, /*partial=*/true));
        if (!started) {
          if (contributions_ && SessionCandidates(UINT64_MAX).empty() &&
              population_.LiveCount() > 0) {
            bool any = false;
            for (const std::string& id : population_.LiveIds(secagg_excluded_)) {
              any = any || contributions_->MaySend(id, UINT64_MAX);
            }
            if (!any) {
              return end(absl::StrCat("every live client has contributed "
                                      "privacy.max_participations (",
                                      options_.privacy.max_participations.value_or(0),
                                      ") times; stopping before step ", number),
                         /*failure=*/false);
            }
          }
          if (retry_waves < options_.max_rounds_without_update && !session_version_.empty()) {
            ++retry_waves;
            session_version_.clear();
            continue;
          }
          return end(
              absl::StrCat("no session can start for step ", number, ": ", population_.LiveCount(),
                           " live clients, fewer than 2 that may be sent the model "
                           "(secure aggregation needs 2 members at least); stopping"),
              /*failure=*/true);
        }
      }
    }
    int64_t wait_ms = 100;
    for (auto& [k, s] : sessions_) StepSession(k, *s, &wait_ms);
    if (SecureSession* s = SessionFor(number); s != nullptr && s->over) break;
    Pump(wait_ms);
    for (auto& [k, s] : sessions_) {
      if (s->over) continue;
      s->sched->ExpireSilentClients();
      s->sched->RevokeStaleGrants();
    }
  }

  // Session `number` is step `number`.
  auto node = sessions_.extract(number);
  SecureSession& s = *node.mapped();
  Round& round = s.round;
  if (round.secure) {
    round.metrics.secure_aggregation = round.secure->metrics();
    if (round.secure->sum()) {
      round.metrics.results = round.secure->survivors();
      round.metrics.examples = round.secure->examples();
    }
  }
  // One staleness for the whole session: the steps applied since its model.
  const uint64_t staleness = model_version_ - s.model_version;
  round.discount = StalenessFactor(options_.async, staleness);
  RoundMetrics::Async a;
  a.buffer = options_.async.buffer;
  a.concurrency = options_.async.concurrency;
  for (const auto& [k, other] : sessions_) {
    if (!other->over) a.in_flight += static_cast<int64_t>(other->round.members.size());
  }
  a.staleness_mean = static_cast<double>(staleness);
  a.staleness_max = static_cast<int64_t>(staleness);
  a.discount_mean = round.discount;
  round.metrics.async = a;
  EndRoundMetrics(round, s.start_ms, s.in0, s.out0);
  return FinishRound(round);
}

}  // namespace huddle::coordinator
