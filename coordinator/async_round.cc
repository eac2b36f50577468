#include "coordinator/async_round.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "common/secure_random.h"

namespace huddle::coordinator {
namespace {

constexpr uint64_t kTaskSeedStream = 0x61737963;  // "asyc"

}  // namespace

AsyncRound::AsyncRound(Parts parts) : SchedulerBase(std::move(parts)) {}

void AsyncRound::Open(Round* flush, uint64_t model_version,
                      std::shared_ptr<const TensorList> global) {
  if (model_version != model_version_) failed_on_version_.clear();
  flush_ = flush;
  model_version_ = model_version;
  global_ = std::move(global);
  staleness_sum_ = discount_sum_ = 0;
  staleness_max_ = refused_stale_ = 0;
  weight_cap_ = WeightCap();
  for (auto& [id, outcome] : std::exchange(ended_between_, {})) {
    flush_->members.try_emplace(id, MemberState::kFailed);
    flush_->outcomes.try_emplace(id, std::move(outcome));
  }
  std::vector<std::pair<std::string, wire::Message>> kept = std::exchange(kept_, {});
  for (auto& [id, msg] : kept) {
    if (Full()) {
      kept_.emplace_back(std::move(id), std::move(msg));  // for the flush after this one
      continue;
    }
    auto t = tasks_.find(id);
    if (t == tasks_.end()) continue;  // it failed meanwhile
    const Task task = t->second;
    tasks_.erase(t);
    Accept(id, task, msg);
  }
  GrantSlots();
}

void AsyncRound::Close() {
  if (flush_ == nullptr) return;
  RoundMetrics::Async a;
  a.buffer = options_->async.buffer;
  a.concurrency = options_->async.concurrency;
  a.in_flight = in_flight();
  a.refused_stale = refused_stale_;
  const int64_t n = flush_->metrics.results;
  a.staleness_mean = n > 0 ? staleness_sum_ / static_cast<double>(n) : 0;
  a.discount_mean = n > 0 ? discount_sum_ / static_cast<double>(n) : 0;
  a.staleness_max = staleness_max_;
  flush_->metrics.async = a;
  int64_t dropped = 0;
  for (const auto& [id, state] : flush_->members) dropped += state == MemberState::kFailed;
  flush_->metrics.dropped = dropped;
  flush_ = nullptr;
}

int64_t AsyncRound::WeightCap() const {
  // The median of the counts the live clients claimed when joining (the synchronous round takes
  // its cohort's; here any live client may contribute).
  std::vector<uint64_t> claims;
  for (const std::string& id : population_->LiveIds()) {
    const Population::Client* c = population_->Find(id);
    claims.push_back(c != nullptr ? c->num_examples : 0);
  }
  return MedianWeightCap(std::move(claims), options_->max_weight_ratio,
                         options_->aggregation.max_weight);
}

bool AsyncRound::Eligible(const std::string& id, const std::set<std::string>& excluded) const {
  if (excluded.contains(id) || tasks_.contains(id)) return false;
  // Under DP: fewer than max_participations contributions, the last min_separation steps ago.
  if (contributions_ != nullptr &&
      !contributions_->MaySend(id, flush_ != nullptr ? flush_->number : 0)) {
    return false;
  }
  auto v = last_version_.find(id);
  return v == last_version_.end() || v->second < model_version_;
}

bool AsyncRound::Bounded(const std::set<std::string>& excluded, bool ever) const {
  if (contributions_ == nullptr || !tasks_.empty() || flush_ == nullptr) return false;
  const uint64_t step = ever ? UINT64_MAX : flush_->number;
  for (const std::string& id : population_->LiveIds(excluded)) {
    if (contributions_->MaySend(id, step)) return false;
  }
  return true;
}

void AsyncRound::TopUp(const std::set<std::string>& excluded) {
  if (flush_ == nullptr) return;
  const int64_t want = options_->async.concurrency - in_flight();
  if (want <= 0) return;
  std::vector<std::string> idle;
  for (std::string& id : population_->LiveIds(excluded)) {
    if (Eligible(id, excluded)) idle.push_back(std::move(id));
  }
  // A uniform draw without replacement of `want` of them (a partial Fisher-Yates shuffle of the
  // sorted ids, from the job's seeded stream; under DP with private noise, the OS CSPRNG's).
  const size_t n = std::min(idle.size(), static_cast<size_t>(want));
  for (size_t i = 0; i < n; ++i) {
    const uint64_t left = idle.size() - i;
    const size_t j = i + static_cast<size_t>(sampler_ != nullptr ? sampler_->UniformBelow(left)
                                                                 : rng_->UniformInt(left));
    std::swap(idle[i], idle[j]);
    SendTask(idle[i]);
  }
}

bool AsyncRound::AllowRetries() {
  bool any = false;
  for (const std::string& id : std::exchange(failed_on_version_, {})) {
    auto v = last_version_.find(id);
    if (v != last_version_.end() && v->second == model_version_ && !tasks_.contains(id)) {
      last_version_.erase(v);
      any = true;
    }
  }
  return any;
}

bool AsyncRound::Full() const {
  return flush_ != nullptr && flush_->metrics.results >= options_->async.buffer;
}

bool AsyncRound::Starved(const std::set<std::string>& excluded) const {
  if (!tasks_.empty()) return false;
  for (const std::string& id : population_->LiveIds(excluded)) {
    if (Eligible(id, excluded)) return false;
  }
  return true;
}

int64_t AsyncRound::WaitMs(int64_t cap) const {
  const int64_t now = clock_->NowMs();
  int64_t wait = cap;
  for (const auto& [id, task] : tasks_) wait = std::min(wait, task.deadline_ms - now);
  return std::max<int64_t>(0, wait);
}

void AsyncRound::SendTask(const std::string& id) {
  Task task;
  task.round = flush_->number;
  task.model_version = model_version_;
  task.deadline_ms = clock_->NowMs() + options_->round_deadline_ms;
  // A fresh nonce per task: its upload request and result must carry it, so a result of an
  // earlier task (or replayed) is refused.
  task.nonce = SecureRandomBytes(wire::kNonceBytes);
  wire::FitInstruction fit;
  fit.model_version = model_version_;
  fit.train = options_->train;
  // Under secret sampling a fresh random number: one derived from the job seed would let any
  // client recover the seed and predict the draws.
  fit.seed = sampler_ != nullptr ? sampler_->NextU64()
                                 : DeriveSeed(options_->seed, kTaskSeedStream, tasks_sent_);
  ++tasks_sent_;
  if (dp()) fit.privacy = privacy_->Instruction(flush_->privacy);
  fit.deadline_ms =
      static_cast<uint32_t>(std::clamp<int64_t>(options_->round_deadline_ms, 0, UINT32_MAX));
  fit.nonce = task.nonce;
  wire::Message msg = wire::MakeMessage(fit, task.round, "coordinator");
  msg.tensors = wire::ShareAll(global_);
  const Population::Client* c = population_->Find(id);
  Status st =
      c != nullptr ? transport_->Send(c->peer, msg) : absl::NotFoundError("it left the federation");
  last_version_[id] = model_version_;
  flush_->metrics.clients_sampled++;
  if (!st.ok()) {
    spdlog::warn("step {}: cannot send the model to client {}: {}", flush_->number, id,
                 st.message());
    EndTask(id, model_version_, "dropped", absl::StrCat("unreachable: ", st.message()));
    return;
  }
  tasks_[id] = std::move(task);
}

void AsyncRound::OnUploadRequest(const std::string& id, const wire::Message& msg) {
  const transport::PeerId peer = population_->PeerOf(id);
  auto t = tasks_.find(id);
  if (t == tasks_.end() || msg.round != t->second.round ||
      t->second.state != MemberState::kTraining) {
    host_->CountStale();
    host_->Refuse(peer, wire::ErrorCode::kRejected,
                  absl::StrCat("client ", id, " has no pending task of step ", msg.round),
                  msg.round);
    return;
  }
  if (std::get<wire::UploadRequest>(msg.body).nonce != t->second.nonce) {
    if (flush_ != nullptr) flush_->metrics.rejected++;
    host_->Warn("upload requests with a stale nonce", id, [&] {
      return absl::StrCat("client ", id, ": upload request with a stale nonce (step ", msg.round,
                          ")");
    });
    host_->Refuse(peer, wire::ErrorCode::kRejected,
                  absl::StrCat("upload request does not answer the task client ", id,
                               " was last sent (nonce mismatch)"),
                  msg.round);
    return;
  }
  t->second.state = MemberState::kWaitingSlot;
  slots_->Enqueue(id);
  GrantSlots();
}

void AsyncRound::GrantSlots() {
  // None once the flush is full or closed: what arrives then must be kept.
  if (flush_ == nullptr || Full()) return;
  while (std::optional<std::string> next = slots_->NextWaiting()) {
    const std::string id = *next;
    auto t = tasks_.find(id);
    if (t == tasks_.end() || t->second.state != MemberState::kWaitingSlot) continue;
    const transport::PeerId peer = population_->PeerOf(id);
    Status st = transport_->Send(
        peer, wire::MakeMessage(wire::UploadGrant{}, t->second.round, "coordinator"));
    if (!st.ok()) {
      FailMember(id, "unreachable for its upload grant");
      continue;
    }
    t->second.state = MemberState::kUploading;
    slots_->Hold(
        id, peer,
        static_cast<size_t>(TotalElements(layout_)) * sizeof(float) + kResultOverheadBytes);
  }
}

void AsyncRound::OnFitResult(const std::string& id, const wire::Message& msg) {
  const transport::PeerId peer = population_->PeerOf(id);
  auto t = tasks_.find(id);
  if (t == tasks_.end() || t->second.state != MemberState::kUploading ||
      msg.round != t->second.round) {
    if (flush_ != nullptr) flush_->metrics.rejected++;
    host_->Warn("unsolicited results", id, [&] {
      return absl::StrCat("client ", id, ": result of step ", msg.round,
                          " without an upload grant for it");
    });
    host_->Refuse(peer, wire::ErrorCode::kRejected,
                  absl::StrCat("client ", id, " holds no upload grant for step ", msg.round),
                  msg.round);
    return;
  }
  if (flush_ == nullptr || Full()) {
    // Granted before the flush filled or closed: folded into the next one (its slot is still
    // held and no slot is granted meanwhile, so at most upload_slots results wait here).
    kept_.emplace_back(id, msg);
    return;
  }
  const Task task = t->second;
  tasks_.erase(t);
  Accept(id, task, msg);
  GrantSlots();
}

void AsyncRound::Accept(const std::string& id, const Task& task, const wire::Message& msg) {
  const std::optional<int64_t> granted_ms = slots_->HeldSinceMs(id);
  slots_->Release(id);
  Round& flush = *flush_;
  uint64_t staleness = 0;
  double discount = 1;
  int64_t weight = 0;
  Status st = FoldResult(id, task, msg, &staleness, &discount, &weight);
  if (!st.ok()) {
    const bool stale = absl::IsOutOfRange(st);
    (stale ? refused_stale_ : flush.metrics.rejected)++;
    if (!stale && flush.first_rejection.empty()) flush.first_rejection = std::string(st.message());
    if (!stale)
      spdlog::warn("client {}: step {}: update rejected: {}", id, flush.number, st.message());
    host_->Refuse(population_->PeerOf(id),
                  stale ? wire::ErrorCode::kWrongRound : wire::ErrorCode::kInvalidUpdate,
                  std::string(st.message()), task.round);
    EndTask(id, task.model_version, "refused", std::string(st.message()));
    return;
  }
  flush.members[id] = MemberState::kDone;
  flush.outcomes.erase(id);
  if (granted_ms) {
    flush.metrics.upload_seconds.push_back(
        static_cast<double>(std::max<int64_t>(0, clock_->NowMs() - *granted_ms)) / 1000.0);
  }
  const auto& result = std::get<wire::FitResult>(msg.body);
  flush.metrics.results++;
  flush.metrics.examples += weight;
  flush.weighted_loss += result.train_loss * static_cast<double>(weight);
  staleness_sum_ += static_cast<double>(staleness);
  discount_sum_ += discount;
  staleness_max_ = std::max(staleness_max_, static_cast<int64_t>(staleness));
}

Status AsyncRound::FoldResult(const std::string& id, const Task& task, const wire::Message& msg,
                              uint64_t* staleness, double* discount, int64_t* weight) {
  UpdateExpectation want;
  want.round = task.round;
  want.model_version = task.model_version;
  want.nonce = task.nonce;
  want.max_weight = options_->aggregation.max_weight;
  want.layout = &layout_;
  HUDDLE_ASSIGN_OR_RETURN(auto spans, CheckUpdate(msg, want));
  *staleness = model_version_ - task.model_version;
  if (*staleness > static_cast<uint64_t>(options_->async.max_staleness)) {
    return absl::OutOfRangeError(absl::StrCat(
        "update of client ", id, " is ", *staleness, " server steps stale (model version ",
        task.model_version, ", now ", model_version_, "), above async.max_staleness ",
        options_->async.max_staleness));
  }
  *discount = StalenessFactor(options_->async, *staleness);
  const auto& result = std::get<wire::FitResult>(msg.body);
  if (dp()) {
    if (contributions_ != nullptr && !contributions_->MaySend(id, flush_->number)) {
      // Cannot happen (a task is sent only when its result may land in this step or a later
      // one); refused rather than trusted, since the bound is the guarantee.
      return absl::FailedPreconditionError(
          absl::StrCat("client ", id, " may not contribute to step ", flush_->number,
                       " (privacy.max_participations / privacy.min_separation)"));
    }
    *weight = 1;
    HUDDLE_RETURN_IF_ERROR(FoldPrivate(flush_->privacy, spans, result.within_clip, *discount));
    if (contributions_ != nullptr) contributions_->Contributed(id, flush_->number);
    return absl::OkStatus();
  }
  *weight = std::min(static_cast<int64_t>(result.num_examples), weight_cap_);
  HUDDLE_ASSIGN_OR_RETURN(const bool clipped,
                          FoldBounded(std::move(spans), flush_->number, *weight, *discount));
  if (clipped) flush_->metrics.clipped++;
  if (*weight < static_cast<int64_t>(result.num_examples)) flush_->metrics.weight_capped++;
  return absl::OkStatus();
}

void AsyncRound::OnClientError(const std::string& id, const wire::Message& msg) {
  const auto& err = std::get<wire::Error>(msg.body);
  auto t = tasks_.find(id);
  if (t == tasks_.end() || msg.round != t->second.round ||
      t->second.state != MemberState::kTraining) {
    host_->CountStale();
    return;
  }
  const bool declined = err.code == wire::ErrorCode::kRejected;
  if (flush_ != nullptr) (declined ? flush_->metrics.declined : flush_->metrics.failed)++;
  constexpr size_t kMaxText = 300;
  const std::string text =
      err.message.size() > kMaxText ? err.message.substr(0, kMaxText) + "..." : err.message;
  spdlog::warn("client {} {} its task of step {} ({}): {}", id,
               declined ? "declined" : "could not train", msg.round, wire::ErrorCodeName(err.code),
               text);
  const uint64_t version = t->second.model_version;
  tasks_.erase(t);
  slots_->Release(id);
  EndTask(id, version, declined ? "declined" : "failed", text);
  GrantSlots();
}

void AsyncRound::FailMember(const std::string& id, const char* why) {
  auto t = tasks_.find(id);
  if (t == tasks_.end()) return;
  spdlog::warn("client {}: its task of step {} ends: {}", id, t->second.round, why);
  const uint64_t version = t->second.model_version;
  tasks_.erase(t);
  slots_->Release(id);
  EndTask(id, version, "dropped", why);
  GrantSlots();
}

bool AsyncRound::Uploading(const std::string& id) const {
  auto t = tasks_.find(id);
  return t != tasks_.end() && t->second.state == MemberState::kUploading;
}

void AsyncRound::EndTask(const std::string& id, uint64_t task_version, const std::string& outcome,
                         const std::string& why) {
  if (task_version == model_version_) failed_on_version_.insert(id);
  if (flush_ == nullptr) {
    ended_between_.push_back({id, {outcome, why}});
    return;
  }
  // A client that contributed to this flush stays a contributor in its record.
  if (flush_->members.try_emplace(id, MemberState::kFailed).second ||
      flush_->members[id] == MemberState::kFailed) {
    flush_->outcomes[id] = {outcome, why};
  }
}

void AsyncRound::Expire() {
  const int64_t now = clock_->NowMs();
  std::vector<std::pair<std::string, const char*>> ending;
  for (const auto& [id, task] : tasks_) {
    if (now >= task.deadline_ms) {
      ending.emplace_back(id, "missed its deadline (round.deadline_s after its dispatch)");
    } else if (options_->client_timeout_ms > 0 && !population_->Alive(id)) {
      ending.emplace_back(id, "went silent (client_timeout)");
    }
  }
  for (const std::string& id : slots_->Stale()) {
    ending.emplace_back(id, "did not upload within round.upload_timeout_s of its grant");
  }
  for (const auto& [id, why] : ending) {
    // A result kept between flushes is not late: it arrived.
    if (std::any_of(kept_.begin(), kept_.end(), [&](const auto& k) { return k.first == id; })) {
      continue;
    }
    FailMember(id, why);
  }
}

}  // namespace huddle::coordinator
