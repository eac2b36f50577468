// The coordinator's side of a round's secure aggregation (secure_round.h): the session started
// from the round's settings, members' messages checked against the round and handed to it, and
// what the session asks of its host (messages, fit instructions, the ledger).
#include <spdlog/spdlog.h>

#include "coordinator/coordinator.h"

namespace huddle::coordinator {

StatusOr<std::unique_ptr<SecureRound>> Coordinator::StartSecureRound(
    Round& round, const std::vector<std::string>& cohort, SecureRoundHost* host, int64_t enough) {
  SecureRoundSettings s;
  s.round = round.number;
  s.deadline_ms = round.deadline_ms;
  s.job_name = options_.job_name;
  s.options = &options_.secure_aggregation;
  s.layout = layout_;
  s.quorum = dp() ? 1 : options_.quorum;
  s.dp = dp();
  s.distributed = dp() && privacy_->mode() == privacy::PrivacyMode::kDistributed;
  s.clip_norm = dp() ? round.privacy.clip_norm : options_.max_update_norm;
  s.noise_multiplier = round.privacy.noise_multiplier;
  s.weight_cap = round.weight_cap;
  s.enough = enough;
  return SecureRound::Start(std::move(s), cohort, &round.members, &secagg_excluded_,
                            host != nullptr ? host : this, clock_);
}

Status Coordinator::SendToMember(const std::string& id, const wire::Message& msg) {
  const Population::Client* client = population_.Find(id);
  if (client == nullptr) return absl::NotFoundError(absl::StrCat("client ", id, " has left"));
  Status st = transport_->Send(client->peer, msg);
  // NotFound means "has left" to the session; a failed send is "unreachable" whatever its code.
  if (!st.ok()) return absl::UnavailableError(st.message());
  return absl::OkStatus();
}

void Coordinator::SendFit(const std::string& id, int64_t deadline_ms) {
  round_->deadline_ms = std::max(round_->deadline_ms, deadline_ms);
  sync_->SendFit(id);
}

StatusOr<std::pair<privacy::Spend, bool>> Coordinator::WouldSpend(
    const privacy::LedgerEntry& entry) {
  return privacy_->WouldSpend(entry);
}

Status Coordinator::Account(const privacy::LedgerEntry& entry) { return privacy_->Account(entry); }

Coordinator::RoundRef Coordinator::RoundOf(uint64_t number) {
  if (secure_async()) {
    SecureSession* session = SessionFor(number);
    if (session == nullptr || session->over) return {};
    return {&session->round, session->sched.get(), &session->slots, session->model_version};
  }
  if (!round_ || round_->number != number) return {};
  return {&*round_, &*sync_, &slots_, model_version_};
}

void Coordinator::OnRefusedSecAggMessage(const std::string& id, const std::string& why) {
  Round* open = nullptr;
  if (secure_async()) {
    SecureSession* session = SessionOf(id);
    if (session != nullptr) open = &session->round;
  } else if (round_) {
    open = &*round_;
  }
  if (open == nullptr || !open->secure) return;
  Round& round = *open;
  auto m = round.members.find(id);
  if (m == round.members.end() || !round.secure->Awaits(id, m->second)) return;
  round.metrics.rejected++;
  if (round.first_rejection.empty()) round.first_rejection = why;
  FailMember(id, "sent a refused message while a secure-aggregation stage awaited its answer");
}

void Coordinator::OnSecAgg(const std::string& id, const wire::Message& msg) {
  const transport::PeerId peer = population_.PeerOf(id);
  const RoundRef ref = RoundOf(msg.round);
  if (ref.round == nullptr || !ref.round->secure) {
    CountStale();
    Refuse(peer, wire::ErrorCode::kWrongRound,
           absl::StrCat("round ", msg.round, " is closed or does not aggregate securely"),
           msg.round);
    return;
  }
  Round& round = *ref.round;
  auto m = round.members.find(id);
  if (m == round.members.end() || !IsOpen(m->second)) {
    round.metrics.rejected++;
    Refuse(peer, wire::ErrorCode::kRejected,
           absl::StrCat("client ", id, " has no part in round ", round.number, "'s aggregation"),
           msg.round);
    return;
  }
  Status st = round.secure->OnMessage(id, msg, round.nonces[id], ref.model_version);
  if (st.ok()) {
    if (msg.type() == wire::MessageType::kSecAggMaskedInput) {
      // Its upload is done: the slot goes to the next member. (A refused input fails the member
      // below, which frees the slot the same way.)
      ref.slots->Release(id);
      ref.sched->GrantSlots();
    }
    return;
  }
  const std::string why(st.message());
  round.metrics.rejected++;
  if (round.first_rejection.empty()) round.first_rejection = why;
  Warn("refused secure-aggregation messages", id,
       [&] { return absl::StrCat("client ", id, ": round ", round.number, ": ", why); });
  Refuse(peer, wire::ErrorCode::kInvalidUpdate, why, round.number);
  FailMember(id, "sent a refused secure-aggregation message");
}

}  // namespace huddle::coordinator
