#include "coordinator/sync_round.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/secure_random.h"
#include "privacy/clip.h"

namespace huddle::coordinator {

SchedulerBase::SchedulerBase(SchedulerParts parts)
    : options_(parts.options),
      transport_(parts.transport),
      clock_(parts.clock),
      population_(parts.population),
      slots_(parts.slots),
      aggregator_(parts.aggregator),
      privacy_(parts.privacy),
      layout_(std::move(parts.layout)),
      host_(parts.host),
      rng_(parts.rng),
      sampler_(parts.sampler),
      contributions_(parts.contributions),
      norm_bound_(options_->max_update_norm, options_->auto_norm_factor) {}

StatusOr<bool> SchedulerBase::FoldBounded(std::vector<std::span<const float>> spans,
                                          uint64_t number, int64_t weight, double discount) {
  const double norm = norm_bound_.enabled() ? privacy::L2Norm(spans) : 0;
  const double bound = norm_bound_.BoundFor(number, norm);
  // A non-finite norm is left to Fold, which refuses it naming the element.
  const bool clip = bound > 0 && std::isfinite(norm) && norm > bound;
  if (clip) {
    clip_scratch_.resize(spans.size());
    for (size_t i = 0; i < spans.size(); ++i) {
      clip_scratch_[i].spec = layout_[i];
      clip_scratch_[i].data.assign(spans[i].begin(), spans[i].end());
    }
    privacy::ClipToNorm(&clip_scratch_, bound);
    for (size_t i = 0; i < spans.size(); ++i) spans[i] = clip_scratch_[i].data;
  }
  HUDDLE_RETURN_IF_ERROR(aggregator_->Fold(spans, weight, discount));
  norm_bound_.Accepted(number, norm);
  return clip;
}

Status SchedulerBase::FoldPrivate(PrivateRound& round,
                                  std::span<const std::span<const float>> spans, bool within_clip,
                                  double discount) {
  HUDDLE_RETURN_IF_ERROR(privacy_->CheckUpdate(round, spans));
  HUDDLE_RETURN_IF_ERROR(aggregator_->Fold(spans, 1, discount));
  if (within_clip) round.within_clip++;
  return absl::OkStatus();
}

SyncRound::SyncRound(Parts parts) : SchedulerBase(std::move(parts)) {}

void SyncRound::Begin(Round* round, uint64_t model_version) {
  round_ = round;
  model_version_ = model_version;
}

int64_t SyncRound::WeightCap() const {
  const int64_t max_weight = options_->aggregation.max_weight;
  if (dp()) return max_weight;
  // The median of the counts the cohort claimed when joining.
  std::vector<uint64_t> claims;
  for (const auto& [id, state] : round_->members) {
    const Population::Client* c = population_->Find(id);
    claims.push_back(c != nullptr ? c->num_examples : 0);
  }
  return MedianWeightCap(std::move(claims), options_->max_weight_ratio, max_weight);
}

void SyncRound::SendFit(const std::string& id) {
  Round& round = *round_;
  round.fits_sent[id]++;
  wire::FitInstruction fit;
  fit.model_version = model_version_;
  fit.train = options_->train;
  fit.seed = round.client_seed;
  fit.deadline_ms =
      static_cast<uint32_t>(std::max<int64_t>(0, round.deadline_ms - clock_->NowMs()));
  // A fresh nonce per instruction: the answering request and result must carry it, so a result
  // replayed from an earlier instruction (another round, or before a rejoin) is refused.
  fit.nonce = SecureRandomBytes(wire::kNonceBytes);
  round.nonces[id] = fit.nonce;
  if (round.secure) fit.secure_aggregation = round.secure->Instruction(id);
  if (dp()) fit.privacy = privacy_->Instruction(round.privacy);
  wire::Message msg = wire::MakeMessage(fit, round.number, "coordinator");
  msg.tensors = wire::ShareAll(round.global);
  const Population::Client* c = population_->Find(id);
  Status st =
      c != nullptr ? transport_->Send(c->peer, msg) : absl::NotFoundError("it left the federation");
  if (!st.ok()) {
    spdlog::warn("round {}: cannot send the model to client {}: {}", round.number, id,
                 st.message());
    round.members[id] = MemberState::kFailed;
    round.outcomes[id] = {"dropped", absl::StrCat("unreachable: ", st.message())};
  }
}

bool SyncRound::Step(int64_t* wait_ms) {
  Round& round = *round_;
  if (std::none_of(round.members.begin(), round.members.end(),
                   [](const auto& m) { return IsOpen(m.second); })) {
    return false;
  }
  const int64_t now = clock_->NowMs();
  if (now >= round.deadline_ms) {
    for (auto& [id, state] : round.members) {
      if (IsOpen(state)) {
        spdlog::warn("round {}: client {} missed the deadline", round.number, id);
        state = MemberState::kFailed;
        round.outcomes[id] = {"dropped", "missed the deadline"};
      }
    }
    return false;
  }
  *wait_ms = round.deadline_ms - now;
  return true;
}

void SyncRound::OnUploadRequest(const std::string& id, const wire::Message& msg) {
  const transport::PeerId peer = population_->PeerOf(id);
  if (!round_ || msg.round != round_->number) {
    host_->CountStale();
    host_->Refuse(peer, wire::ErrorCode::kWrongRound,
                  absl::StrCat("round ", msg.round, " is closed",
                               round_ ? absl::StrCat("; round ", round_->number, " is open") : ""),
                  msg.round);
    return;
  }
  auto m = round_->members.find(id);
  // With secure aggregation the upload is the masked input, due in stage 2.
  const MemberState due = round_->secure ? MemberState::kSecAggMasking : MemberState::kTraining;
  if (m == round_->members.end() || m->second != due) {
    host_->Refuse(peer, wire::ErrorCode::kRejected,
                  absl::StrCat("client ", id, " has no pending work in round ", msg.round),
                  msg.round);
    return;
  }
  if (std::get<wire::UploadRequest>(msg.body).nonce != round_->nonces[id]) {
    round_->metrics.rejected++;
    host_->Warn("upload requests with a stale nonce", id, [&] {
      return absl::StrCat("client ", id, ": upload request with a stale nonce in round ",
                          msg.round);
    });
    host_->Refuse(peer, wire::ErrorCode::kRejected,
                  absl::StrCat("upload request does not answer the instruction client ", id,
                               " was last sent in round ", msg.round, " (nonce mismatch)"),
                  msg.round);
    return;
  }
  m->second = MemberState::kWaitingSlot;
  slots_->Enqueue(id);
  GrantSlots();
}

void SyncRound::OnClientError(const std::string& id, const wire::Message& msg) {
  // A client declines the round it was sent (its own privacy policy refuses it, kRejected) or
  // reports that its local training failed (any other code): it fails for the round at once
  // instead of at the deadline. One message per instruction at most, so one log line each, its
  // text cut short.
  const auto& err = std::get<wire::Error>(msg.body);
  if (!round_ || msg.round != round_->number) {
    host_->CountStale();
    return;
  }
  auto m = round_->members.find(id);
  const bool busy = m != round_->members.end() &&
                    (m->second == MemberState::kTraining || (round_->secure && IsOpen(m->second)));
  if (!busy) {
    round_->metrics.rejected++;
    return;
  }
  const bool declined = err.code == wire::ErrorCode::kRejected;
  (declined ? round_->metrics.declined : round_->metrics.failed)++;
  constexpr size_t kMaxText = 300;
  const std::string text =
      err.message.size() > kMaxText ? err.message.substr(0, kMaxText) + "..." : err.message;
  spdlog::warn("round {}: client {} {} ({}): {}", round_->number, id,
               declined ? "declined" : "could not train", wire::ErrorCodeName(err.code), text);
  FailMember(id, declined ? "declined the round" : "reported that its training failed");
  round_->outcomes[id] = {declined ? "declined" : "failed", text};
}

void SyncRound::GrantSlots() {
  Round& round = *round_;
  while (std::optional<std::string> next = slots_->NextWaiting()) {
    const std::string id = *next;
    auto m = round.members.find(id);
    if (m == round.members.end() || m->second != MemberState::kWaitingSlot) continue;
    const transport::PeerId peer = population_->PeerOf(id);
    Status st =
        transport_->Send(peer, wire::MakeMessage(wire::UploadGrant{}, round.number, "coordinator"));
    if (!st.ok()) {
      FailMember(id, "unreachable for its upload grant");
      continue;
    }
    m->second = MemberState::kUploading;
    // Its upload starts now (the grant): a masked input's duration is timed by the session, a
    // result's by the slot (OnFitResult).
    if (round.secure) round.secure->OnUploadGranted(id, &round.metrics.upload_seconds);
    // The transport holds undelivered bytes of this connection up to the result's size, and no
    // more (transport.h): a result (or a masked input) is the only large message a client sends.
    const size_t bytes = round.secure ? round.secure->UploadBytes()
                                      : static_cast<size_t>(TotalElements(layout_)) * sizeof(float);
    slots_->Hold(id, peer, bytes + kResultOverheadBytes);
  }
}

void SyncRound::RevokeStaleGrants() {
  // A client that holds a grant without uploading would starve the others of upload slots.
  for (const std::string& id : slots_->Stale()) {
    FailMember(id, "did not upload within round.upload_timeout_s of its grant");
  }
}

void SyncRound::OnFitResult(const std::string& id, const wire::Message& msg) {
  const transport::PeerId peer = population_->PeerOf(id);
  if (!round_ || msg.round != round_->number) {
    host_->CountStale();
    host_->Warn("results after their round closed", id, [&] {
      return absl::StrCat("client ", id, ": result for round ", msg.round,
                          " arrived after it closed");
    });
    host_->Refuse(peer, wire::ErrorCode::kWrongRound,
                  absl::StrCat("round ", msg.round, " is closed"), msg.round);
    return;
  }
  Round& round = *round_;
  auto m = round.members.find(id);
  if (m == round.members.end() || m->second != MemberState::kUploading || round.secure) {
    // (With secure aggregation a plain result is never due: the upload is the masked input.)
    round.metrics.rejected++;
    host_->Warn("unsolicited results", id, [&] {
      return absl::StrCat("client ", id, ": unsolicited result in round ", round.number);
    });
    host_->Refuse(peer, wire::ErrorCode::kRejected,
                  absl::StrCat("client ", id, " holds no upload grant in round ", round.number),
                  msg.round);
    return;
  }
  // The upload ran from its grant to now: the transport hands over a message once its last frame
  // (chunk) arrived, so this is when the whole update was received. (A member always uploads
  // under a grant: kUploading is only ever reached through GrantSlots.)
  const std::optional<int64_t> granted_ms = slots_->HeldSinceMs(id);
  slots_->Release(id);
  const auto& result = std::get<wire::FitResult>(msg.body);
  int64_t weight = 0;
  Status st = FoldResult(id, msg, result, &weight);
  if (st.ok()) {
    m->second = MemberState::kDone;
    if (granted_ms) {
      round.metrics.upload_seconds.push_back(
          static_cast<double>(std::max<int64_t>(0, clock_->NowMs() - *granted_ms)) / 1000.0);
    }
    round.metrics.results++;
    round.metrics.examples += weight;
    round.weighted_loss += result.train_loss * static_cast<double>(weight);
  } else {
    m->second = MemberState::kFailed;
    round.metrics.rejected++;
    round.outcomes[id] = {"refused", std::string(st.message())};
    if (round.first_rejection.empty()) round.first_rejection = std::string(st.message());
    spdlog::warn("client {}: round {}: update rejected: {}", id, round.number, st.message());
    host_->Refuse(peer, wire::ErrorCode::kInvalidUpdate, std::string(st.message()), round.number);
  }
  GrantSlots();
}

Status SyncRound::FoldResult(const std::string& id, const wire::Message& msg,
                             const wire::FitResult& result, int64_t* weight) {
  UpdateExpectation want;
  want.round = round_->number;
  want.model_version = model_version_;
  want.nonce = round_->nonces[id];
  want.max_weight = options_->aggregation.max_weight;
  want.layout = &layout_;
  HUDDLE_ASSIGN_OR_RETURN(auto spans, CheckUpdate(msg, want));
  if (dp()) {
    *weight = 1;
    return FoldPrivate(round_->privacy, spans, result.within_clip, 1.0);
  }
  // FedAvg weighs by the claimed example count, capped relative to the cohort's claims.
  *weight = std::min(static_cast<int64_t>(result.num_examples), round_->weight_cap);
  HUDDLE_ASSIGN_OR_RETURN(const bool clipped,
                          FoldBounded(std::move(spans), round_->number, *weight, 1.0));
  if (clipped) round_->metrics.clipped++;
  if (*weight < static_cast<int64_t>(result.num_examples)) round_->metrics.weight_capped++;
  return absl::OkStatus();
}

void SyncRound::FailMember(const std::string& id, const char* why) {
  if (round_ == nullptr) return;
  Round& round = *round_;
  auto m = round.members.find(id);
  if (m == round.members.end()) return;
  if (m->second == MemberState::kDone || m->second == MemberState::kFailed) return;
  slots_->Release(id);
  m->second = MemberState::kFailed;
  round.outcomes.try_emplace(id, "dropped", why);
  if (round.secure) round.secure->OnMemberFailed(id);  // a stage no longer waits for it
  spdlog::warn("round {}: client {} {}", round.number, id, why);
  GrantSlots();
}

int64_t MedianWeightCap(std::vector<uint64_t> claims, double ratio, int64_t max_weight) {
  if (ratio <= 0 || claims.empty()) return max_weight;
  std::nth_element(claims.begin(), claims.begin() + claims.size() / 2, claims.end());
  const double cap = ratio * static_cast<double>(claims[claims.size() / 2]);
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(cap, 9e15)), 1, max_weight);
}

std::string ParticipationJson(const Round& round, const std::string& time) {
  nlohmann::json sampled = nlohmann::json::array();
  nlohmann::json contributed = nlohmann::json::array();
  nlohmann::json left = nlohmann::json::object();
  for (const auto& [id, state] : round.members) {
    sampled.push_back(id);
    if (state == MemberState::kDone) {
      contributed.push_back(id);
      continue;
    }
    auto it = round.outcomes.find(id);
    left[id] = {{"outcome", it != round.outcomes.end() ? it->second.first : "dropped"},
                {"why", it != round.outcomes.end() ? it->second.second : ""}};
  }
  return nlohmann::json{{"round", round.number},
                        {"time", time},
                        {"sampled", sampled},
                        {"contributed", contributed},
                        {"left", left}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void SyncRound::ExpireSilentClients() {
  if (!round_ || options_->client_timeout_ms <= 0) return;
  for (const auto& [id, state] : round_->members) {
    if (state == MemberState::kDone || state == MemberState::kFailed) continue;
    if (!population_->Alive(id)) FailMember(id, "went silent (client_timeout)");
  }
}

}  // namespace huddle::coordinator
