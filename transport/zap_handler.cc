#include "transport/zap_handler.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <vector>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/logging.h"
#include "transport/rate_limiter.h"

namespace huddle::transport {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";

int64_t NowMs() { return SteadyClock::Get()->NowMs(); }

// "clients'" or "operators'": whose allow-list, in log lines.
const char* ListName(AllowListRole role) {
  return role == AllowListRole::kOperator ? "operators'" : "clients'";
}

AllowListRole OtherRole(AllowListRole role) {
  return role == AllowListRole::kOperator ? AllowListRole::kClient : AllowListRole::kOperator;
}

}  // namespace

StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Start(zmq::context_t& context,
                                                        ZapOptions options) {
  std::unique_ptr<ZapHandler> h(new ZapHandler(std::move(options)));
  {
    const std::string signature = h->CurrentSignature();
    auto list = AllowList::Load(h->options_.allow_list_path, h->options_.role);
    if (!list.ok()) {
      return Status(list.status().code(), absl::StrCat(ListName(h->options_.role),
                                                       " allow-list: ", list.status().message()));
    }
    std::optional<AllowList> conflicting = h->LoadConflicting();
    absl::MutexLock lock(&h->mu_);  // (no other thread yet; the analysis asks for it)
    if (conflicting) h->conflicting_ = *std::move(conflicting);
    h->list_ = std::move(list).value();
    h->DropConflicts(&h->list_);
    h->signature_ = signature;
  }
  if (h->options_.reload_requests != nullptr)
    h->seen_requests_ = h->options_.reload_requests->load();
  h->next_check_ms_ = NowMs() + h->options_.reload_interval_ms;
  auto socket = std::make_shared<zmq::socket_t>();
  try {
    *socket = zmq::socket_t(context, zmq::socket_type::rep);
    socket->set(zmq::sockopt::linger, 0);
    socket->bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    return absl::InternalError(
        absl::StrCat("cannot start the ZAP authentication handler: ", e.what()));
  }
  spdlog::info("{} allow-list '{}': {} enrolled keys", ListName(h->options_.role),
               h->options_.allow_list_path, h->enrolled());
  ZapHandler* self = h.get();
  self->thread_ = std::thread([self, socket] { self->Serve(*socket); });
  return h;
}

ZapHandler::~ZapHandler() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
}

size_t ZapHandler::enrolled() const {
  absl::MutexLock lock(&mu_);
  return list_.size();
}

bool ZapHandler::IsEnrolled(const std::string& id, const std::string& key_z85) const {
  CurveKey key{};
  if (!key_z85.empty()) {
    StatusOr<CurveKey> decoded = DecodeZ85Key(key_z85, kZapKeyProperty);
    if (!decoded.ok()) return false;  // not what this handler attached: not enrolled
    key = *decoded;
  }
  absl::MutexLock lock(&mu_);
  if (key_z85.empty()) return list_.HasId(id);
  return list_.Lookup(key) == id;
}

std::string ZapHandler::CurrentSignature() const {
  std::string signature = AllowList::Signature(options_.allow_list_path);
  if (!options_.conflicting_path.empty()) {
    absl::StrAppend(&signature, "\n", AllowList::Signature(options_.conflicting_path));
  }
  return signature;
}

std::optional<AllowList> ZapHandler::LoadConflicting() const {
  if (options_.conflicting_path.empty()) return std::nullopt;
  // Its bad entries are its own handler's to report; here only its enrolled keys matter.
  std::vector<Status> ignored;
  StatusOr<AllowList> list =
      AllowList::Load(options_.conflicting_path, OtherRole(options_.role), &ignored);
  if (!list.ok()) {
    spdlog::warn(
        "{} allow-list: cannot read the {} allow-list to refuse its keys here ({}); the keys last "
        "read from it stay refused",
        ListName(options_.role), ListName(OtherRole(options_.role)), list.status().message());
    return std::nullopt;
  }
  return *std::move(list);
}

void ZapHandler::DropConflicts(AllowList* list) {
  conflicts_.clear();
  const char* role = RoleName(options_.role);
  const char* other = RoleName(OtherRole(options_.role));
  for (const CurveKey& key : list->Keys()) {
    const std::optional<std::string> other_id = conflicting_.Lookup(key);
    if (!other_id) continue;
    const std::string id = list->Lookup(key).value_or("?");
    const std::string where = list->Source(key).value_or(options_.allow_list_path);
    const std::string other_where = conflicting_.Source(key).value_or(options_.conflicting_path);
    std::string why = absl::StrCat(
        "key ", Fingerprint(key), " is enrolled both as ", role, " '", id, "' (", where,
        ") and as ", other, " '", *other_id, "' (", other_where, "); one key is one role",
        options_.role == AllowListRole::kOperator
            ? ": a client's key never acts as an operator, whatever its file in the operators' "
              "allow-list says"
            : "",
        ", so it is refused here until one of the two files is removed (an operator's own key "
        "comes from `huddle keygen operator`)");
    spdlog::error("{} allow-list: {}", ListName(options_.role), why);
    list->Remove(key);
    conflicts_.emplace(key, std::move(why));
  }
}

std::optional<std::string> ZapHandler::ConflictOf(const CurveKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = conflicts_.find(key);
  if (it == conflicts_.end()) return std::nullopt;
  return it->second;
}

Status ZapHandler::Reload() {
  const std::string signature = CurrentSignature();
  std::vector<Status> skipped;
  StatusOr<AllowList> list = AllowList::Load(options_.allow_list_path, options_.role, &skipped);
  for (const Status& s : skipped) {
    spdlog::error("{} allow-list reload: skipped (not enrolled until fixed): {}",
                  ListName(options_.role), s.message());
  }
  std::optional<AllowList> conflicting = LoadConflicting();
  absl::MutexLock lock(&mu_);
  // Under mu_ until the new list is in place: whoever sees the new generation then asks that list.
  generation_.fetch_add(1, std::memory_order_acq_rel);
  signature_ = signature;  // a broken version is not retried until the files change again
  if (conflicting) conflicting_ = *std::move(conflicting);
  if (!list.ok()) {
    // Fail closed: which keys were removed cannot be known, and keeping the previous list would
    // keep a revoked key admitted.
    spdlog::error(
        "{} allow-list reload failed: {}; refusing every {} key (was {} enrolled, their "
        "connections are cut) until it loads again",
        ListName(options_.role), list.status().message(), RoleName(options_.role), list_.size());
    list_ = AllowList();
    conflicts_.clear();
    return list.status();
  }
  DropConflicts(&*list);
  if (list->size() != list_.size()) {
    spdlog::info("{} allow-list reloaded: {} enrolled keys (was {})", ListName(options_.role),
                 list->size(), list_.size());
  } else {
    spdlog::info("{} allow-list reloaded: {} enrolled keys", ListName(options_.role), list->size());
  }
  list_ = std::move(list).value();
  return skipped.empty() ? absl::OkStatus() : skipped.front();
}

void ZapHandler::MaybeReload(int64_t now_ms) {
  bool requested = false;
  if (options_.reload_requests != nullptr) {
    const uint64_t r = options_.reload_requests->load();
    requested = r != seen_requests_;
    seen_requests_ = r;
  }
  if (!requested && now_ms < next_check_ms_) return;
  next_check_ms_ = now_ms + options_.reload_interval_ms;
  if (!requested) {
    const std::string signature = CurrentSignature();
    absl::MutexLock lock(&mu_);
    if (signature == signature_) return;
  }
  (void)Reload();  // logs its own outcome
}

std::optional<std::string> ZapHandler::RecheckUnknown(const CurveKey& key, int64_t now_ms) {
  if (now_ms - last_recheck_ms_ < options_.unknown_key_recheck_ms) return std::nullopt;
  last_recheck_ms_ = now_ms;
  const std::string signature = CurrentSignature();
  {
    absl::MutexLock lock(&mu_);
    if (signature == signature_) return std::nullopt;
  }
  (void)Reload();  // logs its own outcome
  absl::MutexLock lock(&mu_);
  return list_.Lookup(key);
}

ZapRequest ReadZapRequest(zmq::socket_t& socket) {
  std::vector<zmq::message_t> frames;
  do {
    frames.emplace_back();
    (void)socket.recv(frames.back(), zmq::recv_flags::none);
  } while (frames.back().more() && frames.size() < 16);
  while (frames.back().more()) {  // never from libzmq; drain defensively
    zmq::message_t extra;
    (void)socket.recv(extra, zmq::recv_flags::none);
    if (!extra.more()) break;
  }
  ZapRequest r;
  if (frames.size() > 1) r.request_id = frames[1].to_string();
  if (frames.size() < 7 || frames[0].to_string() != "1.0") return r;
  r.well_formed = true;
  r.address = frames[3].to_string();
  r.mechanism = frames[5].to_string();
  if (r.mechanism == "CURVE" && frames[6].size() == sizeof(CurveKey)) {
    CurveKey key;
    std::memcpy(key.data(), frames[6].data(), key.size());
    r.curve_key = key;
  }
  return r;
}

void OpenJobKeyGate(zmq::context_t& context, zmq::socket_t* zap, zmq::socket_t& router,
                    const std::string& secret_z85, const char* domain, int timeout_ms) {
  *zap = zmq::socket_t(context, zmq::socket_type::rep);
  zap->set(zmq::sockopt::linger, 0);
  zap->set(zmq::sockopt::rcvtimeo, timeout_ms);
  zap->set(zmq::sockopt::sndtimeo, timeout_ms);
  zap->bind("inproc://zeromq.zap.01");
  router.set(zmq::sockopt::curve_server, 1);
  router.set(zmq::sockopt::curve_secretkey, secret_z85);
  router.set(zmq::sockopt::zap_domain, domain);
}

bool AnswerJobKeyZap(zmq::socket_t& zap, const CurveKey& job_key) {
  const ZapRequest request = ReadZapRequest(zap);
  const bool admit = request.curve_key == job_key;
  SendZapReply(zap, request, admit, admit ? "OK" : "not a rank of this job", "rank");
  return admit;
}

void SendZapReply(zmq::socket_t& socket, const ZapRequest& request, bool admit,
                  const std::string& text, const std::string& user_id, bool retry_later) {
  socket.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
  socket.send(zmq::buffer(request.request_id), zmq::send_flags::sndmore);
  socket.send(zmq::buffer(admit         ? std::string("200")
                          : retry_later ? std::to_string(kZapRetryLater)
                                        : std::string("400")),
              zmq::send_flags::sndmore);
  socket.send(zmq::buffer(text), zmq::send_flags::sndmore);
  socket.send(zmq::buffer(admit ? user_id : std::string()), zmq::send_flags::sndmore);
  // Metadata (ZMTP's property encoding): the admitted key, for the transport's revocation checks.
  std::string metadata;
  if (admit && request.curve_key) {
    const std::string name = kZapKeyProperty;
    const std::string value = EncodeZ85Key(*request.curve_key);
    metadata.push_back(static_cast<char>(name.size()));
    metadata += name;
    for (int shift = 24; shift >= 0; shift -= 8) {
      metadata.push_back(static_cast<char>((value.size() >> shift) & 0xff));
    }
    metadata += value;
  }
  socket.send(zmq::buffer(metadata), zmq::send_flags::none);
}

void ZapHandler::Serve(zmq::socket_t& socket) {
  // Refusals are counted exactly (rejections_); the log gets one line per kind per period.
  LogSummary not_enrolled("refused handshakes (key not enrolled)", options_.log_period_ms);
  LogSummary plaintext("refused handshakes (no encryption)", options_.log_period_ms);
  LogSummary throttled("refused handshakes (too many from one key)", options_.log_period_ms);
  LogSummary both_roles("refused handshakes (key enrolled in both allow-lists)",
                        options_.log_period_ms);
  RateLimiter handshakes(options_.handshakes_per_s, options_.handshake_burst);
  while (!stopping_.load()) {
    const int64_t now = NowMs();
    MaybeReload(now);
    not_enrolled.Flush(now);
    plaintext.Flush(now);
    throttled.Flush(now);
    both_roles.Flush(now);
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(200));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      const ZapRequest request = ReadZapRequest(socket);
      if (!request.well_formed) {
        rejections_++;
        SendZapReply(socket, request, false, "malformed ZAP request", "");
        continue;
      }
      if (!request.curve_key) {
        rejections_++;
        plaintext.Add(NowMs(), request.address, [&] {
          return fmt::format(
              "refused a {} handshake from {}: encryption is required ({} refusals so far)",
              request.mechanism, request.address, rejections_.load());
        });
        SendZapReply(socket, request, false, "only CURVE with a 32-byte key is accepted", "");
        continue;
      }
      std::optional<std::string> id;
      {
        absl::MutexLock lock(&mu_);
        id = list_.Lookup(*request.curve_key);
      }
      if (!id) id = RecheckUnknown(*request.curve_key, NowMs());
      if (!id) {
        rejections_++;
        const std::string fp = Fingerprint(*request.curve_key);
        if (std::optional<std::string> conflict = ConflictOf(*request.curve_key)) {
          both_roles.Add(NowMs(), fp, [&] {
            return fmt::format("refused a handshake from {}: {}; {} refusals so far",
                               request.address, *conflict, rejections_.load());
          });
        } else {
          not_enrolled.Add(NowMs(), fp, [&] {
            return fmt::format(
                "refused a handshake from {}: key {} is not enrolled (not in the {} allow-list, or "
                "revoked); {} refusals so far",
                request.address, fp, ListName(options_.role), rejections_.load());
          });
        }
      }
      if (id && !handshakes.Admit(*id, NowMs())) {
        rejections_++;
        throttled_++;
        throttled.Add(NowMs(), *id, [&] {
          return fmt::format(
              "refused a handshake of {} '{}' from {} for now: over {} handshakes/s (burst "
              "{}) from its key; it may retry ({} throttled so far)",
              RoleName(options_.role), *id, request.address, options_.handshakes_per_s,
              options_.handshake_burst, throttled_.load());
        });
        SendZapReply(socket, request, false, "too many handshakes from this key; retry later", "",
                     /*retry_later=*/true);
        continue;
      }
      SendZapReply(socket, request, id.has_value(),
                   id                                          ? "OK"
                   : options_.role == AllowListRole::kOperator ? "not an enrolled operator key"
                                                               : "client key is not enrolled",
                   id.value_or(""));
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      if (e.num() != EINTR) spdlog::error("ZAP handler: {}", e.what());
    }
  }
}

}  // namespace huddle::transport
