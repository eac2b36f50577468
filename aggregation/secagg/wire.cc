#include "aggregation/secagg/wire.h"

#include <algorithm>
#include <cstring>

namespace huddle::aggregation::secagg {

namespace {

constexpr size_t kMaxCiphertextBytes = 256;
constexpr size_t kMaxIdBytes = 128;

class Writer {
 public:
  Writer& U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Writer& U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  template <size_t N>
  Writer& Fixed(const std::array<uint8_t, N>& a) {
    out_.append(reinterpret_cast<const char*>(a.data()), N);
    return *this;
  }
  Writer& Bytes(std::span<const uint8_t> b) {
    U32(static_cast<uint32_t>(b.size()));
    out_.append(reinterpret_cast<const char*>(b.data()), b.size());
    return *this;
  }
  Writer& Text(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    out_ += s;
    return *this;
  }
  Writer& Set(const std::vector<uint32_t>& v) {
    U32(static_cast<uint32_t>(v.size()));
    for (uint32_t x : v) U32(x);
    return *this;
  }
  Writer& ShareValue(const Share& s) {
    for (uint64_t y : s.y) U64(y);
    return *this;
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads what Writer wrote; every read checks what remains, every count its bound.
class Reader {
 public:
  Reader(std::span<const std::byte> in, const char* what) : in_(in), what_(what) {}

  Status U32(uint32_t* v, const char* field) {
    HUDDLE_RETURN_IF_ERROR(Need(4, field));
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= static_cast<uint32_t>(in_[at_++]) << (8 * i);
    return absl::OkStatus();
  }
  Status U64(uint64_t* v, const char* field) {
    HUDDLE_RETURN_IF_ERROR(Need(8, field));
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= static_cast<uint64_t>(in_[at_++]) << (8 * i);
    return absl::OkStatus();
  }
  template <size_t N>
  Status Fixed(std::array<uint8_t, N>* a, const char* field) {
    HUDDLE_RETURN_IF_ERROR(Need(N, field));
    std::memcpy(a->data(), in_.data() + at_, N);
    at_ += N;
    return absl::OkStatus();
  }
  Status Count(uint32_t* n, uint64_t max, const char* field) {
    HUDDLE_RETURN_IF_ERROR(U32(n, field));
    if (*n > max) return Bad(absl::StrCat(field, " count ", *n, " exceeds ", max));
    return absl::OkStatus();
  }
  // A count of list entries of at least `entry_bytes` each: within `max` and within what remains,
  // so that a few bytes cannot make the caller allocate `max` entries.
  Status Entries(uint32_t* n, uint64_t max, uint64_t entry_bytes, const char* field) {
    HUDDLE_RETURN_IF_ERROR(Count(n, max, field));
    return Need(uint64_t{*n} * entry_bytes, field);
  }
  Status Bytes(std::vector<uint8_t>* b, size_t max, const char* field) {
    uint32_t n = 0;
    HUDDLE_RETURN_IF_ERROR(Count(&n, max, field));
    HUDDLE_RETURN_IF_ERROR(Need(n, field));
    const auto* p = reinterpret_cast<const uint8_t*>(in_.data()) + at_;
    b->assign(p, p + n);
    at_ += n;
    return absl::OkStatus();
  }
  Status Text(std::string* s, size_t max, const char* field) {
    uint32_t n = 0;
    HUDDLE_RETURN_IF_ERROR(Count(&n, max, field));
    HUDDLE_RETURN_IF_ERROR(Need(n, field));
    s->assign(reinterpret_cast<const char*>(in_.data()) + at_, n);
    at_ += n;
    return absl::OkStatus();
  }
  Status Set(std::vector<uint32_t>* v, uint64_t max, const char* field) {
    uint32_t n = 0;
    HUDDLE_RETURN_IF_ERROR(Count(&n, max, field));
    HUDDLE_RETURN_IF_ERROR(Need(uint64_t{n} * 4, field));
    v->resize(n);
    for (uint32_t& x : *v) HUDDLE_RETURN_IF_ERROR(U32(&x, field));
    return absl::OkStatus();
  }
  Status ShareValue(Share* s, const char* field) {
    for (uint64_t& y : s->y) {
      HUDDLE_RETURN_IF_ERROR(U64(&y, field));
      if (y >= kFieldPrime) return Bad(absl::StrCat(field, " holds a value outside the field"));
    }
    return absl::OkStatus();
  }
  Status End() {
    if (at_ != in_.size()) return Bad(absl::StrCat(in_.size() - at_, " trailing bytes"));
    return absl::OkStatus();
  }
  Status Bad(std::string why) const {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed secure-aggregation ", what_, ": ", why));
  }

 private:
  Status Need(uint64_t n, const char* field) const {
    if (n > in_.size() - at_) {
      return Bad(absl::StrCat(field, " needs ", n, " bytes; ", in_.size() - at_, " remain"));
    }
    return absl::OkStatus();
  }
  std::span<const std::byte> in_;
  const char* what_;
  size_t at_ = 0;
};

void Put(Writer& w, const Advertisement& a) {
  w.Fixed(a.cipher_key).Fixed(a.mask_key).Fixed(a.seed_commitment);
}
Status Get(Reader& r, Advertisement* a) {
  HUDDLE_RETURN_IF_ERROR(r.Fixed(&a->cipher_key, "cipher key"));
  HUDDLE_RETURN_IF_ERROR(r.Fixed(&a->mask_key, "mask key"));
  return r.Fixed(&a->seed_commitment, "seed commitment");
}

void Put(Writer& w, const ShareRecord& s) {
  w.U32(s.peer)
      .Bytes(s.ciphertext)
      .Fixed(s.self_mask_hash)
      .Fixed(s.mask_key_hash)
      .Fixed(s.self_mask_commitment)
      .Fixed(s.signature);
}
Status Get(Reader& r, ShareRecord* s) {
  HUDDLE_RETURN_IF_ERROR(r.U32(&s->peer, "share peer"));
  HUDDLE_RETURN_IF_ERROR(r.Bytes(&s->ciphertext, kMaxCiphertextBytes, "share ciphertext"));
  HUDDLE_RETURN_IF_ERROR(r.Fixed(&s->self_mask_hash, "self-mask share hash"));
  HUDDLE_RETURN_IF_ERROR(r.Fixed(&s->mask_key_hash, "mask-key share hash"));
  HUDDLE_RETURN_IF_ERROR(r.Fixed(&s->self_mask_commitment, "self-mask commitment"));
  return r.Fixed(&s->signature, "share signature");
}

void PutRecords(Writer& w, const std::vector<ShareRecord>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (const ShareRecord& s : v) Put(w, s);
}
Status GetRecords(Reader& r, std::vector<ShareRecord>* v) {
  uint32_t n = 0;
  HUDDLE_RETURN_IF_ERROR(r.Entries(&n, kMaxNeighbours, 4 + 4 + 3 * 32 + 64, "share records"));
  v->resize(n);
  for (ShareRecord& s : *v) HUDDLE_RETURN_IF_ERROR(Get(r, &s));
  return absl::OkStatus();
}

void PutRevealed(Writer& w, const std::vector<RevealedShare>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (const RevealedShare& s : v) w.U32(s.owner).ShareValue(s.share);
}
// The share's point is the sender's: the caller sets it.
Status GetRevealed(Reader& r, std::vector<RevealedShare>* v) {
  uint32_t n = 0;
  HUDDLE_RETURN_IF_ERROR(r.Entries(&n, kMaxNeighbours, 4 + 8 * kSecretLimbs, "revealed shares"));
  v->resize(n);
  for (RevealedShare& s : *v) {
    HUDDLE_RETURN_IF_ERROR(r.U32(&s.owner, "revealed share owner"));
    HUDDLE_RETURN_IF_ERROR(r.ShareValue(&s.share, "revealed share"));
  }
  return absl::OkStatus();
}

template <class T>
StatusOr<T> DecodeWith(std::span<const std::byte> bytes, const char* what,
                       Status (*get)(Reader&, T*)) {
  Reader r(bytes, what);
  T out;
  HUDDLE_RETURN_IF_ERROR(get(r, &out));
  HUDDLE_RETURN_IF_ERROR(r.End());
  return out;
}

Status GetMemberList(Reader& r, MemberList* m) {
  uint32_t n = 0;
  HUDDLE_RETURN_IF_ERROR(r.Entries(&n, kMaxMembers, 4 + 4 + 32 + 32 + 8 + 64 + 3 * 32, "members"));
  m->members.resize(n);
  for (ListedMember& l : m->members) {
    HUDDLE_RETURN_IF_ERROR(r.U32(&l.cohort_index, "cohort index"));
    MemberCertificate& c = l.certificate;
    HUDDLE_RETURN_IF_ERROR(r.Text(&c.id, kMaxIdBytes, "client id"));
    if (!wire::IsValidClientId(c.id)) return r.Bad("a client id is not 1-128 of [A-Za-z0-9._-]");
    HUDDLE_RETURN_IF_ERROR(r.Fixed(&c.transport_key, "transport key"));
    HUDDLE_RETURN_IF_ERROR(r.Fixed(&c.signing_key, "signing key"));
    HUDDLE_RETURN_IF_ERROR(r.U64(&c.not_after, "certificate expiry"));
    HUDDLE_RETURN_IF_ERROR(r.Fixed(&c.signature, "certificate signature"));
    HUDDLE_RETURN_IF_ERROR(Get(r, &l.keys));
  }
  return absl::OkStatus();
}
Status GetAdvertisement(Reader& r, Advertisement* a) { return Get(r, a); }
Status GetReveal(Reader& r, Reveal* m) {
  HUDDLE_RETURN_IF_ERROR(r.Fixed(&m->seed, "seed"));
  return r.Fixed(&m->signature, "reveal signature");
}
Status GetSeedList(Reader& r, SeedList* m) {
  uint32_t n = 0;
  HUDDLE_RETURN_IF_ERROR(r.Entries(&n, kMaxMembers, 32 + 64, "reveals"));
  m->reveals.resize(n);
  for (Reveal& v : m->reveals) HUDDLE_RETURN_IF_ERROR(GetReveal(r, &v));
  return absl::OkStatus();
}
Status GetShareKeys(Reader& r, ShareKeys* m) {
  HUDDLE_RETURN_IF_ERROR(r.Fixed(&m->self_mask_commitment, "self-mask commitment"));
  return GetRecords(r, &m->shares);
}
Status GetShareList(Reader& r, ShareList* m) { return GetRecords(r, &m->shares); }
Status GetVerdict(Reader& r, Verdict* m) {
  uint32_t n = 0;
  HUDDLE_RETURN_IF_ERROR(r.Entries(&n, kMaxNeighbours, 4 + 4, "complaints"));
  m->complaints.resize(n);
  for (ComplaintRecord& c : m->complaints) {
    uint32_t reason = 0;
    HUDDLE_RETURN_IF_ERROR(r.U32(&c.peer, "complaint peer"));
    HUDDLE_RETURN_IF_ERROR(r.U32(&reason, "complaint reason"));
    if (reason < 1 || reason > 4) return r.Bad(absl::StrCat("complaint reason ", reason));
    c.reason = static_cast<Complaint>(reason);
  }
  return absl::OkStatus();
}
Status GetMask(Reader& r, MaskRequest* m) { return r.Set(&m->shared, kMaxMembers, "shared"); }
Status GetSurvivors(Reader& r, Survivors* m) {
  HUDDLE_RETURN_IF_ERROR(r.Set(&m->shared, kMaxMembers, "shared"));
  return r.Set(&m->survivors, kMaxMembers, "survivors");
}
Status GetConsistency(Reader& r, Consistency* m) {
  return r.Fixed(&m->signature, "consistency signature");
}
Status GetUnmask(Reader& r, UnmaskRequest* m) {
  uint32_t n = 0;
  HUDDLE_RETURN_IF_ERROR(r.Entries(&n, kMaxMembers, 4 + 64, "signatures"));
  m->signatures.resize(n);
  for (SignedBy& s : m->signatures) {
    HUDDLE_RETURN_IF_ERROR(r.U32(&s.member, "signer"));
    HUDDLE_RETURN_IF_ERROR(r.Fixed(&s.signature, "signature"));
  }
  return absl::OkStatus();
}
Status GetUnmaskResponse(Reader& r, UnmaskResponse* m) {
  HUDDLE_RETURN_IF_ERROR(GetRevealed(r, &m->self_mask_shares));
  return GetRevealed(r, &m->mask_key_shares);
}

template <size_t N>
std::string Bytes(const std::array<uint8_t, N>& a) {
  return std::string(reinterpret_cast<const char*>(a.data()), a.size());
}

}  // namespace

const char* StageName(Stage stage) {
  switch (stage) {
    case Stage::kAdvertise:
      return "advertise";
    case Stage::kMemberList:
      return "member list";
    case Stage::kReveal:
      return "reveal";
    case Stage::kSeeds:
      return "seed list";
    case Stage::kShares:
      return "shares";
    case Stage::kShareList:
      return "share list";
    case Stage::kVerdict:
      return "verdict";
    case Stage::kMask:
      return "mask request";
    case Stage::kSurvivors:
      return "survivor sets";
    case Stage::kConsistency:
      return "consistency signature";
    case Stage::kUnmask:
      return "unmask request";
    case Stage::kUnmaskResponse:
      return "unmask response";
  }
  return "unknown stage";
}

bool IsStage(uint32_t stage) { return stage >= 1 && stage <= 12; }

bool FromMember(uint32_t stage) {
  switch (static_cast<Stage>(stage)) {
    case Stage::kAdvertise:
    case Stage::kReveal:
    case Stage::kShares:
    case Stage::kVerdict:
    case Stage::kConsistency:
    case Stage::kUnmaskResponse:
      return true;
    default:
      return false;
  }
}

std::string Encode(const Advertisement& m) {
  Writer w;
  Put(w, m);
  return w.Take();
}
std::string Encode(const MemberList& m) {
  Writer w;
  w.U32(static_cast<uint32_t>(m.members.size()));
  for (const ListedMember& l : m.members) {
    const MemberCertificate& c = l.certificate;
    w.U32(l.cohort_index)
        .Text(c.id)
        .Fixed(c.transport_key)
        .Fixed(c.signing_key)
        .U64(c.not_after)
        .Fixed(c.signature);
    Put(w, l.keys);
  }
  return w.Take();
}
std::string Encode(const Reveal& m) { return Writer().Fixed(m.seed).Fixed(m.signature).Take(); }
std::string Encode(const SeedList& m) {
  Writer w;
  w.U32(static_cast<uint32_t>(m.reveals.size()));
  for (const Reveal& r : m.reveals) w.Fixed(r.seed).Fixed(r.signature);
  return w.Take();
}
std::string Encode(const ShareKeys& m) {
  Writer w;
  w.Fixed(m.self_mask_commitment);
  PutRecords(w, m.shares);
  return w.Take();
}
std::string Encode(const ShareList& m) {
  Writer w;
  PutRecords(w, m.shares);
  return w.Take();
}
std::string Encode(const Verdict& m) {
  Writer w;
  w.U32(static_cast<uint32_t>(m.complaints.size()));
  for (const ComplaintRecord& c : m.complaints) w.U32(c.peer).U32(static_cast<uint32_t>(c.reason));
  return w.Take();
}
std::string Encode(const MaskRequest& m) { return Writer().Set(m.shared).Take(); }
std::string Encode(const Survivors& m) { return Writer().Set(m.shared).Set(m.survivors).Take(); }
std::string Encode(const Consistency& m) { return Writer().Fixed(m.signature).Take(); }
std::string Encode(const UnmaskRequest& m) {
  Writer w;
  w.U32(static_cast<uint32_t>(m.signatures.size()));
  for (const SignedBy& s : m.signatures) w.U32(s.member).Fixed(s.signature);
  return w.Take();
}
std::string Encode(const UnmaskResponse& m) {
  Writer w;
  PutRevealed(w, m.self_mask_shares);
  PutRevealed(w, m.mask_key_shares);
  return w.Take();
}

#define HUDDLE_SECAGG_MESSAGE(T, stage, what, get)          \
  template <>                                               \
  StatusOr<T> Decode<T>(std::span<const std::byte> bytes) { \
    return DecodeWith<T>(bytes, what, get);                 \
  }                                                         \
  template <>                                               \
  Stage StageOf<T>() {                                      \
    return stage;                                           \
  }
HUDDLE_SECAGG_MESSAGE(Advertisement, Stage::kAdvertise, "advertisement", GetAdvertisement)
HUDDLE_SECAGG_MESSAGE(MemberList, Stage::kMemberList, "member list", GetMemberList)
HUDDLE_SECAGG_MESSAGE(Reveal, Stage::kReveal, "reveal", GetReveal)
HUDDLE_SECAGG_MESSAGE(SeedList, Stage::kSeeds, "seed list", GetSeedList)
HUDDLE_SECAGG_MESSAGE(ShareKeys, Stage::kShares, "share message", GetShareKeys)
HUDDLE_SECAGG_MESSAGE(ShareList, Stage::kShareList, "share list", GetShareList)
HUDDLE_SECAGG_MESSAGE(Verdict, Stage::kVerdict, "verdict", GetVerdict)
HUDDLE_SECAGG_MESSAGE(MaskRequest, Stage::kMask, "mask request", GetMask)
HUDDLE_SECAGG_MESSAGE(Survivors, Stage::kSurvivors, "survivor sets", GetSurvivors)
HUDDLE_SECAGG_MESSAGE(Consistency, Stage::kConsistency, "consistency signature", GetConsistency)
HUDDLE_SECAGG_MESSAGE(UnmaskRequest, Stage::kUnmask, "unmask request", GetUnmask)
HUDDLE_SECAGG_MESSAGE(UnmaskResponse, Stage::kUnmaskResponse, "unmask response", GetUnmaskResponse)
#undef HUDDLE_SECAGG_MESSAGE

wire::Message ToMessage(Stage stage, std::shared_ptr<const std::string> bytes, uint64_t round,
                        const std::string& sender, const std::string& nonce) {
  wire::Message msg =
      wire::MakeMessage(wire::SecAggData{static_cast<uint32_t>(stage), nonce}, round, sender);
  wire::TensorPayload p;
  p.spec = TensorSpec{kPayloadName, DType::kUint8, {static_cast<int64_t>(bytes->size())}};
  p.bytes = std::as_bytes(std::span(bytes->data(), bytes->size()));
  p.owner = std::move(bytes);
  msg.tensors.push_back(std::move(p));
  return msg;
}

StatusOr<std::span<const std::byte>> PayloadOf(const wire::Message& msg) {
  if (msg.type() != wire::MessageType::kSecAggData || msg.tensors.size() != 1 ||
      msg.tensors[0].spec.name != kPayloadName || msg.tensors[0].spec.dtype != DType::kUint8) {
    return absl::InvalidArgumentError(
        "a secure-aggregation message carries exactly one uint8 frame named 'secagg'");
  }
  return msg.tensors[0].bytes;
}

StatusOr<SessionConfig> SessionFromWire(const wire::SecureAggregation& a) {
  if (a.session.size() != SessionId{}.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: a session id of ", a.session.size(), " bytes"));
  }
  SessionConfig c;
  std::memcpy(c.session.data(), a.session.data(), c.session.size());
  c.members = a.members;
  c.threshold = a.threshold;
  c.edge_threshold = a.edge_threshold;
  c.min_survivors = a.min_survivors;
  c.bits = static_cast<int>(a.bits);
  c.length = a.length;
  c.scale_exponent = a.scale_exponent;
  c.noise_variance = a.noise_variance;
  c.weight_cap = a.weight_cap;
  c.clip_norm = a.clip_norm;
  return c;
}

wire::SecureAggregation SessionToWire(const SessionConfig& c, uint32_t index) {
  wire::SecureAggregation a;
  a.session = Bytes(c.session);
  a.index = index;
  a.members = c.members;
  a.threshold = c.threshold;
  a.edge_threshold = c.edge_threshold;
  a.min_survivors = c.min_survivors;
  a.bits = static_cast<uint32_t>(c.bits);
  a.length = c.length;
  a.scale_exponent = c.scale_exponent;
  a.noise_variance = c.noise_variance;
  a.weight_cap = c.weight_cap;
  a.clip_norm = c.clip_norm;
  return a;
}

}  // namespace huddle::aggregation::secagg
