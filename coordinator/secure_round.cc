// The secure aggregation of one round: see secure_round.h for its stages.
#include "coordinator/secure_round.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "privacy/distributed.h"

namespace huddle::coordinator {

namespace secagg = aggregation::secagg;

namespace {

// Members' default cap is 4 sessions a round (client/agent.h): 3 restarts.
constexpr int kMaxRestarts = 3;
constexpr int kOver = 7;

}  // namespace

SecureRound::SecureRound(SecureRoundSettings settings, RoundMembers* members,
                         std::set<std::string>* excluded, SecureRoundHost* host, const Clock* clock)
    : settings_(std::move(settings)),
      members_(members),
      excluded_(excluded),
      host_(host),
      clock_(clock) {}

StatusOr<std::unique_ptr<SecureRound>> SecureRound::Start(
    SecureRoundSettings settings, const std::vector<std::string>& cohort, RoundMembers* members,
    std::set<std::string>* excluded, SecureRoundHost* host, const Clock* clock) {
  const SecureAggregationOptions& o = *settings.options;
  const uint64_t round = settings.round;
  const uint32_t n = static_cast<uint32_t>(cohort.size());
  if (n < 2) {
    spdlog::warn(
        "round {}: a cohort of {} cannot aggregate securely (at least 2 members hide "
        "each other); the round trains nothing",
        round, n);
    return nullptr;
  }
  // The minimum, once, before anything is sized from it: the configured quorum and fraction,
  // and the consistency quorum (more than half the cohort, the colluders aside), without which
  // members reveal nothing.
  const int64_t colluders = secagg::Colluders(o.graph.corrupt_fraction, n);
  const int64_t consistency = secagg::ConsistencyQuorum(n, colluders);
  const int64_t by_fraction =
      static_cast<int64_t>(std::ceil(o.min_survivor_fraction * static_cast<double>(n) - 1e-9));
  int64_t min_survivors =
      std::clamp<int64_t>(std::max({settings.quorum, by_fraction, consistency}), 1, n);
  secagg::GraphParameters params;
  if (o.neighbours > 0 && o.threshold > 0) {
    params.neighbours = o.neighbours;
    params.threshold = o.threshold;
    params.edge_threshold = secagg::EdgeThreshold(n, o.neighbours);
  } else {
    StatusOr<secagg::GraphParameters> chosen = secagg::ChooseParameters(n, min_survivors, o.graph);
    if (!chosen.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure_aggregation: round ", round, ": ", chosen.status().message()));
    }
    params = *chosen;
  }
  min_survivors = std::max<int64_t>(min_survivors, params.threshold);
  std::unique_ptr<SecureRound> s(
      new SecureRound(std::move(settings), members, excluded, host, clock));
  const SecureRoundSettings& r = s->settings_;
  const int64_t dim = TotalElements(r.layout);
  secagg::QuantizeRequest q;
  q.clip_norm = r.clip_norm;
  q.members = n;
  q.dim = dim;
  q.min_survivors = 1;
  q.bits = o.bits;
  if (r.distributed) {
    // Distributed DP: the noise shares of the fewest honest members any sum the coordinator can
    // unmask holds carry the whole noise: the minimum, less the members that may collude (they
    // know their own shares), less those an active coordinator could cut off by dropping members
    // (graph.h). The same count the members make by their own assumptions.
    StatusOr<int64_t> honest =
        secagg::HonestShares(n, params.edge_threshold, params.threshold, colluders, min_survivors,
                             o.graph.security_bits);
    if (!honest.ok()) {
      spdlog::warn("round {}: distributed DP: {}; the round trains nothing", round,
                   honest.status().message());
      return nullptr;
    }
    s->noise_members_ = *honest;
    q.noise_multiplier = r.noise_multiplier;
    q.min_survivors = static_cast<uint32_t>(s->noise_members_);
  } else if (r.dp) {
    // Local DP: each client's values carry its own noise (std z C) on top of the clipped update.
    q.value_noise_stddev = r.noise_multiplier * r.clip_norm;
  }
  HUDDLE_ASSIGN_OR_RETURN(s->plan_, secagg::PlanQuantization(q));
  const secagg::QuantizePlan& plan = s->plan_;
  if (r.distributed) {
    // The round's release as accounted: the sum's multiplier with the variance as rounded up
    // (sqrt(m s) / Delta >= z) and Kairouz et al.'s tau for m shares.
    privacy::LedgerEntry e = privacy::DistributedRelease(
        round, {plan.noise_variance, s->noise_members_, plan.sensitivity, dim}, r.clip_norm,
        privacy::kNoiseSecAggShares);
    e.job = r.job_name;
    // The plan fitted the round with tau = 0; a coarse grid's tau could take it past the total.
    HUDDLE_ASSIGN_OR_RETURN(auto would, host->WouldSpend(e));
    if (would.second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", round, ": distributed DP: the members' noise shares (variance ",
          plan.noise_variance, " on a grid of 2^", plan.scale_exponent, ") would take epsilon to ",
          would.first.epsilon, ", past privacy.epsilon (tau ", e.tau, " for ", s->noise_members_,
          " shares); use 64-bit words (secure_aggregation.bits) or more "
          "noise"));
    }
    s->distributed_ = std::move(e);
  }
  // FedAvg weights (without DP, when asked for) travel as one more word; their sum must fit too.
  if (!r.dp && o.weight_by_examples) {
    const uint64_t room = ((uint64_t{1} << (plan.bits - 1)) - 1) / n;
    s->weight_cap_ = std::clamp<uint64_t>(static_cast<uint64_t>(r.weight_cap), 1, room);
  }
  secagg::ServerOptions so;
  so.graph = o.graph;
  secagg::SessionConfig& c = so.config;
  c.members = n;
  c.threshold = static_cast<uint32_t>(params.threshold);
  c.edge_threshold = params.edge_threshold;
  c.min_survivors = static_cast<uint32_t>(min_survivors);
  c.bits = plan.bits;
  c.length = static_cast<uint64_t>(dim) + (s->weight_cap_ > 0 ? 1 : 0);
  c.scale_exponent = plan.scale_exponent;
  c.noise_variance = plan.noise_variance;
  c.weight_cap = s->weight_cap_;
  c.clip_norm = r.clip_norm;
  StatusOr<secagg::Server> server = secagg::Server::Create(so);
  if (!server.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure_aggregation: round ", round, ": ", server.status().message()));
  }
  s->server_.emplace(*std::move(server));
  s->ids_ = cohort;
  for (uint32_t i = 0; i < n; ++i) s->index_[cohort[i]] = i;
  if (o.neighbours == 0 && params.reliability_bits < o.graph.reliability_bits) {
    spdlog::warn(
        "round {}: with {} members and dropout_fraction {}, even the complete graph may leave a "
        "member short of {} surviving neighbours (a failed round, nothing revealed) with "
        "probability up to 2^-{:.1f}, above secure_aggregation.reliability_bits' 2^-{}",
        round, n, o.graph.dropout_fraction, params.threshold, params.reliability_bits,
        o.graph.reliability_bits);
  }
  spdlog::info(
      "round {}: secure aggregation of {} members: {:.1f} neighbours each on average, {} shares "
      "rebuild a secret, at least {} masked inputs unmasked, {} signatures before unmasking; "
      "{}-bit words at 2^{}{}",
      round, n, secagg::EdgeProbability(params.edge_threshold) * (n - 1), params.threshold,
      min_survivors, consistency, plan.bits, plan.scale_exponent,
      s->distributed_
          ? fmt::format("; each adds discrete Gaussian noise of variance {} (the sum "
                        "of {} honest members': multiplier {:.6g})",
                        plan.noise_variance, s->noise_members_, s->distributed_->noise_multiplier)
          : std::string());
  s->Record();
  return s;
}

wire::SecureAggregation SecureRound::Instruction(const std::string& id) const {
  return secagg::SessionToWire(server_->config(), index_.at(id));
}

size_t SecureRound::UploadBytes() const {
  return static_cast<size_t>(server_->config().length) * static_cast<size_t>(plan_.bits / 8);
}

void SecureRound::OnUploadGranted(const std::string& id, std::vector<double>* upload_seconds) {
  upload_granted_ms_[id] = clock_->NowMs();
  upload_seconds_ = upload_seconds;
}

void SecureRound::UploadReceived(const std::string& id) {
  // The transport hands over a message once its last frame (chunk) arrived: the whole masked
  // input is in now. A member always uploads under a grant (kUploading is reached only through the
  // host's grant); one without a recorded grant (a host that grants without telling the session)
  // has no duration rather than a made-up one.
  auto granted = upload_granted_ms_.find(id);
  if (granted == upload_granted_ms_.end()) return;
  if (upload_seconds_ != nullptr) {
    upload_seconds_->push_back(
        static_cast<double>(std::max<int64_t>(0, clock_->NowMs() - granted->second)) / 1000.0);
  }
  upload_granted_ms_.erase(granted);
}

int64_t SecureRound::TimeoutMs() const {
  const int64_t deadline = stage_ == 0 ? settings_.deadline_ms : stage_deadline_ms_;
  return std::max<int64_t>(0, deadline - clock_->NowMs());
}

bool SecureRound::Awaits(const std::string& id, MemberState state) const {
  // Stage 4 waits on member states (the masked inputs come through upload slots), the others on
  // awaiting_.
  const bool masking =
      stage_ == 4 && (state == MemberState::kSecAggMasking || state == MemberState::kWaitingSlot ||
                      state == MemberState::kUploading);
  return masking || awaiting_.count(id) > 0;
}

void SecureRound::Broadcast(secagg::Stage stage, std::shared_ptr<const std::string> bytes,
                            const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    if ((*members_)[id] == MemberState::kFailed) continue;
    Status st =
        host_->SendToMember(id, secagg::ToMessage(stage, bytes, settings_.round, "coordinator"));
    if (absl::IsNotFound(st)) {  // a member whose key was revoked has left (and failed)
      host_->FailMember(id, "left the federation during secure aggregation");
      continue;
    }
    if (!st.ok()) {
      host_->FailMember(id, "unreachable during secure aggregation");
      continue;
    }
    awaiting_.insert(id);
  }
}

bool SecureRound::Refuse(const Status& why) {
  failure_ = std::string(why.message());
  spdlog::warn("round {}: {}", settings_.round, why.message());
  stage_ = kOver;
  awaiting_.clear();
  for (auto& [id, state] : *members_) {
    if (IsOpen(state)) host_->FailMember(id, "left: the secure aggregation was refused");
  }
  Record();
  return false;
}

bool SecureRound::Restart(const Status& why) {
  std::vector<std::string> cohort;
  for (const std::string& id : listed_) {
    if ((*members_)[id] == MemberState::kSecAgg) cohort.push_back(id);
  }
  secagg::ServerOptions so;
  so.config = server_->config();
  so.graph = settings_.options->graph;
  so.config.members = static_cast<uint32_t>(cohort.size());
  if (restarts_ >= kMaxRestarts || cohort.size() < std::max<size_t>(2, so.config.min_survivors)) {
    return Refuse(why);
  }
  StatusOr<secagg::Server> server = secagg::Server::Create(so);
  if (!server.ok()) return Refuse(why);
  ++restarts_;
  spdlog::warn(
      "round {}: {}; starting the session again with the {} members that revealed ({} of "
      "{} restarts)",
      settings_.round, why.message(), cohort.size(), restarts_, kMaxRestarts);
  server_.emplace(*std::move(server));
  ids_ = cohort;
  index_.clear();
  for (uint32_t i = 0; i < cohort.size(); ++i) index_[cohort[i]] = i;
  listed_.clear();
  position_.clear();
  awaiting_.clear();
  stage_ = 0;
  settings_.deadline_ms =
      std::max(settings_.deadline_ms, clock_->NowMs() + settings_.options->stage_timeout_ms);
  for (const std::string& id : cohort) {
    (*members_)[id] = MemberState::kTraining;
    host_->SendFit(id, settings_.deadline_ms);  // the new session; it masks the update it trained
  }
  return true;
}

void SecureRound::Record() {
  const secagg::Server& server = *server_;
  const secagg::SessionConfig& c = server.config();
  RoundMetrics::SecureAggregation a;
  a.members = c.members;
  a.threshold = static_cast<int>(c.threshold);
  a.neighbours = secagg::EdgeProbability(c.edge_threshold) * (c.members - 1);
  a.min_survivors = c.min_survivors;
  a.bits = c.bits;
  a.consistency_quorum = secagg::ConsistencyQuorum(
      c.members, secagg::Colluders(settings_.options->graph.corrupt_fraction, c.members));
  a.honest_shares = noise_members_;
  a.listed = static_cast<int64_t>(server.listed());
  a.shared = static_cast<int64_t>(server.shared().size());
  a.masked = static_cast<int64_t>(server.survivors().size());
  a.signed_survivors = static_cast<int64_t>(server.signers().size());
  a.answered = static_cast<int64_t>(server.responders().size());
  a.complaints = static_cast<int64_t>(server.disputes().size());
  for (const secagg::Blame& b : server.blames()) {
    const std::string id = b.member < listed_.size() ? listed_[b.member] : "?";
    a.blamed.emplace_back(id, b.reason);
  }
  a.released = sum_.has_value();
  a.failure = failure_;
  a.restarts = restarts_;
  // A member found lying is named, and left out of the job's later cohorts (the evidence is its
  // own signature, or a share that is not the one it was dealt).
  for (const auto& [id, why] : a.blamed) {
    if (id != "?" && excluded_->insert(id).second) {
      spdlog::warn("round {}: secure aggregation: client {} {}; it is left out of later rounds",
                   settings_.round, id, why);
    }
  }
  metrics_ = std::move(a);
}

std::vector<std::string> SecureRound::InState(std::initializer_list<MemberState> states) const {
  std::vector<std::string> out;
  for (const auto& [id, state] : *members_) {
    if (std::find(states.begin(), states.end(), state) != states.end()) out.push_back(id);
  }
  return out;
}

bool SecureRound::Step() {
  if (stage_ >= kOver) return false;
  const int64_t now = clock_->NowMs();
  // Ends a stage that waits for one answer from each member due: false while some are due.
  auto stage_over = [&](const char* what) {
    if (!awaiting_.empty() && now < stage_deadline_ms_) return false;
    // FailMember erases from awaiting_: iterate over a copy taken out of it.
    const auto late = std::exchange(awaiting_, {});
    for (const std::string& id : late) host_->FailMember(id, what);
    return true;
  };
  auto next_stage = [&] {
    ++stage_;
    stage_deadline_ms_ = now + settings_.options->stage_timeout_ms;
  };
  auto ids_of = [&](const auto& by_position) {
    std::vector<std::string> out;
    for (const auto& [p, unused] : by_position) out.push_back(listed_[p]);
    return out;
  };
  auto send_each = [&](const auto& by_position) {
    for (const auto& [p, m] : by_position) {
      Broadcast(secagg::StageOf<std::decay_t<decltype(m)>>(),
                std::make_shared<const std::string>(secagg::Encode(m)), {listed_[p]});
    }
  };
  // Members still in the session that the server left out at this stage.
  auto fail_absent = [&](const auto& by_position, const char* why) {
    for (const std::string& id : InState({MemberState::kSecAgg, MemberState::kSecAggMasking})) {
      auto p = position_.find(id);
      if (p == position_.end() || by_position.count(p->second) == 0) host_->FailMember(id, why);
    }
  };
  switch (stage_) {
    case 0: {
      const bool enough = settings_.enough > 0 && InState({MemberState::kSecAgg}).size() >=
                                                      static_cast<size_t>(settings_.enough);
      if (!InState({MemberState::kTraining}).empty() && now < settings_.deadline_ms && !enough) {
        return true;
      }
      for (const std::string& id : InState({MemberState::kTraining})) {
        host_->FailMember(id, enough ? "was not among the first to train (async.over_selection)"
                                     : "missed the deadline");
      }
      StatusOr<secagg::MemberList> list = server_->EndAdvertise();
      if (!list.ok()) return Refuse(list.status());
      for (uint32_t p = 0; p < list->members.size(); ++p) {
        const std::string& id = ids_[list->members[p].cohort_index];
        listed_.push_back(id);
        position_[id] = p;
      }
      next_stage();
      Broadcast(secagg::Stage::kMemberList,
                std::make_shared<const std::string>(secagg::Encode(*list)), listed_);
      return true;
    }
    case 1: {
      if (!stage_over("did not reveal its randomness in time")) return true;
      StatusOr<secagg::SeedList> seeds = server_->EndReveal();
      if (!seeds.ok()) return Restart(seeds.status());
      next_stage();
      Broadcast(secagg::Stage::kSeeds, std::make_shared<const std::string>(secagg::Encode(*seeds)),
                listed_);
      return true;
    }
    case 2: {
      if (!stage_over("did not share its keys in time")) return true;
      StatusOr<std::map<uint32_t, secagg::ShareList>> lists = server_->EndShareKeys();
      if (!lists.ok()) return Refuse(lists.status());
      fail_absent(*lists, "left secure aggregation: it shared no keys");
      next_stage();
      send_each(*lists);
      return true;
    }
    case 3: {
      if (!stage_over("did not check its shares in time")) return true;
      StatusOr<std::map<uint32_t, secagg::MaskRequest>> masks = server_->EndVerdicts();
      if (!masks.ok()) return Refuse(masks.status());
      fail_absent(*masks, "left secure aggregation: too few members hold its shares, or it lied");
      next_stage();
      send_each(*masks);
      for (const std::string& id : ids_of(*masks)) {
        if ((*members_)[id] == MemberState::kSecAgg) (*members_)[id] = MemberState::kSecAggMasking;
      }
      awaiting_.clear();  // the masked inputs come through upload slots (member states)
      return true;
    }
    case 4: {
      const std::vector<std::string> pending = InState(
          {MemberState::kSecAggMasking, MemberState::kWaitingSlot, MemberState::kUploading});
      if (!pending.empty() && now < stage_deadline_ms_) return true;
      for (const std::string& id : pending) {
        host_->FailMember(id, "did not send its masked input in time");
      }
      StatusOr<std::map<uint32_t, secagg::Survivors>> sets = server_->EndMaskedInput();
      if (!sets.ok()) return Refuse(sets.status());
      next_stage();
      send_each(*sets);
      return true;
    }
    case 5: {
      if (!stage_over("did not sign the survivors in time")) return true;
      StatusOr<std::map<uint32_t, secagg::UnmaskRequest>> requests = server_->EndConsistency();
      if (!requests.ok()) return Refuse(requests.status());
      if (distributed_) {
        if (Status st = AccountRelease(); !st.ok()) {
          return Refuse(absl::InternalError(absl::StrCat(
              "distributed DP: the release could not be recorded in the privacy ledger, so "
              "nothing is unmasked: ",
              st.message())));
        }
      }
      next_stage();
      // Every survivor gets the same signatures: encoded once.
      if (!requests->empty()) {
        Broadcast(secagg::Stage::kUnmask,
                  std::make_shared<const std::string>(secagg::Encode(requests->begin()->second)),
                  ids_of(*requests));
      }
      return true;
    }
    case 6: {
      if (!stage_over("did not help unmask in time")) return true;
      StatusOr<std::vector<uint64_t>> words = server_->Finish();
      if (!words.ok()) return Refuse(words.status());
      return Release(*words);
    }
    default:
      return false;
  }
}

Status SecureRound::AccountRelease() {
  // Distributed DP: the release is accounted before the first unmasking share is asked for, by
  // the same count the members make now that the list is known (it can only have shrunk: more
  // honest shares, never fewer). From then on the coordinator can rebuild the noised sum; should
  // it crash and run the round again, both runs are in the ledger (an over-count, never an
  // under-count).
  const auto n = static_cast<int64_t>(server_->listed());
  const secagg::SessionConfig& c = server_->config();
  const secagg::GraphOptions& g = settings_.options->graph;
  StatusOr<int64_t> honest = secagg::HonestShares(
      n, c.edge_threshold, static_cast<int>(c.threshold), secagg::Colluders(g.corrupt_fraction, n),
      c.min_survivors, g.security_bits);
  if (honest.ok() && *honest > noise_members_) {
    noise_members_ = *honest;
    const privacy::LedgerEntry more = privacy::DistributedRelease(
        settings_.round,
        {plan_.noise_variance, noise_members_, plan_.sensitivity, distributed_->dimension},
        distributed_->clip_norm, distributed_->noise);
    distributed_->noise_multiplier = more.noise_multiplier;
    distributed_->tau = more.tau;
  }
  HUDDLE_RETURN_IF_ERROR(host_->Account(*distributed_));
  accounted_ = true;
  return absl::OkStatus();
}

bool SecureRound::Release(const std::vector<uint64_t>& words) {
  // The sum, decoded: the survivors' (weighted) updates, exactly as they rounded them.
  TensorList sum;
  sum.reserve(settings_.layout.size());
  size_t at = 0;
  for (const TensorSpec& spec : settings_.layout) {
    Tensor& t = sum.emplace_back();
    t.spec = spec;
    t.data.resize(static_cast<size_t>(spec.NumElements()));
    secagg::Decode(std::span<const uint64_t>(words).subspan(at, t.data.size()), plan_.bits,
                   plan_.scale_exponent, t.data);
    at += t.data.size();
  }
  const auto survivors = static_cast<uint64_t>(server_->survivors().size());
  if (weight_cap_ > 0) {
    // The weights' total is masked like the rest: honest members' each lie in [1, cap], so
    // anything outside [survivors, survivors x cap] is a member's lie (not attributable).
    total_weight_ = words[at];
    if (total_weight_ < survivors || total_weight_ > survivors * weight_cap_) {
      return Refuse(absl::DataLossError(
          absl::StrCat("the unmasked weights total ", total_weight_, ", outside [", survivors, ", ",
                       survivors * weight_cap_, "] that ", survivors,
                       " honest members could send (a member lied "
                       "about its weight): the update is discarded")));
    }
  }
  if (Status st = CheckSum(sum); !st.ok()) return Refuse(st);
  sum_ = std::move(sum);
  for (auto& [id, state] : *members_) {
    if (state == MemberState::kSecAgg) state = MemberState::kDone;
  }
  stage_ = kOver;
  Record();
  return false;
}

int64_t SecureRound::survivors() const { return static_cast<int64_t>(server_->survivors().size()); }

int64_t SecureRound::examples() const {
  // The masked weights' total; weighing uniformly, the coordinator knows no example count.
  return weight_cap_ > 0 ? static_cast<int64_t>(total_weight_) : -1;
}

Status SecureRound::CheckSum(const TensorList& sum) const {
  const auto survivors = static_cast<double>(server_->survivors().size());
  // Each honest member's input has L2 norm <= C (clipped; weighted ones scaled by w / cap <= 1),
  // and rounding moves each of its d values by less than one grid step; the noise (local DP:
  // each value's; distributed DP: the sum's) stays below its tail (Laurent-Massart, 2^-64).
  const auto d = static_cast<double>(TotalElements(settings_.layout));
  const double step = std::ldexp(1.0, -plan_.scale_exponent);
  double noise_sd = 0;  // per value of the sum
  if (distributed_) {
    noise_sd = std::sqrt(survivors * static_cast<double>(plan_.noise_variance)) * step;
  } else if (settings_.dp) {
    noise_sd = std::sqrt(survivors) * settings_.noise_multiplier * settings_.clip_norm;
  }
  const double t = 64 * std::log(2.0);
  const double noise = noise_sd * std::sqrt(d + 2 * std::sqrt(d * t) + 2 * t);
  const double clip = settings_.clip_norm;
  const double bound = (survivors * (clip + step * std::sqrt(d)) + noise) * (1 + 1e-6);
  double sq = 0;
  for (const Tensor& tensor : sum) {
    for (float v : tensor.data) sq += static_cast<double>(v) * v;
  }
  const double norm = std::sqrt(sq);
  if (!(norm <= bound)) {
    return absl::DataLossError(absl::StrCat(
        "the unmasked sum's L2 norm ", norm, " exceeds ", bound, ", the most ", survivors,
        " clipped updates (norm <= ", clip,
        ") and their noise can make: a member sent an "
        "input out of range (masked inputs cannot be told apart): the update is discarded"));
  }
  return absl::OkStatus();
}

Status SecureRound::Mean(TensorList* mean) const {
  // Weighted: each survivor sent (w_i / cap) x_i and w_i, so the FedAvg mean is
  // cap * sum / sum(w). Uniform: the sum over the survivors.
  const double divisor = weight_cap_ > 0
                             ? static_cast<double>(total_weight_) / static_cast<double>(weight_cap_)
                             : static_cast<double>(survivors());
  if (!(divisor > 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", settings_.round, ": the secure sum has no weight"));
  }
  *mean = *sum_;
  for (Tensor& t : *mean) {
    for (float& v : t.data) v = static_cast<float>(v / divisor);
  }
  return absl::OkStatus();
}

double SecureRound::SumNoiseStddev() const {
  return std::sqrt(static_cast<double>(noise_members_) *
                   static_cast<double>(plan_.noise_variance)) *
         std::ldexp(1.0, -plan_.scale_exponent);
}

}  // namespace huddle::coordinator
