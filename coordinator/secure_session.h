// Buffered asynchronous training with secure aggregation (`async:` with `secure_aggregation:`;
// Coordinator::RunSecureStep in async_secure.cc): server steps as SecAgg+ sessions.
//
// A session is a cohort of `async.buffer` idle eligible clients sent the same model version
// together, masking against each other (secure_round.h, unchanged); its unmasked sum is one server
// step. `async.concurrency / async.buffer` sessions are in flight at once. Sessions are numbered
// with the step each will be and applied in that order: session k is step k, its sum applied
// after step k - 1's even when it unmasked first (a session that released nothing is a step
// without update, as a synchronous secure round is). So the ledger keeps one entry per step and a
// resume's coverage check holds.
//
// Staleness inside a session: every member trained on the same version v_k (the model when the
// session started), so the whole session has one staleness, tau_k = (k - 1) - v_k, the steps
// applied between its start and its own; it is fixed when the session starts and at most
// sessions - 1. The coordinator sees only the sum, so members cannot be weighted apart: the
// session's released mean is scaled by s(tau_k) (post-processing of the release).
//
// Each session owns what a synchronous secure round owns: its Round (members, nonces, metrics,
// the SecureRound), its upload slots (async.buffer members mask into one running sum, at most
// round.upload_slots uploading at once: memory is sessions x (a sum + upload_slots masked
// inputs)), and a SyncRound over them whose handlers check each message's round (the session's
// number). The session is its SecureRound's host: messages and the ledger go to the coordinator,
// fit instructions and failures stay in the session.
//
// Thread-safety: none; the round loop's thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "coordinator/secure_round.h"
#include "coordinator/sync_round.h"
#include "coordinator/upload_slots.h"

namespace huddle::coordinator {

struct SecureSession final : public SecureRoundHost {
  // `parts` as the coordinator's synchronous scheduler's, with the session's own slots (set
  // here); `coordinator`: the host of messages and of the ledger. Both must outlive the session.
  SecureSession(SchedulerParts parts, SecureRoundHost* coordinator, uint64_t version)
      : slots(parts.transport, parts.clock, parts.options->upload_slots,
              parts.options->upload_timeout_ms),
        model_version(version),
        coordinator_(coordinator) {
    parts.slots = &slots;
    sched = std::make_unique<SyncRound>(std::move(parts));
  }

  // Whether its secure aggregation is over (released or refused), or it never trained.
  bool over = false;
  int64_t start_ms = 0;
  uint64_t in0 = 0, out0 = 0;  // the transport's counters when it started
  Round round;
  UploadSlots slots;
  std::unique_ptr<SyncRound> sched;
  uint64_t model_version = 0;  // v_k, the model its members train on

  // SecureRoundHost.
  Status SendToMember(const std::string& id, const wire::Message& msg) override {
    return coordinator_->SendToMember(id, msg);
  }
  void FailMember(const std::string& id, const char* why) override { sched->FailMember(id, why); }
  void SendFit(const std::string& id, int64_t deadline_ms) override {
    round.deadline_ms = std::max(round.deadline_ms, deadline_ms);
    sched->SendFit(id);
  }
  StatusOr<std::pair<privacy::Spend, bool>> WouldSpend(const privacy::LedgerEntry& entry) override {
    return coordinator_->WouldSpend(entry);
  }
  Status Account(const privacy::LedgerEntry& entry) override {
    return coordinator_->Account(entry);
  }

 private:
  SecureRoundHost* coordinator_;
};

}  // namespace huddle::coordinator
