// Secure aggregation of a round (aggregation/secagg/protocol.h; docs/protocol.md). The coordinator
// drives the protocol's server side through the round's members:
//
//   0. StartSecAgg: the cohort (sorted ids: cohort index = position) gets a session planned for it
//      (threshold, graph, minimum survivors, word width, scale and, for distributed DP, each
//      member's noise share: aggregation/secagg/quantize.h), sent in each FitInstruction. Members
//      train, then advertise their keys. The stage ends when no member is still training, or at
//      the round's deadline.
//   1. Every advertiser gets the member list, each member with its certificate (the one the
//      project key gave it, from SecureAggregationOptions::certificates), and reveals its
//      randomness, signed.
//   2. Every member gets every reveal (one list, encoded once) and sends its sealed shares.
//   3. Each gets the records its neighbours sealed to it and answers with its complaints.
//   4. The members whose secrets enough others hold (U2) get U2, mask their input and ask for an
//      upload slot; their masked words (SecAggMaskedInput, one uint32/uint64 tensor per model
//      tensor, then the weight word) are added to the sum as they arrive, O(model) memory.
//   5. Each survivor gets U2 and S and signs them (the consistency round).
//   6. Under distributed DP the release is accounted now, before any unmasking share is asked
//      for; each survivor gets the signatures and answers with its shares; the server rebuilds
//      the secrets, removes the masks, and the sum is decoded.
//
// Stages 1-6 each end when every member due answered or stage_timeout passed. A member that fails
// at any point (silence, an error, a refused message: one the session refuses, a malformed one, or
// one of a type no client may send) is a dropout, no longer awaited: its stage ends as soon as the
// others due have answered. One found lying is named in the round's metrics; the round completes
// while the protocol's minimum and threshold hold, and otherwise releases nothing. Every refusal
// names the client and what is wrong.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "coordinator/coordinator.h"
#include "privacy/distributed.h"

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
  // The minimum, once, before anything is sized from it: the configured quorum and fraction,
  // and the consistency quorum (more than half the cohort, the colluders aside), without which
  // members reveal nothing.
  const int64_t colluders = secagg::Colluders(o.graph.corrupt_fraction, n);
  const int64_t consistency = secagg::ConsistencyQuorum(n, colluders);
  const int64_t by_fraction =
      static_cast<int64_t>(std::ceil(o.min_survivor_fraction * static_cast<double>(n) - 1e-9));
  int64_t min_survivors = std::clamp<int64_t>(std::max({quorum, by_fraction, consistency}), 1, n);
  secagg::GraphParameters params;
  if (o.neighbours > 0 && o.threshold > 0) {
    params.neighbours = o.neighbours;
    params.threshold = o.threshold;
    params.edge_threshold = secagg::EdgeThreshold(n, o.neighbours);
  } else {
    StatusOr<secagg::GraphParameters> chosen = secagg::ChooseParameters(n, min_survivors, o.graph);
    if (!chosen.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("secure_aggregation: round ", round.number,
                                                     ": ", chosen.status().message()));
    }
    params = *chosen;
  }
  min_survivors = std::max<int64_t>(min_survivors, params.threshold);
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
    // Distributed DP: the noise shares of the fewest honest members any sum the coordinator can
    // unmask holds carry the whole noise: the minimum, less the members that may collude (they
    // know their own shares), less those an active coordinator could cut off by dropping members
    // (graph.h). The same count the members make by their own assumptions.
    StatusOr<int64_t> honest =
        secagg::HonestShares(n, params.edge_threshold, params.threshold, colluders, min_survivors,
                             o.graph.security_bits);
    if (!honest.ok()) {
      spdlog::warn("round {}: distributed DP: {}; the round trains nothing", round.number,
                   honest.status().message());
      return false;
    }
    s.noise_members = *honest;
    q.noise_multiplier = round.noise_multiplier;
    q.min_survivors = static_cast<uint32_t>(s.noise_members);
  } else if (dp()) {
    // Local DP: each client's values carry its own noise (std z C) on top of the clipped update.
    q.value_noise_stddev = round.noise_multiplier * round.clip_norm;
  }
  HUDDLE_ASSIGN_OR_RETURN(s.plan, secagg::PlanQuantization(q));
  if (distributed) {
    // The round's release as accounted: the sum's multiplier with the variance as rounded up
    // (sqrt(m s) / Delta >= z) and Kairouz et al.'s tau for m shares.
    privacy::LedgerEntry e = privacy::DistributedRelease(
        round.number, {s.plan.noise_variance, s.noise_members, s.plan.sensitivity, dim},
        round.clip_norm, privacy::kNoiseSecAggShares);
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
  // FedAvg weights (without DP, when asked for) travel as one more word; their sum must fit too.
  if (!dp() && o.weight_by_examples) {
    const uint64_t room = ((uint64_t{1} << (s.plan.bits - 1)) - 1) / n;
    s.weight_cap = std::clamp<uint64_t>(static_cast<uint64_t>(round.weight_cap), 1, room);
  }
  secagg::ServerOptions so;
  so.graph = o.graph;
  secagg::SessionConfig& c = so.config;
  c.members = n;
  c.threshold = static_cast<uint32_t>(params.threshold);
  c.edge_threshold = params.edge_threshold;
  c.min_survivors = static_cast<uint32_t>(min_survivors);
  c.bits = s.plan.bits;
  c.length = static_cast<uint64_t>(dim) + (s.weight_cap > 0 ? 1 : 0);
  c.scale_exponent = s.plan.scale_exponent;
  c.noise_variance = s.plan.noise_variance;
  c.weight_cap = s.weight_cap;
  c.clip_norm = s.clip_norm;
  StatusOr<secagg::Server> server = secagg::Server::Create(so);
  if (!server.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure_aggregation: round ", round.number, ": ", server.status().message()));
  }
  s.server.emplace(*std::move(server));
  s.ids = cohort;
  for (uint32_t i = 0; i < n; ++i) s.index[cohort[i]] = i;
  if (o.neighbours == 0 && params.reliability_bits < o.graph.reliability_bits) {
    spdlog::warn(
        "round {}: with {} members and dropout_fraction {}, even the complete graph may leave a "
        "member short of {} surviving neighbours (a failed round, nothing revealed) with "
        "probability up to 2^-{:.1f}, above secure_aggregation.reliability_bits' 2^-{}",
        round.number, n, o.graph.dropout_fraction, params.threshold, params.reliability_bits,
        o.graph.reliability_bits);
  }
  spdlog::info(
      "round {}: secure aggregation of {} members: {:.1f} neighbours each on average, {} shares "
      "rebuild a secret, at least {} masked inputs unmasked, {} signatures before unmasking; "
      "{}-bit words at 2^{}{}",
      round.number, n, secagg::EdgeProbability(params.edge_threshold) * (n - 1), params.threshold,
      min_survivors, consistency, s.plan.bits, s.plan.scale_exponent,
      s.distributed
          ? fmt::format("; each adds discrete Gaussian noise of variance {} (the sum "
                        "of {} honest members': multiplier {:.6g})",
                        s.plan.noise_variance, s.noise_members, s.distributed->noise_multiplier)
          : std::string());
  round.secagg.emplace(std::move(s));
  RecordSecAgg(round);
  return true;
}

wire::SecureAggregation Coordinator::SecAggInstruction(const std::string& id) const {
  const SecAggRound& s = *round_->secagg;
  return secagg::SessionToWire(s.server->config(), s.index.at(id));
}

int64_t Coordinator::SecAggTimeoutMs(const Round& round) const {
  const SecAggRound& s = *round.secagg;
  const int64_t deadline = s.stage == 0 ? round.deadline_ms : s.stage_deadline_ms;
  return std::max<int64_t>(0, deadline - clock_->NowMs());
}

void Coordinator::BroadcastSecAgg(Round& round, secagg::Stage stage,
                                  std::shared_ptr<const std::string> bytes,
                                  const std::vector<std::string>& ids) {
  SecAggRound& s = *round.secagg;
  for (const std::string& id : ids) {
    if (round.members[id] == MemberState::kFailed) continue;
    const Population::Client* client = population_.Find(id);
    if (client == nullptr) {  // a member whose key was revoked has left (and failed)
      FailMember(id, "left the federation during secure aggregation");
      continue;
    }
    Status st = transport_->Send(client->peer,
                                 secagg::ToMessage(stage, bytes, round.number, "coordinator"));
    if (!st.ok()) {
      FailMember(id, "unreachable during secure aggregation");
      continue;
    }
    s.awaiting.insert(id);
  }
}

bool Coordinator::RefuseSecAgg(Round& round, const Status& why) {
  SecAggRound& s = *round.secagg;
  s.failure = std::string(why.message());
  spdlog::warn("round {}: {}", round.number, why.message());
  s.stage = 7;
  s.awaiting.clear();
  for (auto& [id, state] : round.members) {
    if (state != MemberState::kDone && state != MemberState::kFailed)
      FailMember(id, "left: the secure aggregation was refused");
  }
  RecordSecAgg(round);
  return false;
}

bool Coordinator::RestartSecAgg(Round& round, const Status& why) {
  SecAggRound& s = *round.secagg;
  // Members' default cap is 4 sessions a round (client/agent.h): 3 restarts.
  constexpr int kMaxRestarts = 3;
  std::vector<std::string> cohort;
  for (const std::string& id : s.listed) {
    if (round.members[id] == MemberState::kSecAgg) cohort.push_back(id);
  }
  secagg::ServerOptions so;
  so.config = s.server->config();
  so.graph = options_.secure_aggregation.graph;
  so.config.members = static_cast<uint32_t>(cohort.size());
  if (s.restarts >= kMaxRestarts || cohort.size() < std::max<size_t>(2, so.config.min_survivors)) {
    return RefuseSecAgg(round, why);
  }
  StatusOr<secagg::Server> server = secagg::Server::Create(so);
  if (!server.ok()) return RefuseSecAgg(round, why);
  ++s.restarts;
  spdlog::warn(
      "round {}: {}; starting the session again with the {} members that revealed ({} of "
      "{} restarts)",
      round.number, why.message(), cohort.size(), s.restarts, kMaxRestarts);
  s.server.emplace(*std::move(server));
  s.ids = cohort;
  s.index.clear();
  for (uint32_t i = 0; i < cohort.size(); ++i) s.index[cohort[i]] = i;
  s.listed.clear();
  s.position.clear();
  s.awaiting.clear();
  s.stage = 0;
  round.deadline_ms =
      std::max(round.deadline_ms, clock_->NowMs() + options_.secure_aggregation.stage_timeout_ms);
  for (const std::string& id : cohort) {
    round.members[id] = MemberState::kTraining;
    SendFit(id);  // the new session; the member masks the update it trained
  }
  return true;
}

void Coordinator::RecordSecAgg(Round& round) {
  const SecAggRound& s = *round.secagg;
  const secagg::Server& server = *s.server;
  const secagg::SessionConfig& c = server.config();
  RoundMetrics::SecureAggregation a;
  a.members = c.members;
  a.threshold = static_cast<int>(c.threshold);
  a.neighbours = secagg::EdgeProbability(c.edge_threshold) * (c.members - 1);
  a.min_survivors = c.min_survivors;
  a.bits = c.bits;
  a.consistency_quorum = secagg::ConsistencyQuorum(
      c.members, secagg::Colluders(options_.secure_aggregation.graph.corrupt_fraction, c.members));
  a.honest_shares = s.noise_members;
  a.listed = static_cast<int64_t>(server.listed());
  a.shared = static_cast<int64_t>(server.shared().size());
  a.masked = static_cast<int64_t>(server.survivors().size());
  a.signed_survivors = static_cast<int64_t>(server.signers().size());
  a.answered = static_cast<int64_t>(server.responders().size());
  a.complaints = static_cast<int64_t>(server.disputes().size());
  for (const secagg::Blame& b : server.blames()) {
    const std::string id = b.member < s.listed.size() ? s.listed[b.member] : "?";
    a.blamed.emplace_back(id, b.reason);
  }
  a.released = s.sum.has_value();
  a.failure = s.failure;
  a.restarts = s.restarts;
  // A member found lying is named, and left out of the job's later cohorts (the evidence is its
  // own signature, or a share that is not the one it was dealt).
  for (const auto& [id, why] : a.blamed) {
    if (id != "?" && secagg_excluded_.insert(id).second) {
      spdlog::warn("round {}: secure aggregation: client {} {}; it is left out of later rounds",
                   round.number, id, why);
    }
  }
  round.metrics.secure_aggregation = std::move(a);
}

bool Coordinator::SecAggStep(Round& round) {
  SecAggRound& s = *round.secagg;
  if (s.stage >= 7) return false;
  const int64_t now = clock_->NowMs();
  auto in_state = [&](std::initializer_list<MemberState> states) {
    std::vector<std::string> out;
    for (const auto& [id, state] : round.members) {
      if (std::find(states.begin(), states.end(), state) != states.end()) out.push_back(id);
    }
    return out;
  };
  // Ends a stage that waits for one answer from each member due: false while some are due.
  auto stage_over = [&](const char* what) {
    if (!s.awaiting.empty() && now < s.stage_deadline_ms) return false;
    // FailMember erases from s.awaiting: iterate over a copy taken out of it.
    const auto late = std::exchange(s.awaiting, {});
    for (const std::string& id : late) FailMember(id, what);
    return true;
  };
  auto next_stage = [&] {
    ++s.stage;
    s.stage_deadline_ms = now + options_.secure_aggregation.stage_timeout_ms;
  };
  auto ids_of = [&](const auto& by_position) {
    std::vector<std::string> out;
    for (const auto& [p, unused] : by_position) out.push_back(s.listed[p]);
    return out;
  };
  auto send_each = [&](const auto& by_position) {
    for (const auto& [p, m] : by_position) {
      BroadcastSecAgg(round, secagg::StageOf<std::decay_t<decltype(m)>>(),
                      std::make_shared<const std::string>(secagg::Encode(m)), {s.listed[p]});
    }
  };
  // Members still in the session that the server left out at this stage.
  auto fail_absent = [&](const auto& by_position, const char* why) {
    for (const std::string& id : in_state({MemberState::kSecAgg, MemberState::kSecAggMasking})) {
      auto p = s.position.find(id);
      if (p == s.position.end() || by_position.count(p->second) == 0) FailMember(id, why);
    }
  };
  switch (s.stage) {
    case 0: {
      if (!in_state({MemberState::kTraining}).empty() && now < round.deadline_ms) return true;
      for (const std::string& id : in_state({MemberState::kTraining})) {
        FailMember(id, "missed the deadline");
      }
      StatusOr<secagg::MemberList> list = s.server->EndAdvertise();
      if (!list.ok()) return RefuseSecAgg(round, list.status());
      for (uint32_t p = 0; p < list->members.size(); ++p) {
        const std::string& id = s.ids[list->members[p].cohort_index];
        s.listed.push_back(id);
        s.position[id] = p;
      }
      next_stage();
      BroadcastSecAgg(round, secagg::Stage::kMemberList,
                      std::make_shared<const std::string>(secagg::Encode(*list)), s.listed);
      return true;
    }
    case 1: {
      if (!stage_over("did not reveal its randomness in time")) return true;
      StatusOr<secagg::SeedList> seeds = s.server->EndReveal();
      if (!seeds.ok()) return RestartSecAgg(round, seeds.status());
      next_stage();
      BroadcastSecAgg(round, secagg::Stage::kSeeds,
                      std::make_shared<const std::string>(secagg::Encode(*seeds)), s.listed);
      return true;
    }
    case 2: {
      if (!stage_over("did not share its keys in time")) return true;
      StatusOr<std::map<uint32_t, secagg::ShareList>> lists = s.server->EndShareKeys();
      if (!lists.ok()) return RefuseSecAgg(round, lists.status());
      fail_absent(*lists, "left secure aggregation: it shared no keys");
      next_stage();
      send_each(*lists);
      return true;
    }
    case 3: {
      if (!stage_over("did not check its shares in time")) return true;
      StatusOr<std::map<uint32_t, secagg::MaskRequest>> masks = s.server->EndVerdicts();
      if (!masks.ok()) return RefuseSecAgg(round, masks.status());
      fail_absent(*masks, "left secure aggregation: too few members hold its shares, or it lied");
      next_stage();
      send_each(*masks);
      for (const std::string& id : ids_of(*masks)) {
        if (round.members[id] == MemberState::kSecAgg)
          round.members[id] = MemberState::kSecAggMasking;
      }
      s.awaiting.clear();  // the masked inputs come through upload slots (member states)
      return true;
    }
    case 4: {
      const bool pending = !in_state({MemberState::kSecAggMasking, MemberState::kWaitingSlot,
                                      MemberState::kUploading})
                                .empty();
      if (pending && now < s.stage_deadline_ms) return true;
      for (const std::string& id : in_state(
               {MemberState::kSecAggMasking, MemberState::kWaitingSlot, MemberState::kUploading})) {
        FailMember(id, "did not send its masked input in time");
      }
      StatusOr<std::map<uint32_t, secagg::Survivors>> sets = s.server->EndMaskedInput();
      if (!sets.ok()) return RefuseSecAgg(round, sets.status());
      next_stage();
      send_each(*sets);
      return true;
    }
    case 5: {
      if (!stage_over("did not sign the survivors in time")) return true;
      StatusOr<std::map<uint32_t, secagg::UnmaskRequest>> requests = s.server->EndConsistency();
      if (!requests.ok()) return RefuseSecAgg(round, requests.status());
      if (s.distributed) {
        // Distributed DP: the release is accounted before the first unmasking share is asked
        // for, by the same count the members make now that the list is known (it can only have
        // shrunk: more honest shares, never fewer). From then on the coordinator can rebuild the
        // noised sum; should it crash and run the round again, both runs are in the ledger (an
        // over-count, never an under-count).
        const auto n = static_cast<int64_t>(s.server->listed());
        const secagg::SessionConfig& c = s.server->config();
        StatusOr<int64_t> honest = secagg::HonestShares(
            n, c.edge_threshold, static_cast<int>(c.threshold),
            secagg::Colluders(options_.secure_aggregation.graph.corrupt_fraction, n),
            c.min_survivors, options_.secure_aggregation.graph.security_bits);
        if (honest.ok() && *honest > s.noise_members) {
          s.noise_members = *honest;
          const privacy::LedgerEntry more =
              privacy::DistributedRelease(round.number,
                                          {s.plan.noise_variance, s.noise_members,
                                           s.plan.sensitivity, s.distributed->dimension},
                                          s.distributed->clip_norm, s.distributed->noise);
          s.distributed->noise_multiplier = more.noise_multiplier;
          s.distributed->tau = more.tau;
        }
        Status st = ledger_->Append(*s.distributed);
        if (!st.ok()) {
          return RefuseSecAgg(round, absl::InternalError(absl::StrCat(
                                         "distributed DP: the release could not be recorded in "
                                         "the privacy ledger, so nothing is unmasked: ",
                                         st.message())));
        }
        s.accounted = true;
      }
      next_stage();
      // Every survivor gets the same signatures: encoded once.
      if (!requests->empty()) {
        BroadcastSecAgg(
            round, secagg::Stage::kUnmask,
            std::make_shared<const std::string>(secagg::Encode(requests->begin()->second)),
            ids_of(*requests));
      }
      return true;
    }
    case 6: {
      if (!stage_over("did not help unmask in time")) return true;
      StatusOr<std::vector<uint64_t>> words = s.server->Finish();
      if (!words.ok()) return RefuseSecAgg(round, words.status());
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
      const auto survivors = static_cast<uint64_t>(s.server->survivors().size());
      if (s.weight_cap > 0) {
        // The weights' total is masked like the rest: honest members' each lie in [1, cap], so
        // anything outside [survivors, survivors x cap] is a member's lie (not attributable).
        s.total_weight = (*words)[at];
        if (s.total_weight < survivors || s.total_weight > survivors * s.weight_cap) {
          return RefuseSecAgg(
              round, absl::DataLossError(absl::StrCat(
                         "the unmasked weights total ", s.total_weight, ", outside [", survivors,
                         ", ", survivors * s.weight_cap, "] that ", survivors,
                         " honest members could send (a member lied "
                         "about its weight): the update is discarded")));
        }
      }
      if (Status st = CheckSecureSum(round, sum); !st.ok()) return RefuseSecAgg(round, st);
      s.sum = std::move(sum);
      round.metrics.results = static_cast<int64_t>(s.server->survivors().size());
      // The masked weights' total; weighing uniformly, the coordinator knows no example count.
      round.metrics.examples = s.weight_cap > 0 ? static_cast<int64_t>(s.total_weight) : -1;
      for (auto& [id, state] : round.members) {
        if (state == MemberState::kSecAgg) state = MemberState::kDone;
      }
      s.stage = 7;
      RecordSecAgg(round);
      return false;
    }
    default:
      return false;
  }
}

Status Coordinator::OnSecAggData(const std::string& id, const wire::Message& msg) {
  Round& round = *round_;
  SecAggRound& s = *round.secagg;
  const auto& data = std::get<wire::SecAggData>(msg.body);
  if (!secagg::IsStage(data.stage) || !secagg::FromMember(data.stage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure-aggregation stage ", data.stage, " is not a member's"));
  }
  if (data.nonce != round.nonces[id]) {
    return absl::InvalidArgumentError("a secure-aggregation message with a stale nonce");
  }
  HUDDLE_ASSIGN_OR_RETURN(std::span<const std::byte> bytes, secagg::PayloadOf(msg));
  const auto stage = static_cast<secagg::Stage>(data.stage);
  MemberState& state = round.members[id];
  if (stage == secagg::Stage::kAdvertise) {
    if (s.stage != 0 || state != MemberState::kTraining) {
      return absl::InvalidArgumentError("a key advertisement out of turn");
    }
    std::optional<MemberCertificate> certificate;
    if (options_.secure_aggregation.certificates) {
      certificate = options_.secure_aggregation.certificates(id);
    }
    if (!certificate) {
      return absl::FailedPreconditionError(
          absl::StrCat("client ", id,
                       " has no certificate from the project key: members accept only "
                       "certified peers (huddle certify; docs/security.md)"));
    }
    HUDDLE_ASSIGN_OR_RETURN(auto keys, secagg::Decode<secagg::Advertisement>(bytes));
    HUDDLE_RETURN_IF_ERROR(s.server->OnAdvertise(s.index.at(id), *certificate, keys));
    state = MemberState::kSecAgg;
    return absl::OkStatus();
  }
  // Every other stage answers the current one, once.
  static constexpr int kStageOf[] = {0, 0, 0, 1, 0, 2, 0, 3, 0, 0, 5, 0, 6};
  if (s.awaiting.count(id) == 0 || kStageOf[data.stage] != s.stage) {
    return absl::InvalidArgumentError(
        absl::StrCat("a secure-aggregation ", secagg::StageName(stage), " out of turn"));
  }
  const uint32_t p = s.position.at(id);
  Status st;
  switch (stage) {
    case secagg::Stage::kReveal: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::Reveal>(bytes));
      st = s.server->OnReveal(p, m);
      break;
    }
    case secagg::Stage::kShares: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::ShareKeys>(bytes));
      st = s.server->OnShareKeys(p, m);
      break;
    }
    case secagg::Stage::kVerdict: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::Verdict>(bytes));
      st = s.server->OnVerdict(p, m);
      break;
    }
    case secagg::Stage::kConsistency: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::Consistency>(bytes));
      st = s.server->OnConsistency(p, m);
      break;
    }
    case secagg::Stage::kUnmaskResponse: {
      HUDDLE_ASSIGN_OR_RETURN(auto m, secagg::Decode<secagg::UnmaskResponse>(bytes));
      st = s.server->OnUnmask(p, m);
      break;
    }
    default:
      st = absl::InvalidArgumentError("not a member's stage");
  }
  if (st.ok()) s.awaiting.erase(id);
  return st;
}

void Coordinator::OnRefusedSecAggMessage(const std::string& id, const std::string& why) {
  if (!round_ || !round_->secagg) return;
  Round& round = *round_;
  const SecAggRound& s = *round.secagg;
  auto m = round.members.find(id);
  if (m == round.members.end()) return;
  // Stage 4 waits on member states (the masked inputs come through upload slots), the others on
  // s.awaiting. A member still training (stage 0) is waited for as in a round without secure
  // aggregation, until the round's deadline.
  const bool masking = s.stage == 4 && (m->second == MemberState::kSecAggMasking ||
                                        m->second == MemberState::kWaitingSlot ||
                                        m->second == MemberState::kUploading);
  if (!masking && s.awaiting.count(id) == 0) return;
  round.metrics.rejected++;
  if (round.first_rejection.empty()) round.first_rejection = why;
  FailMember(id, "sent a refused message while a secure-aggregation stage awaited its answer");
}

void Coordinator::OnSecAgg(const std::string& id, const wire::Message& msg) {
  const transport::PeerId peer = PeerOf(id);
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
  if (msg.type() == wire::MessageType::kSecAggData) {
    Status st = OnSecAggData(id, msg);
    if (!st.ok()) refuse(std::string(st.message()));
    return;
  }
  const std::string& nonce = round.nonces[id];
  Status st;
  const auto& b = std::get<wire::SecAggMaskedInput>(msg.body);
  if (s.stage != 4 || m->second != MemberState::kUploading || b.nonce != nonce ||
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
  // Gathered in the session's own width: 32-bit words take half the memory of 64-bit ones.
  secagg_scratch_.clear();
  secagg_scratch32_.clear();
  for (size_t i = 0; st.ok() && i < msg.tensors.size(); ++i) {
    const wire::TensorPayload& t = msg.tensors[i];
    const TensorSpec want = i < layout_.size()
                                ? TensorSpec{layout_[i].name, dtype, layout_[i].shape}
                                : TensorSpec{kWeightName, dtype, {1}};
    if (t.spec != want) {
      st = absl::InvalidArgumentError(
          absl::StrCat("masked tensor ", i, " is '", t.spec.name, "' ", ShapeString(t.spec.shape),
                       " ", DTypeName(t.spec.dtype), "; the round's is '", want.name, "' ",
                       ShapeString(want.shape), " ", DTypeName(dtype)));
      break;
    }
    const size_t words = static_cast<size_t>(t.spec.NumElements());
    if (dtype == DType::kUint64) {
      const size_t at = secagg_scratch_.size();
      secagg_scratch_.resize(at + words);
      std::memcpy(secagg_scratch_.data() + at, t.bytes.data(), words * 8);
    } else {
      const size_t at = secagg_scratch32_.size();
      secagg_scratch32_.resize(at + words);
      std::memcpy(secagg_scratch32_.data() + at, t.bytes.data(), words * 4);
    }
  }
  if (st.ok()) {
    const uint32_t position = s.position.at(id);
    st = dtype == DType::kUint64
             ? s.server->OnMaskedInput(position, std::span<const uint64_t>(secagg_scratch_))
             : s.server->OnMaskedInput(position, std::span<const uint32_t>(secagg_scratch32_));
  }
  if (st.ok()) {
    // Its upload is done: the slot goes to the next member. (A refused input fails the member
    // below, which frees the slot the same way.)
    slots_.Release(id);
    m->second = MemberState::kSecAgg;
    GrantSlots();
  }
  if (!st.ok()) refuse(std::string(st.message()));
}

Status Coordinator::CheckSecureSum(const Round& round, const TensorList& sum) const {
  const SecAggRound& s = *round.secagg;
  const auto survivors = static_cast<double>(s.server->survivors().size());
  // Each honest member's input has L2 norm <= C (clipped; weighted ones scaled by w / cap <= 1),
  // and rounding moves each of its d values by less than one grid step; the noise (local DP:
  // each value's; distributed DP: the sum's) stays below its tail (Laurent-Massart, 2^-64).
  const auto d = static_cast<double>(TotalElements(layout_));
  const double step = std::ldexp(1.0, -s.plan.scale_exponent);
  double noise_sd = 0;  // per value of the sum
  if (s.distributed) {
    noise_sd = std::sqrt(survivors * static_cast<double>(s.plan.noise_variance)) * step;
  } else if (dp()) {
    noise_sd = std::sqrt(survivors) * round.noise_multiplier * round.clip_norm;
  }
  const double t = 64 * std::log(2.0);
  const double noise = noise_sd * std::sqrt(d + 2 * std::sqrt(d * t) + 2 * t);
  const double bound = (survivors * (s.clip_norm + step * std::sqrt(d)) + noise) * (1 + 1e-6);
  double sq = 0;
  for (const Tensor& tensor : sum) {
    for (float v : tensor.data) sq += static_cast<double>(v) * v;
  }
  const double norm = std::sqrt(sq);
  if (!(norm <= bound)) {
    return absl::DataLossError(absl::StrCat(
        "the unmasked sum's L2 norm ", norm, " exceeds ", bound, ", the most ", survivors,
        " clipped updates (norm <= ", s.clip_norm,
        ") and their noise can make: a member sent an "
        "input out of range (masked inputs cannot be told apart): the update is discarded"));
  }
  return absl::OkStatus();
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
    for (float& v : t.data) v = static_cast<float>(v / divisor);
  }
  return absl::OkStatus();
}

}  // namespace huddle::coordinator
