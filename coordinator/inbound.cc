// The coordinator's front door (coordinator.h): every inbound message received (Pump), its peer
// authenticated and identified, and dispatched to the part it is for (Handle): joins and rejoins to
// the population, revoked keys and impersonations refused, malformed messages and messages of a
// type no client may send counted and answered; the round's and the evaluation's messages to their
// handlers. Warnings about peers go through one flood-proof log per kind (Warn). Every reply and
// refusal leaves by Reply/Refuse (a failed reply is logged, never fatal).
#include <spdlog/spdlog.h>

#include "coordinator/coordinator.h"
#include "models/wire_spec.h"

namespace huddle::coordinator {
namespace {

using transport::PeerName;

// The model goes to a member at most twice a round (once, and once more after a restart).
constexpr int kMaxFitsPerRound = 2;

}  // namespace

void Coordinator::Pump(int64_t timeout_ms) {
  auto in = transport_->Receive(timeout_ms);
  if (!in.ok()) {
    spdlog::error("transport: {}", in.status().message());
    return;
  }
  FlushLogs();
  if (!in->has_value()) return;
  Handle(std::move(**in));
  // Drain whatever else is already queued without waiting.
  for (int i = 0; i < 256; ++i) {
    auto more = transport_->Receive(0);
    if (!more.ok() || !more->has_value()) break;
    Handle(std::move(**more));
  }
}

void Coordinator::Handle(transport::Inbound in) {
  const uint64_t current = round_ ? round_->number : 0;
  if (!in.message.ok() && absl::IsPermissionDenied(in.message.status())) {
    OnRevokedKey(in);
    return;
  }
  if (!in.message.ok()) {
    const Status& err = in.message.status();
    const std::string* known = population_.IdOf(in.peer);
    const std::string who = known != nullptr ? "client " + *known : "peer " + PeerName(in.peer);
    Warn(absl::IsFailedPrecondition(err) ? "messages of another protocol version"
                                         : "malformed messages",
         in.auth_id.empty() ? who : in.auth_id,
         [&] { return absl::StrCat(who, ": ", err.message()); });
    (round_ ? round_->metrics.malformed : pending_malformed_)++;
    const auto code = absl::IsFailedPrecondition(err) ? wire::ErrorCode::kVersionMismatch
                                                      : wire::ErrorCode::kMalformed;
    Reply(in.peer, wire::MakeError(code, std::string(err.message()), current));
    if (known != nullptr && EvaluationPending(*known)) {
      // Garbage in answer to an evaluation: the client fails for it now, not at its deadline.
      eval_->metrics.rejected++;
      FailEvaluator(*known, "sent a malformed message while evaluating");
    }
    // The round the member is in: the open one, or its asynchronous secure session.
    SecureSession* session = known != nullptr && secure_async() ? SessionOf(*known) : nullptr;
    Round* open = session != nullptr ? &session->round : round_ ? &*round_ : nullptr;
    if (open != nullptr && known != nullptr) {
      const std::string id = *known;
      // A member holding an upload slot that sends garbage gives the slot back now, not at
      // round.upload_timeout_s: it cannot hold up the others.
      auto m = open->members.find(id);
      if (async_ ? async_->Uploading(id)
                 : m != open->members.end() && m->second == MemberState::kUploading) {
        open->metrics.rejected++;
        if (open->first_rejection.empty()) {
          open->first_rejection = absl::StrCat("malformed: ", err.message());
        }
        FailMember(id, "sent a malformed result");
      } else {
        OnRefusedSecAggMessage(id, absl::StrCat("malformed: ", err.message()));
      }
    }
    return;
  }
  wire::Message& msg = *in.message;
  if (msg.type() == wire::MessageType::kJoin) {
    OnJoin(in, msg);
    return;
  }
  const std::string* known = population_.IdOf(in.peer);
  if (known == nullptr) {
    Refuse(in.peer, wire::ErrorCode::kUnknownClient,
           "this connection has not joined (send Join first)", msg.round);
    return;
  }
  const std::string id = *known;
  if (transport_->authenticates() && in.auth_id != id) {
    // A connection presenting another connection's routing id: the key decides who it is.
    RefuseIdentity(in, absl::StrCat("this connection's key is enrolled as '", in.auth_id,
                                    "'; it cannot speak for client '", id, "'"));
    return;
  }
  population_.Heard(id);
  switch (msg.type()) {
    case wire::MessageType::kHeartbeat:
      Reply(in.peer, wire::MakeMessage(wire::Heartbeat{}, current, "coordinator"));
      return;
    case wire::MessageType::kUploadRequest:
    case wire::MessageType::kFitResult:
      if (secure_async()) {
        // To the message's session; one that is over (or never was) is a closed round.
        if (SyncRound* sched = RoundOf(msg.round).sched) {
          (msg.type() == wire::MessageType::kFitResult) ? sched->OnFitResult(id, msg)
                                                        : sched->OnUploadRequest(id, msg);
        } else {
          CountStale();
          Refuse(in.peer, wire::ErrorCode::kWrongRound,
                 absl::StrCat("round ", msg.round, " is closed"), msg.round);
        }
      } else if (async_) {
        (msg.type() == wire::MessageType::kFitResult) ? async_->OnFitResult(id, msg)
                                                      : async_->OnUploadRequest(id, msg);
      } else {
        (msg.type() == wire::MessageType::kFitResult) ? sync_->OnFitResult(id, msg)
                                                      : sync_->OnUploadRequest(id, msg);
      }
      return;
    case wire::MessageType::kError:
      if (EvaluationPending(id) && msg.round == eval_->round) {
        OnEvaluateError(id, msg);
      } else if (secure_async()) {
        if (SyncRound* sched = RoundOf(msg.round).sched) {
          sched->OnClientError(id, msg);
        } else {
          CountStale();
        }
      } else if (async_) {
        async_->OnClientError(id, msg);
      } else {
        sync_->OnClientError(id, msg);
      }
      return;
    case wire::MessageType::kEvaluateResult:
      OnEvaluateResult(id, msg);
      return;
    case wire::MessageType::kSecAggData:
    case wire::MessageType::kSecAggMaskedInput:
      OnSecAgg(id, msg);
      return;
    default: {
      Warn("messages of a type a client may not send", id, [&] {
        return absl::StrCat("client ", id, ": unexpected ", wire::MessageTypeName(msg.type()),
                            " message");
      });
      (round_ ? round_->metrics.malformed : pending_malformed_)++;
      const std::string why =
          absl::StrCat("a client may not send ", wire::MessageTypeName(msg.type()));
      Refuse(in.peer, wire::ErrorCode::kMalformed, why, msg.round);
      OnRefusedSecAggMessage(id, why);
    }
  }
}

void Coordinator::Warn(const std::string& what, const std::string& source,
                       const std::function<std::string()>& detail) {
  logs_.try_emplace(what, what).first->second.Add(clock_->NowMs(), source, detail);
}

void Coordinator::FlushLogs() {
  const int64_t now = clock_->NowMs();
  for (auto& [what, log] : logs_) log.Flush(now);
}

void Coordinator::OnJoin(const transport::Inbound& in, const wire::Message& msg) {
  const transport::PeerId& peer = in.peer;
  const auto& join = std::get<wire::Join>(msg.body);
  if (!wire::IsValidClientId(join.client_id)) {
    Warn("joins with an invalid client id", in.auth_id.empty() ? PeerName(peer) : in.auth_id, [&] {
      return absl::StrCat("peer ", PeerName(peer), ": refused join with invalid client id");
    });
    Refuse(peer, wire::ErrorCode::kRejected, "client id must be 1-128 characters of [A-Za-z0-9._-]",
           0);
    return;
  }
  if (transport_->authenticates() && join.client_id != in.auth_id) {
    RefuseIdentity(in, absl::StrCat("this connection's key is enrolled as '", in.auth_id,
                                    "'; it cannot join as '", join.client_id, "'"));
    return;
  }
  const Population::Joined joined =
      population_.Join(join.client_id, peer, join.num_examples, 2 * options_.heartbeat_interval_ms);
  const bool rejoin = joined.rejoin;
  const transport::PeerId& old_peer = joined.old_peer;
  if (joined.old_peer_live) {
    // The old connection was alive a moment ago: two agents may share this id (ids must be
    // unique). The newest connection wins; the other will be told it is unknown and rejoin.
    Warn("joins from a second live connection", join.client_id, [&] {
      return absl::StrCat("client ", join.client_id, " joined from a second connection (",
                          PeerName(peer), ") while its first (", PeerName(old_peer),
                          ") is live; client ids must be unique");
    });
  }
  // Each first join at info while the population is small (a simulation of thousands logs a
  // summary); rejoins as one flood-proof summary, so that a rejoin flood cannot flood the log. A
  // second Join on the same connection is no rejoin: the agent sent it again before our Welcome
  // reached it (its backoff is shorter than a busy handshake); it is welcomed again, quietly.
  if (rejoin && old_peer == peer) {
    spdlog::debug("client {} sent Join again on its connection; welcoming it again",
                  join.client_id);
  } else if (!rejoin) {
    spdlog::log(population_.size() <= 32 ? spdlog::level::info : spdlog::level::debug,
                "client {} joined ({} examples, {} live)", join.client_id, join.num_examples,
                population_.LiveCount());
  } else {
    Warn("rejoins", join.client_id, [&] {
      return absl::StrCat("client ", join.client_id, " rejoined (", join.num_examples,
                          " examples, ", population_.LiveCount(), " live)");
    });
  }
  wire::Welcome welcome;
  welcome.job_name = options_.job_name;
  welcome.model = models::ModelSpecToWire(options_.model);
  welcome.heartbeat_interval_ms = static_cast<uint32_t>(options_.heartbeat_interval_ms);
  Reply(peer, wire::MakeMessage(std::move(welcome), 0, "coordinator"));
  // An asynchronous task's client that comes back (it restarted, or lost us) lost its task: it
  // is free for a new one once the model moves on.
  if (async_) {
    async_->FailMember(join.client_id, "rejoined: its task is dropped");
    return;
  }
  if (secure_async()) {
    // Its keys and shares of its session are gone with its restart: a dropout.
    if (SecureSession* session = SessionOf(join.client_id)) {
      session->sched->FailMember(
          join.client_id, "rejoined mid-session: it leaves the session's secure aggregation");
    }
    return;
  }
  // A cohort member that comes back mid-round (it restarted, or lost us) gets its work again.
  if (round_) {
    auto m = round_->members.find(join.client_id);
    if (m != round_->members.end() && m->second != MemberState::kDone &&
        m->second != MemberState::kFailed) {
      if (round_->secure) {
        // Its keys and shares of this round are gone with its restart: a dropout.
        FailMember(join.client_id, "rejoined mid-round: it leaves the round's secure aggregation");
        return;
      }
      if (round_->fits_sent[join.client_id] >= kMaxFitsPerRound) {
        // The model goes to a member at most twice a round (once, and once more after a restart):
        // a rejoin flood must not multiply the bytes sent.
        FailMember(join.client_id, "rejoined again mid-round; its work is not sent a third time");
        return;
      }
      slots_.Release(join.client_id);  // its grant was for the old connection
      m->second = MemberState::kTraining;
      sync_->SendFit(join.client_id);
      sync_->GrantSlots();
    }
  }
}

void Coordinator::RefuseIdentity(const transport::Inbound& in, const std::string& why) {
  (round_ ? round_->metrics.auth_rejected : pending_auth_rejected_)++;
  Warn("identity refusals", in.auth_id, [&] {
    return absl::StrCat("peer ", PeerName(in.peer), " (key enrolled as '", in.auth_id, "'): ", why);
  });
  Refuse(in.peer, wire::ErrorCode::kAuthRefused, why, 0);
}

void Coordinator::OnRevokedKey(const transport::Inbound& in) {
  (round_ ? round_->metrics.auth_rejected : pending_auth_rejected_)++;
  const std::string why(in.message.status().message());
  const Population::Client* client = population_.Find(in.auth_id);
  if (client != nullptr && client->peer == in.peer) {
    // The key was removed from the allow-list: the client leaves the population now, and its
    // work in the open round or evaluation (if any) fails.
    spdlog::warn("client {}: {}; removing it from the federation", in.auth_id, why);
    if (round_ || async_ || !sessions_.empty()) {
      FailMember(in.auth_id, "lost its enrollment (key revoked)");
    }
    FailEvaluator(in.auth_id, "lost its enrollment (key revoked)");
    population_.Remove(in.auth_id, in.peer);
  } else {
    Warn("messages with a revoked key", in.auth_id,
         [&] { return absl::StrCat("peer ", PeerName(in.peer), ": ", why); });
  }
  Refuse(in.peer, wire::ErrorCode::kAuthRefused, why, 0);
}

void Coordinator::Reply(const transport::PeerId& peer, const wire::Message& msg) {
  Status st = transport_->Send(peer, msg);
  if (!st.ok()) spdlog::debug("reply to {} not sent: {}", PeerName(peer), st.message());
}

void Coordinator::Refuse(const transport::PeerId& peer, wire::ErrorCode code,
                         const std::string& text, uint64_t round) {
  Reply(peer, wire::MakeError(code, text, round));
}

void Coordinator::CountStale() { (round_ ? round_->metrics.stale : pending_stale_)++; }

}  // namespace huddle::coordinator
