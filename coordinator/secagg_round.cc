// Secure aggregation of a round (aggregation/secagg/protocol.h; docs/protocol.md). The coordinator
// drives the protocol's server side through the round's members:
//
//   0. StartSecAgg: the cohort (sorted ids: index = position) gets a session, a graph, a word width
//      and a scale (aggregation/secagg/quantize.h), sent in each FitInstruction. Members train,
//      then advertise their keys (SecAggAdvertise). The stage ends when no member is still
//      training, or at the round's deadline.
//   1. Each advertiser gets its neighbours' keys (SecAggKeyList) and answers with sealed shares
//      (SecAggShares), until all answered or stage_timeout.
//   2. Each member that shared gets the shares sealed to it (SecAggShareList), masks its input and
//      asks for an upload slot; its masked words (SecAggMaskedInput, one uint32/uint64 tensor per
//      model tensor, then the weight word) are added to the sum as they arrive, O(model) memory.
//   3. Each member whose input arrived is told which of its neighbours' did (SecAggUnmask) and
//      answers with shares (SecAggUnmaskResponse); then the server rebuilds the secrets, removes
//      the masks and the sum is decoded.
//
// A member that fails at any point (silence, an error, a refused message) is a dropout; the round
// completes while the protocol's threshold and minimum hold, and otherwise releases nothing. Every
// refusal names the client and what is wrong, and is counted in the round's metrics.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "aggregation/secagg/wire.h"
#include "coordinator/coordinator.h"

namespace huddle::coordinator {

namespace secagg = aggregation::secagg;

namespace {

constexpr const char* kWeightName = "secagg.weight";  // client/secagg_member.h

}  // namespace

StatusOr<bool> Coordinator::StartSecAgg(Round& round, const std::vector<std::string>& cohort) {
  const SecureAggregationOptions& o = options_.secure_aggregation;
  const uint32_t n = static_cast<uint32_t>(cohort.size());
  const int64_t quorum = dp() ? 1 : options_.quorum;
  if (n < 2) {
    spdlog::warn(
        "round {}: a cohort of {} cannot aggregate securely (at least 2 members hide "
        "each other); the round trains nothing",
        round.number, n);
    return false;
  }
  secagg::ServerOptions so;
  so.members = n;
  so.graph = o.graph;
  if (o.neighbours > 0 && o.threshold > 0)
    so.parameters = secagg::GraphParameters{o.neighbours, o.threshold};
  const int64_t by_fraction =
      static_cast<int64_t>(std::ceil(o.min_survivor_fraction * static_cast<double>(n) - 1e-9));
  so.min_survivors =
      static_cast<uint32_t>(std::clamp<int64_t>(std::max(quorum, by_fraction), 1, n));
  SecAggRound s;
  s.clip_norm = dp() ? round.clip_norm : options_.max_update_norm;
  const int64_t dim = TotalElements(layout_);
  secagg::QuantizeRequest q;
  q.clip_norm = s.clip_norm;
  q.members = n;
  q.dim = dim;
  q.min_survivors = 1;
  q.bits = o.bits;
  const bool distributed = dp() && privacy_->options().mode == privacy::PrivacyMode::kDistributed;
  if (distributed) {
    // Distributed DP: the noise shares of the fewest honest members an unmasked sum can hold
    // (the minimum survivors, less the members that may collude with the coordinator: they know
    // their own shares) must carry the whole noise.
    const auto colluders = static_cast<uint32_t>(secagg::Colluders(o.graph.corrupt_fraction, n));
    if (so.min_survivors <= colluders) {
      spdlog::warn(
          "round {}: distributed DP needs more than the {} members that may collude "
          "(secure_aggregation.corrupt_fraction {}) among the {} whose inputs are unmasked at "
          "least (min_survivors); the round trains nothing",
          round.number, colluders, o.graph.corrupt_fraction, so.min_survivors);
      return false;
    }
    s.noise_members = so.min_survivors - colluders;
    q.noise_multiplier = round.noise_multiplier;
    q.min_survivors = s.noise_members;
  } else if (dp()) {
    // Local DP: each client's values carry its own noise (std z C) on top of the clipped update.
    q.value_noise_stddev = round.noise_multiplier * round.clip_norm;
  }
  HUDDLE_ASSIGN_OR_RETURN(s.plan, secagg::PlanQuantization(q));
  if (distributed) {
    // The round's release as accounted: the sum's multiplier with the variance as rounded up
    // (sqrt(m s) / Delta >= z) and Kairouz et al.'s tau for m shares.
    const privacy::DpEvent sum = privacy::DistributedDiscreteGaussianEvent(
        s.plan.noise_variance, s.noise_members, s.plan.sensitivity, dim);
    privacy::LedgerEntry e;
    e.round = round.number;
    e.mechanism = privacy::kMechanismDistributed;
    e.sampling_rate = 1;
    e.noise_multiplier = sum.noise_multiplier;
    e.tau = sum.tau;
    e.dimension = dim;
    e.clip_norm = round.clip_norm;
    e.mode = privacy::PrivacyModeName(privacy::PrivacyMode::kDistributed);
    e.noise = "client-side (secure aggregation shares)";
    e.unit = privacy::kUnitClient;
    e.adjacency = privacy_->adjacency();
    e.job = options_.job_name;
    // The plan fitted the round with tau = 0; a coarse grid's tau could take it past the total.
    HUDDLE_ASSIGN_OR_RETURN(auto would, privacy_->WouldSpendEvent(ledger_->Events(), e.event()));
    if (would.second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", round.number, ": distributed DP: the members' noise shares (variance ",
          s.plan.noise_variance, " on a grid of 2^", s.plan.scale_exponent,
          ") would take epsilon to ", would.first.epsilon, ", past privacy.epsilon (tau ", e.tau,
          " for ", s.noise_members,
          " shares); use 64-bit words (secure_aggregation.bits) or more "
          "noise"));
    }
    s.distributed = std::move(e);
  }
  // FedAvg weights travel as one more word (without DP); their sum must fit too.
  if (!dp()) {
    const uint64_t room = ((uint64_t{1} << (s.plan.bits - 1)) - 1) / n;
    s.weight_cap = std::clamp<uint64_t>(static_cast<uint64_t>(round.weight_cap), 1, room);
  }
  so.bits = s.plan.bits;
  so.length = static_cast<uint64_t>(dim) + (s.weight_cap > 0 ? 1 : 0);
  StatusOr<secagg::Server> server = secagg::Server::Create(so);
  if (!server.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure_aggregation: round ", round.number, ": ", server.status().message()));
  }
  s.server.emplace(*std::move(server));
  s.ids = cohort;
  for (uint32_t i = 0; i < n; ++i) s.index[cohort[i]] = i;
  const secagg::GraphParameters& p = s.server->parameters();
  if (!so.parameters && p.reliability_bits < o.graph.reliability_bits) {
    spdlog::warn(
        "round {}: with {} members and dropout_fraction {}, even the complete graph may leave a "
        "member short of {} surviving neighbours (a failed round, nothing revealed) with "
        "probability up to 2^-{:.1f}, above secure_aggregation.reliability_bits' 2^-{}",
        round.number, n, o.graph.dropout_fraction, p.threshold, p.reliability_bits,
        o.graph.reliability_bits);
  }
  spdlog::info(
      "round {}: secure aggregation of {} members: {} neighbours each, {} shares rebuild a secret, "
      "at least {} masked inputs unmasked; {}-bit words at 2^{}{}",
      round.number, n, p.neighbours, p.threshold, s.server->config().min_survivors, s.plan.bits,
      s.plan.scale_exponent,
      s.distributed
          ? fmt::format("; each adds discrete Gaussian noise of variance {} (the sum "
                        "of {} honest members': multiplier {:.6g})",
                        s.plan.noise_variance, s.noise_members, s.distributed->noise_multiplier)
          : std::string());
  round.secagg.emplace(std::move(s));
  return true;
}

wire::SecureAggregation Coordinator::SecAggInstruction(const std::string& id) const {
  const SecAggRound& s = *round_->secagg;
  wire::SecureAggregation a = secagg::SessionToWire(s.server->config(), s.index.at(id));
  a.scale_exponent = s.plan.scale_exponent;
  a.noise_variance = s.plan.noise_variance;
  a.weight_cap = s.weight_cap;
  a.clip_norm = s.clip_norm;
  return a;
}

int64_t Coordinator::SecAggTimeoutMs(const Round& round) const {
  const SecAggRound& s = *round.secagg;
  const int64_t deadline = s.stage == 0 ? round.deadline_ms : s.stage_deadline_ms;
  return std::max<int64_t>(0, deadline - clock_->NowMs());
}

bool Coordinator::SecAggStep(Round& round) {
  SecAggRound& s = *round.secagg;
  if (s.stage >= 4) return false;
  const int64_t now = clock_->NowMs();
  auto in_state = [&](std::initializer_list<MemberState> states) {
    std::vector<std::string> out;
    for (const auto& [id, state] : round.members) {
      if (std::find(states.begin(), states.end(), state) != states.end()) out.push_back(id);
    }
    return out;
  };
  auto refuse_round = [&](const Status& why) {
    s.failure = std::string(why.message());
    spdlog::warn("round {}: {}", round.number, why.message());
    s.stage = 4;
    for (auto& [id, state] : round.members) {
      if (state != MemberState::kDone && state != MemberState::kFailed)
        FailMember(id, "left: the secure aggregation was refused");
    }
    return false;
  };
  auto next_stage = [&] {
    ++s.stage;
    s.stage_deadline_ms = now + options_.secure_aggregation.stage_timeout_ms;
  };
  auto send = [&](uint32_t index, wire::Body body) {
    const std::string& id = s.ids[index];
    Status st = transport_->Send(clients_.at(id).peer,
                                 wire::MakeMessage(std::move(body), round.number, "coordinator"));
    if (!st.ok()) {
      FailMember(id, "unreachable during secure aggregation");
      return false;
    }
    return true;
  };
  switch (s.stage) {
    case 0: {
      if (!in_state({MemberState::kTraining}).empty() && now < round.deadline_ms) return true;
      for (const std::string& id : in_state({MemberState::kTraining})) {
        FailMember(id, "missed the deadline");
      }
      StatusOr<std::map<uint32_t, secagg::KeyList>> lists = s.server->EndAdvertise();
      if (!lists.ok()) return refuse_round(lists.status());
      for (const std::string& id : in_state({MemberState::kSecAgg})) {
        if (lists->count(s.index[id]) == 0) {
          FailMember(id, "left secure aggregation: too few of its neighbours advertised keys");
        }
      }
      next_stage();
      for (auto& [index, list] : *lists) {
        if (send(index, secagg::ToWire(list))) s.awaiting.insert(s.ids[index]);
      }
      return true;
    }
    case 1: {
      if (!s.awaiting.empty() && now < s.stage_deadline_ms) return true;
      for (const std::string& id : s.awaiting) FailMember(id, "did not share its keys in time");
      s.awaiting.clear();
      StatusOr<std::map<uint32_t, secagg::ShareList>> lists = s.server->EndShareKeys();
      if (!lists.ok()) return refuse_round(lists.status());
      next_stage();
      for (auto& [index, list] : *lists) {
        const std::string& id = s.ids[index];
        if (round.members[id] != MemberState::kSecAgg) continue;
        if (send(index, secagg::ToWire(list))) round.members[id] = MemberState::kSecAggMasking;
      }
      for (const std::string& id : in_state({MemberState::kSecAgg})) {
        FailMember(id, "left secure aggregation: it did not share its keys");
      }
      return true;
    }
    case 2: {
      const bool pending = !in_state({MemberState::kSecAggMasking, MemberState::kWaitingSlot,
                                      MemberState::kUploading})
                                .empty();
      if (pending && now < s.stage_deadline_ms) return true;
      for (const std::string& id : in_state(
               {MemberState::kSecAggMasking, MemberState::kWaitingSlot, MemberState::kUploading})) {
        FailMember(id, "did not send its masked input in time");
      }
      StatusOr<std::map<uint32_t, secagg::UnmaskRequest>> requests = s.server->EndMaskedInput();
      if (!requests.ok()) return refuse_round(requests.status());
      if (s.distributed) {
        // Distributed DP: the release is accounted before the first unmasking share is asked
        // for. From then on the coordinator can rebuild the noised sum; should it crash and run
        // the round again, both runs are in the ledger (an over-count, never an under-count).
        Status st = ledger_->Append(*s.distributed);
        if (!st.ok()) {
          return refuse_round(absl::InternalError(absl::StrCat(
              "distributed DP: the release could not be recorded in the privacy ledger, so "
              "nothing is unmasked: ",
              st.message())));
        }
        s.accounted = true;
      }
      next_stage();
      for (auto& [index, request] : *requests) {
        if (send(index, secagg::ToWire(request))) s.awaiting.insert(s.ids[index]);
      }
      return true;
    }
    case 3: {
      if (!s.awaiting.empty() && now < s.stage_deadline_ms) return true;
      for (const std::string& id : s.awaiting) FailMember(id, "did not help unmask in time");
      s.awaiting.clear();
      StatusOr<std::vector<uint64_t>> words = s.server->Finish();
      if (!words.ok()) return refuse_round(words.status());
      // The sum, decoded: the survivors' (weighted) updates, exactly as they rounded them.
      TensorList sum;
      sum.reserve(layout_.size());
      size_t at = 0;
      for (const TensorSpec& spec : layout_) {
        Tensor& t = sum.emplace_back();
        t.spec = spec;
        t.data.resize(static_cast<size_t>(spec.NumElements()));
        secagg::Decode(std::span<const uint64_t>(*words).subspan(at, t.data.size()), s.plan.bits,
                       s.plan.scale_exponent, t.data);
        at += t.data.size();
      }
      if (s.weight_cap > 0) s.total_weight = (*words)[at];
      s.sum = std::move(sum);
      round.metrics.results = static_cast<int64_t>(s.server->survivors().size());
      round.metrics.examples =
          s.weight_cap > 0 ? static_cast<int64_t>(s.total_weight) : round.metrics.results;
      for (auto& [id, state] : round.members) {
        if (state == MemberState::kSecAgg) state = MemberState::kDone;
      }
      s.stage = 4;
      return false;
    }
    default:
      return false;
  }
}

void Coordinator::OnSecAgg(const std::string& id, const wire::Message& msg) {
  const transport::PeerId& peer = clients_[id].peer;
  if (!round_ || msg.round != round_->number || !round_->secagg) {
    (round_ ? round_->metrics.stale : pending_stale_)++;
    Refuse(peer, wire::ErrorCode::kWrongRound,
           absl::StrCat("round ", msg.round, " is closed or does not aggregate securely"),
           msg.round);
    return;
  }
  Round& round = *round_;
  SecAggRound& s = *round.secagg;
  auto m = round.members.find(id);
  const uint32_t index = s.index.count(id) != 0 ? s.index.at(id) : 0;
  auto refuse = [&](const std::string& why) {
    round.metrics.rejected++;
    if (round.first_rejection.empty()) round.first_rejection = why;
    Warn("refused secure-aggregation messages", id,
         [&] { return absl::StrCat("client ", id, ": round ", round.number, ": ", why); });
    Refuse(peer, wire::ErrorCode::kInvalidUpdate, why, round.number);
    if (m != round.members.end()) FailMember(id, "sent a refused secure-aggregation message");
  };
  if (m == round.members.end() || m->second == MemberState::kDone ||
      m->second == MemberState::kFailed) {
    round.metrics.rejected++;
    Refuse(peer, wire::ErrorCode::kRejected,
           absl::StrCat("client ", id, " has no part in round ", round.number, "'s aggregation"),
           msg.round);
    return;
  }
  const std::string& nonce = round.nonces[id];
  Status st;
  switch (msg.type()) {
    case wire::MessageType::kSecAggAdvertise: {
      const auto& b = std::get<wire::SecAggAdvertise>(msg.body);
      if (s.stage != 0 || m->second != MemberState::kTraining || b.nonce != nonce) {
        return refuse("a key advertisement out of turn or with a stale nonce");
      }
      st = s.server->OnAdvertise(index, secagg::FromWire(b));
      if (st.ok()) m->second = MemberState::kSecAgg;
      break;
    }
    case wire::MessageType::kSecAggShares: {
      const auto& b = std::get<wire::SecAggShares>(msg.body);
      if (s.stage != 1 || s.awaiting.count(id) == 0 || b.nonce != nonce) {
        return refuse("key shares out of turn or with a stale nonce");
      }
      st = s.server->OnShareKeys(index, secagg::FromWire(b));
      if (st.ok()) s.awaiting.erase(id);
      break;
    }
    case wire::MessageType::kSecAggMaskedInput: {
      const auto& b = std::get<wire::SecAggMaskedInput>(msg.body);
      if (s.stage != 2 || m->second != MemberState::kUploading || b.nonce != nonce ||
          b.model_version != model_version_) {
        return refuse("a masked input without an upload grant, or with a stale nonce or version");
      }
      // Its tensors: the model's, by name and shape, then the weight word; all of the session's
      // width. Gathered into one buffer (the words of a tensor may be only 4-byte aligned).
      const size_t expected = layout_.size() + (s.weight_cap > 0 ? 1 : 0);
      const DType dtype = s.plan.bits == 32 ? DType::kUint32 : DType::kUint64;
      if (msg.tensors.size() != expected) {
        st = absl::InvalidArgumentError(absl::StrCat("a masked input of ", msg.tensors.size(),
                                                     " tensors; the round's has ", expected));
      }
      secagg_scratch_.clear();
      for (size_t i = 0; st.ok() && i < msg.tensors.size(); ++i) {
        const wire::TensorPayload& t = msg.tensors[i];
        const TensorSpec want = i < layout_.size()
                                    ? TensorSpec{layout_[i].name, dtype, layout_[i].shape}
                                    : TensorSpec{kWeightName, dtype, {1}};
        if (t.spec != want) {
          st = absl::InvalidArgumentError(absl::StrCat(
              "masked tensor ", i, " is '", t.spec.name, "' ", ShapeString(t.spec.shape), " ",
              DTypeName(t.spec.dtype), "; the round's is '", want.name, "' ",
              ShapeString(want.shape), " ", DTypeName(dtype)));
          break;
        }
        const size_t words = static_cast<size_t>(t.spec.NumElements());
        const size_t at = secagg_scratch_.size();
        secagg_scratch_.resize(at + words);
        if (dtype == DType::kUint64) {
          std::memcpy(secagg_scratch_.data() + at, t.bytes.data(), words * 8);
        } else {
          const auto* w = reinterpret_cast<const uint32_t*>(t.bytes.data());  // 4-byte aligned
          std::copy(w, w + words, secagg_scratch_.begin() + static_cast<std::ptrdiff_t>(at));
        }
      }
      if (st.ok()) st = s.server->OnMaskedInput(index, std::span<const uint64_t>(secagg_scratch_));
      if (st.ok()) {
        // Its upload is done: the slot goes to the next member. (A refused input fails the member
        // below, which frees the slot the same way.)
        round.uploads_in_flight--;
        transport_->SetUploadAllowance(peer, 0);
        m->second = MemberState::kSecAgg;
        GrantSlots();
      }
      break;
    }
    case wire::MessageType::kSecAggUnmaskResponse: {
      const auto& b = std::get<wire::SecAggUnmaskResponse>(msg.body);
      if (s.stage != 3 || s.awaiting.count(id) == 0 || b.nonce != nonce) {
        return refuse("unmasking shares out of turn or with a stale nonce");
      }
      st = s.server->OnUnmask(index, secagg::FromWire(b, index));
      if (st.ok()) s.awaiting.erase(id);
      break;
    }
    default:
      return;
  }
  if (!st.ok()) refuse(std::string(st.message()));
}

Status Coordinator::SecAggMean(Round& round, TensorList* mean) const {
  const SecAggRound& s = *round.secagg;
  // Weighted: each survivor sent (w_i / cap) x_i and w_i, so the FedAvg mean is
  // cap * sum / sum(w). Uniform: the sum over the survivors.
  const double divisor =
      s.weight_cap > 0 ? static_cast<double>(s.total_weight) / static_cast<double>(s.weight_cap)
                       : static_cast<double>(round.metrics.results);
  if (!(divisor > 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round.number, ": the secure sum has no weight"));
  }
  *mean = *s.sum;
  for (Tensor& t : *mean) {
    for (float& v : t.data) v = static_cast<float>(static_cast<double>(v) / divisor);
  }
  return absl::OkStatus();
}

}  // namespace huddle::coordinator
