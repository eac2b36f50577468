// A member's side of secure aggregation (protocol.h: stages A-G). Every check here is the
// member's own: it trusts the coordinator with nothing but relaying messages.
#include <sodium.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "aggregation/secagg/internal.h"
#include "aggregation/secagg/protocol.h"
#include "common/secure_random.h"

namespace huddle::aggregation::secagg {

using internal::AgreementContext;
using internal::Contains;
using internal::kMaskPurpose;
using internal::kSealedShareBytes;
using internal::kShareKeyPurpose;
using internal::MaskSign;
using internal::ModulusMask;
using internal::SortedSetBelow;

namespace {

uint64_t SystemNowUnix() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

Status OutOfOrder(const char* what) {
  return absl::FailedPreconditionError(
      absl::StrCat("secure aggregation: ", what, " is out of order in this session"));
}

}  // namespace

Client::Client(const SessionConfig& config, uint32_t cohort_index, std::string id,
               SigningKey identity, MemberPolicy policy)
    : config_(config),
      cohort_index_(cohort_index),
      id_(std::move(id)),
      identity_(std::move(identity)),
      policy_(std::move(policy)),
      cipher_(KeyPair::Generate()),
      mask_(KeyPair::Generate()) {
  EnsureSodium();
  randombytes_buf(seed_.data(), seed_.size());
  if (!policy_.now_unix) policy_.now_unix = SystemNowUnix;
}

Client::~Client() {
  sodium_memzero(self_mask_seed_.data(), self_mask_seed_.size());
  sodium_memzero(seed_.data(), seed_.size());
  for (auto& [peer, shares] : held_) sodium_memzero(&shares, sizeof shares);
}

StatusOr<Client> Client::Create(const SessionConfig& config, uint32_t cohort_index, std::string id,
                                SigningKey identity, MemberPolicy policy) {
  HUDDLE_RETURN_IF_ERROR(internal::CheckConfig(config));
  if (cohort_index >= config.members) {
    return absl::InvalidArgumentError(
        absl::StrCat("member index ", cohort_index, " of ", config.members, " members"));
  }
  if (!(policy.corrupt_fraction >= 0 && policy.corrupt_fraction < 0.5) ||
      policy.security_bits < 8 || policy.security_bits > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secure aggregation policy: corrupt_fraction ", policy.corrupt_fraction,
        " must be in [0, 0.5) and security_bits ", policy.security_bits, " in [8, 128]"));
  }
  return Client(config, cohort_index, std::move(id), std::move(identity), std::move(policy));
}

bool Client::Verify(const SigningPublicKey& key, std::span<const uint8_t> message,
                    const Signature& signature) const {
  return policy_.cache != nullptr ? policy_.cache->Verify(key, message, signature)
                                  : VerifySignature(key, message, signature);
}

Advertisement Client::Advertise() const {
  return {cipher_.public_key(), mask_.public_key(), SeedCommitment(config_.session, seed_)};
}

StatusOr<Reveal> Client::OnMemberList(const MemberList& list) {
  if (stage_ != Stage::kAdvertised) return OutOfOrder("a member list");
  const auto n = static_cast<int64_t>(list.members.size());
  if (n < 2 || n > config_.members) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: a member list of ", n,
                                                   " for a session of ", config_.members));
  }
  if (n < config_.min_survivors) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure aggregation: ", n, " members listed, fewer than the session's ",
                     "minimum of ", config_.min_survivors, " survivors"));
  }
  const uint64_t now = policy_.now_unix();
  std::set<std::string> ids;
  std::set<SigningPublicKey> signers;
  std::set<TransportPublicKey> transports;
  std::optional<uint32_t> self;
  for (uint32_t i = 0; i < list.members.size(); ++i) {
    const ListedMember& m = list.members[i];
    const MemberCertificate& cert = m.certificate;
    if (m.cohort_index >= config_.members ||
        (i > 0 && m.cohort_index <= list.members[i - 1].cohort_index)) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: the member list is not in cohort order at entry ", i));
    }
    // The certificate: the project's signature (verified once per key and message when a cache
    // is shared), and not expired.
    if (!Verify(policy_.project_key, CertificateMessage(cert), cert.signature)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "secure aggregation: member ", i, " ('", cert.id.substr(0, 128),
          "') has no valid certificate from the project key ",
          SigningFingerprint(policy_.project_key), ": a member the project did not enrol"));
    }
    if (cert.not_after != 0 && now > cert.not_after) {
      return absl::PermissionDeniedError(absl::StrCat("secure aggregation: member ", i, " ('",
                                                      cert.id, "')'s certificate expired at ",
                                                      cert.not_after, " (now ", now, ")"));
    }
    if (!ids.insert(cert.id).second || !signers.insert(cert.signing_key).second ||
        !transports.insert(cert.transport_key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: member ", i, " ('", cert.id,
                       "') repeats another's id or key: one enrolled client, one member"));
    }
    if (cert.signing_key == identity_.public_key()) self = i;
  }
  if (!self) {
    return absl::InvalidArgumentError(
        "secure aggregation: the member list does not hold this member");
  }
  const ListedMember& mine = list.members[*self];
  if (mine.certificate.id != id_ || mine.cohort_index != cohort_index_ ||
      !(mine.keys == Advertise())) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: the member list holds this member (", id_,
                     ") with another id, index or keys than it advertised"));
  }
  // The session against this member's own assumptions: the threshold, the graph and the minimum
  // must hold against the colluders it counts, whatever the coordinator assumed.
  SessionGuarantee g;
  g.members = n;
  g.colluders = Colluders(policy_.corrupt_fraction, n);
  g.quorum = ConsistencyQuorum(n, g.colluders);
  HUDDLE_ASSIGN_OR_RETURN(
      Isolation iso, IsolationBound(n, config_.edge_threshold, static_cast<int>(config_.threshold),
                                    g.colluders, config_.min_survivors, policy_.security_bits));
  g.cut = iso.cut;
  g.failure_bits = iso.failure_bits;
  g.honest_shares = static_cast<int64_t>(config_.min_survivors) - g.colluders - g.cut;
  if (iso.failure_bits < policy_.security_bits || g.honest_shares < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation: this member's policy refuses the session: against ", g.colluders,
        " colluders of ", n, " (corrupt_fraction ", policy_.corrupt_fraction, ") its threshold ",
        config_.threshold, ", expected degree ",
        EdgeProbability(config_.edge_threshold) * static_cast<double>(n - 1), " and minimum ",
        config_.min_survivors, " fail with probability 2^-", iso.failure_bits, " (at most 2^-",
        policy_.security_bits, " allowed) and guarantee ", g.honest_shares,
        " honest inputs in a sum (at least 1)"));
  }
  guarantee_ = g;
  index_ = *self;
  members_ = n;
  list_digest_ = MemberListDigest(config_, list);
  signing_keys_.reserve(static_cast<size_t>(n));
  commitments_.reserve(static_cast<size_t>(n));
  keys_.reserve(static_cast<size_t>(n));
  for (const ListedMember& m : list.members) {
    signing_keys_.push_back(m.certificate.signing_key);
    commitments_.push_back(m.keys.seed_commitment);
    keys_.emplace_back(m.keys.cipher_key, m.keys.mask_key);
  }
  stage_ = Stage::kRevealed;
  Reveal r;
  r.seed = seed_;
  r.signature = identity_.Sign(RevealMessage(config_.session, list_digest_, index_, seed_));
  return r;
}

StatusOr<ShareKeys> Client::OnSeeds(const SeedList& seeds) {
  if (stage_ != Stage::kRevealed) return OutOfOrder("a seed list");
  if (static_cast<int64_t>(seeds.reveals.size()) != members_) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: ", seeds.reveals.size(),
                                                   " reveals for ", members_, " members"));
  }
  // Every member signed the same H(L): so every member saw this list, and the seed below is the
  // same for all. Each reveal opens the commitment made before anyone's was known.
  for (uint32_t j = 0; j < seeds.reveals.size(); ++j) {
    const Reveal& r = seeds.reveals[j];
    if (SeedCommitment(config_.session, r.seed) != commitments_[j] ||
        !Verify(signing_keys_[j], RevealMessage(config_.session, list_digest_, j, r.seed),
                r.signature)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "secure aggregation: member ", j,
          "'s reveal does not open its commitment or is not its signature over this member "
          "list: nothing shared"));
    }
  }
  commitments_.clear();
  commitments_.shrink_to_fit();
  const GraphSeed joint = JointSeed(config_.session, list_digest_, seeds);
  HUDDLE_ASSIGN_OR_RETURN(neighbours_, Neighbours(joint, members_, config_.edge_threshold, index_));
  const int t = static_cast<int>(config_.threshold);
  if (static_cast<int64_t>(neighbours_.size()) < t ||
      static_cast<int64_t>(neighbours_.size()) > kMaxNeighbours) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation: this member has ", neighbours_.size(),
        " neighbours in the session's graph: its secrets need ", t, " to ", kMaxNeighbours));
  }
  // Keep only the neighbours' keys (the only ones this member agrees keys with: checked here,
  // not all n of them).
  std::vector<std::pair<PublicKey, PublicKey>> theirs;
  theirs.reserve(neighbours_.size());
  for (uint32_t j : neighbours_) {
    if (IsSmallOrder(keys_[j].first) || IsSmallOrder(keys_[j].second)) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: neighbour ", j, " lists a small-order key"));
    }
    theirs.push_back(keys_[j]);
  }
  keys_ = std::move(theirs);

  EnsureSodium();
  randombytes_buf(self_mask_seed_.data(), self_mask_seed_.size());
  std::vector<uint64_t> points;
  for (uint32_t peer : neighbours_) points.push_back(SharePoint(peer));
  HUDDLE_ASSIGN_OR_RETURN(std::vector<Share> self_mask, Split(self_mask_seed_, t, points));
  HUDDLE_ASSIGN_OR_RETURN(std::vector<Share> mask_key, Split(mask_.secret_key(), t, points));
  const std::vector<uint8_t> context = AgreementContext(config_.session, list_digest_);
  ShareKeys out;
  out.self_mask_commitment = Hash(self_mask_seed_);
  for (size_t s = 0; s < neighbours_.size(); ++s) {
    const uint32_t peer = neighbours_[s];
    HUDDLE_ASSIGN_OR_RETURN(Secret key,
                            AgreeKey(cipher_, keys_[s].first, kShareKeyPurpose, context));
    std::vector<uint8_t> plaintext = internal::EncodeShares(self_mask[s], mask_key[s]);
    ShareRecord r;
    r.peer = peer;
    r.ciphertext = Seal(key, plaintext, ShareAssociatedData(config_.session, index_, peer));
    r.self_mask_hash = ShareHash(config_.session, true, index_, peer, self_mask[s]);
    r.mask_key_hash = ShareHash(config_.session, false, index_, peer, mask_key[s]);
    r.self_mask_commitment = out.self_mask_commitment;
    r.signature = identity_.Sign(ShareMessage(config_.session, list_digest_, index_, peer, r));
    out.shares.push_back(std::move(r));
    sodium_memzero(plaintext.data(), plaintext.size());
    sodium_memzero(key.data(), key.size());
  }
  sodium_memzero(self_mask.data(), self_mask.size() * sizeof self_mask[0]);
  sodium_memzero(mask_key.data(), mask_key.size() * sizeof mask_key[0]);
  stage_ = Stage::kShared;
  return out;
}

StatusOr<Verdict> Client::OnShareList(const ShareList& list) {
  if (stage_ != Stage::kShared) return OutOfOrder("a share list");
  const std::vector<uint8_t> context = AgreementContext(config_.session, list_digest_);
  std::set<uint32_t> seen;
  Verdict verdict;
  for (const ShareRecord& r : list.shares) {
    const auto it = std::lower_bound(neighbours_.begin(), neighbours_.end(), r.peer);
    if (it == neighbours_.end() || *it != r.peer || !seen.insert(r.peer).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: the share list holds a record from member ", r.peer,
                       ", not a neighbour or twice"));
    }
    const size_t slot = static_cast<size_t>(it - neighbours_.begin());
    auto complain = [&](Complaint why) { verdict.complaints.push_back({r.peer, why}); };
    // Each record is seen once (by its receiver): verified directly, never cached.
    if (!VerifySignature(signing_keys_[r.peer],
                         ShareMessage(config_.session, list_digest_, r.peer, index_, r),
                         r.signature)) {
      complain(Complaint::kBadSignature);
      continue;
    }
    if (r.ciphertext.size() != kSealedShareBytes) {
      complain(Complaint::kUnreadable);
      continue;
    }
    HUDDLE_ASSIGN_OR_RETURN(Secret key,
                            AgreeKey(cipher_, keys_[slot].first, kShareKeyPurpose, context));
    StatusOr<std::vector<uint8_t>> plain =
        Open(key, r.ciphertext, ShareAssociatedData(config_.session, r.peer, index_));
    sodium_memzero(key.data(), key.size());
    if (!plain.ok()) {
      complain(Complaint::kUnreadable);
      continue;
    }
    StatusOr<std::pair<Share, Share>> pair = internal::DecodeShares(*plain, SharePoint(index_));
    sodium_memzero(plain->data(), plain->size());
    if (!pair.ok()) {
      complain(Complaint::kUnreadable);
      continue;
    }
    if (ShareHash(config_.session, true, r.peer, index_, pair->first) != r.self_mask_hash ||
        ShareHash(config_.session, false, r.peer, index_, pair->second) != r.mask_key_hash) {
      sodium_memzero(&*pair, sizeof *pair);
      complain(Complaint::kWrongShare);
      continue;
    }
    held_.emplace(r.peer, *pair);
    sodium_memzero(&*pair, sizeof *pair);
  }
  for (uint32_t peer : neighbours_) {
    if (seen.count(peer) == 0) verdict.complaints.push_back({peer, Complaint::kMissing});
  }
  stage_ = Stage::kJudged;
  return verdict;
}

StatusOr<std::vector<uint64_t>> Client::MaskInput(const MaskRequest& request,
                                                  std::span<const uint64_t> input) {
  if (stage_ != Stage::kJudged) return OutOfOrder("masking");
  const std::vector<uint32_t>& shared = request.shared;
  if (!SortedSetBelow(shared, static_cast<uint64_t>(members_)) || !Contains(shared, index_)) {
    return absl::InvalidArgumentError(
        "secure aggregation: the members that shared are not a sorted set of listed members "
        "holding this one");
  }
  if (shared.size() < config_.min_survivors) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure aggregation: ", shared.size(), " members shared, fewer than the ",
                     "minimum ", config_.min_survivors, ": nothing masked"));
  }
  if (input.size() != config_.length) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: an input of ", input.size(),
                                                   " words; the session's is ", config_.length));
  }
  const uint64_t mask = ModulusMask(config_.bits);
  for (size_t i = 0; i < input.size(); ++i) {
    if ((input[i] & ~mask) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: input word ", i, " (",
                                                     input[i], ") is not below 2^", config_.bits));
    }
  }
  // A pairwise mask with every neighbour in U2: the mask needs only its public key, so a neighbour
  // whose shares this member could not read is masked with all the same (both sides agree).
  const std::vector<uint8_t> context = AgreementContext(config_.session, list_digest_);
  std::vector<uint64_t> masked(input.begin(), input.end());
  HUDDLE_RETURN_IF_ERROR(AddMask(self_mask_seed_, config_.bits, 1, masked));
  for (size_t s = 0; s < neighbours_.size(); ++s) {
    const uint32_t peer = neighbours_[s];
    if (!Contains(shared, peer)) continue;
    HUDDLE_ASSIGN_OR_RETURN(Secret seed, AgreeKey(mask_, keys_[s].second, kMaskPurpose, context));
    Status added = AddMask(seed, config_.bits, MaskSign(index_, peer), masked);
    sodium_memzero(seed.data(), seed.size());
    HUDDLE_RETURN_IF_ERROR(added);
  }
  for (uint64_t& w : masked) w &= mask;
  shared_ = shared;
  stage_ = Stage::kMasked;
  return masked;
}

StatusOr<Consistency> Client::OnSurvivors(const Survivors& sets) {
  if (stage_ != Stage::kMasked) return OutOfOrder("a survivor set");
  if (sets.shared != shared_) {
    return absl::InvalidArgumentError(
        "secure aggregation: the members that shared are not those this member masked with: "
        "nothing signed");
  }
  const std::vector<uint32_t>& s = sets.survivors;
  if (!SortedSetBelow(s, static_cast<uint64_t>(members_)) ||
      !std::includes(shared_.begin(), shared_.end(), s.begin(), s.end()) || !Contains(s, index_)) {
    return absl::InvalidArgumentError(
        "secure aggregation: the survivors are not a sorted set of members that shared, holding "
        "this one: nothing signed");
  }
  if (s.size() < config_.min_survivors) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation: ", s.size(), " survivors, fewer than the session's minimum ",
        config_.min_survivors, ": nothing signed"));
  }
  signed_ = sets;
  stage_ = Stage::kSigned;
  return Consistency{identity_.Sign(SurvivorsMessage(config_.session, list_digest_, sets))};
}

StatusOr<UnmaskResponse> Client::OnUnmask(const UnmaskRequest& request) {
  if (stage_ != Stage::kSigned) return OutOfOrder("an unmask request");
  const std::vector<uint32_t>& s = signed_.survivors;
  const std::vector<uint8_t> message = SurvivorsMessage(config_.session, list_digest_, signed_);
  std::set<uint32_t> signers;
  for (const SignedBy& sig : request.signatures) {
    if (!Contains(s, sig.member) || !signers.insert(sig.member).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: a consistency signature of member ", sig.member,
                       ", not a survivor or twice: nothing revealed"));
    }
    if (!Verify(signing_keys_[sig.member], message, sig.signature)) signers.erase(sig.member);
  }
  if (static_cast<int64_t>(signers.size()) < guarantee_->quorum) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure aggregation: ", signers.size(),
                     " members signed these survivors; this member "
                     "needs ",
                     guarantee_->quorum, " (more than half of the ", members_, " members, its ",
                     guarantee_->colluders, " colluders aside) before it reveals anything"));
  }
  UnmaskResponse out;
  for (const auto& [peer, shares] : held_) {
    if (Contains(s, peer)) {
      out.self_mask_shares.push_back({peer, shares.first});
    } else if (Contains(shared_, peer)) {
      out.mask_key_shares.push_back({peer, shares.second});
    }
  }
  for (auto& [peer, shares] : held_) sodium_memzero(&shares, sizeof shares);
  held_.clear();
  stage_ = Stage::kDone;
  return out;
}

}  // namespace huddle::aggregation::secagg
