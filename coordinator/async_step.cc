// The coordinator's buffered asynchronous steps (coordinator.h's RunFlush; the scheduler itself is
// async_round.h): one server step, from opening it to its release through the round's own
// FinishRound.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "coordinator/coordinator.h"

namespace huddle::coordinator {

// One server step of buffered asynchronous training (async_round.h):
//   1. Open the flush on the current model (results kept since the last one fold now).
//   2. Keep async.concurrency clients training (idle eligible clients drawn uniformly); fold each
//      result as it arrives, discounted by its staleness, until async.buffer are in. A flush that
//      cannot fill (every live client already trained on this model, none in flight) closes with
//      what it has (under DP the job ends there instead, the flush unreleased: its noise would be
//      a full step's); one where every task failed sends them again, up to
//      max_rounds_without_update times, then ends the job, as does one that accepts nothing for
//      max_rounds_without_update x round.deadline_s. Under DP the job also ends when no live
//      client may contribute again (privacy.max_participations).
//   3. Close (tasks go on training), then as a round: release, server step, evaluation,
//      metrics, checkpoint.
Status Coordinator::RunFlush(uint64_t number, const std::atomic<bool>* stop) {
  const int64_t start_ms = clock_->NowMs();
  const uint64_t in0 = transport_->bytes_in();
  const uint64_t out0 = transport_->bytes_out();
  round_.emplace();
  Round& flush = *round_;
  BeginRound(flush, number);
  if (dp()) {
    HUDDLE_RETURN_IF_ERROR(privacy_->Configure(number, &flush.privacy, &*aggregator_));
  } else {
    aggregator_->Reset();
  }
  async_->Open(&flush, model_version_, flush.global);
  const int64_t patience_ms =
      std::max<int64_t>(1, options_.max_rounds_without_update) * options_.round_deadline_ms;
  int64_t last_progress_ms = start_ms;
  int64_t results_seen = flush.metrics.results;
  int64_t retry_waves = 0;
  auto fail = [&](const std::string& why) {
    summary_.failure = absl::StrCat(
        why, " while step ", number, " was open (", population_.LiveCount(), " live clients, ",
        async_->in_flight(), " tasks in flight",
        flush.first_rejection.empty() ? ""
                                      : absl::StrCat("; first refusal: ", flush.first_rejection),
        "); stopping");
    async_->Close();
    round_.reset();
    return absl::OkStatus();
  };
  while (!async_->Full()) {
    if (stop != nullptr && stop->load()) {
      // The step's partial sum is dropped (nothing was released from it); a resume continues
      // from the last step's checkpoint.
      async_->Close();
      round_.reset();
      return absl::CancelledError(absl::StrCat("stopped during step ", number));
    }
    async_->TopUp(secagg_excluded_);
    if (flush.metrics.results == 0 && async_->Bounded(secagg_excluded_, /*ever=*/true)) {
      // Nothing is in this step, and no live client may contribute again: the job has done what
      // its participation bound allows (not a failure; a client that joins later could).
      summary_.stop_reason =
          absl::StrCat("every live client has contributed privacy.max_participations (",
                       options_.privacy.max_participations.value_or(0),
                       ") times; stopping before step ", number);
      spdlog::warn("{}", summary_.stop_reason);
      async_->Close();
      round_.reset();
      return absl::OkStatus();
    }
    if (flush.metrics.results == 0 && async_->Bounded(secagg_excluded_, /*ever=*/false)) {
      return fail(absl::StrCat(
          "no live client may contribute to this step: each contributed within the last "
          "privacy.min_separation (",
          options_.privacy.min_separation,
          ") steps; lower it, or add clients (a step needs clients that did not take part in the "
          "steps just before it)"));
    }
    if (async_->Starved(secagg_excluded_)) {
      if (flush.metrics.results > 0 && dp()) {
        // A release costs the same whatever it holds: one of a few updates would be mostly
        // noise. Dropped unreleased (nothing is charged), and the job ends here.
        summary_.stop_reason = absl::StrCat(
            "step ", number, " cannot fill: ", flush.metrics.results, " of async.buffer ",
            options_.async.buffer,
            " updates, and no other client may contribute (each is sent a model once, and at "
            "most privacy.max_participations = ",
            options_.privacy.max_participations.value_or(0), " times, ",
            options_.privacy.min_separation,
            " step(s) apart); the step is dropped unreleased (nothing is charged) and the job "
            "stops");
        spdlog::warn("{}", summary_.stop_reason);
        async_->Close();
        round_.reset();
        return absl::OkStatus();
      }
      if (flush.metrics.results > 0) {
        if (!std::exchange(warned_small_population_, true)) {
          spdlog::warn(
              "step {}: every live client already trained on this model and none is in flight: "
              "the step is taken with {} of async.buffer {} updates (a client is sent each "
              "model version once; more clients, or a smaller buffer, fill it)",
              number, flush.metrics.results, options_.async.buffer);
        }
        break;
      }
      if (population_.LiveCount() > 0) {
        // Every live client's task on this model failed and none succeeded: send it again, as a
        // synchronous job would run another round, at most max_rounds_without_update times.
        if (retry_waves < options_.max_rounds_without_update && async_->AllowRetries()) {
          ++retry_waves;
          last_progress_ms = clock_->NowMs();  // each wave has its own deadline, as a round has
          spdlog::warn("step {}: every task on this model failed; sending it again ({} of {})",
                       number, retry_waves, options_.max_rounds_without_update);
          continue;
        }
        if (retry_waves >= options_.max_rounds_without_update) {
          return fail(absl::StrCat("every live client's task failed ", retry_waves + 1,
                                   " times in a row (coordinator.max_rounds_without_update)"));
        }
      }
    }
    Pump(async_->WaitMs(100));
    async_->Expire();
    const int64_t now = clock_->NowMs();
    if (flush.metrics.results != results_seen) {
      results_seen = flush.metrics.results;
      last_progress_ms = now;
    }
    if (now - last_progress_ms >= patience_ms) {
      return fail(absl::StrCat("no update was accepted for ", patience_ms / 1000,
                               " s (coordinator.max_rounds_without_update x round.deadline_s)"));
    }
  }
  async_->Close();
  EndRoundMetrics(flush, start_ms, in0, out0);
  Status st = FinishRound(flush);
  round_.reset();
  return st;
}

}  // namespace huddle::coordinator
