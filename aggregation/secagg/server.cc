// The coordinator's side of secure aggregation (protocol.h: stages A-G). The coordinator needs no
// one's trust here, but it checks what it can so that a lying member is named and set aside
// instead of stalling the session: reveals and consistency signatures on arrival, a disputed share
// record's signature, every revealed share against the hash its dealer signed.
#include <sodium.h>

#include <algorithm>
#include <new>
#include <set>

#include "aggregation/secagg/internal.h"
#include "aggregation/secagg/protocol.h"
#include "common/secure_random.h"

namespace huddle::aggregation::secagg {

using internal::AgreementContext;
using internal::Contains;
using internal::kMaskPurpose;
using internal::kSealedShareBytes;
using internal::MaskSign;
using internal::ModulusMask;

StatusOr<Server> Server::Create(const ServerOptions& options) {
  Server server;
  server.config_ = options.config;
  server.graph_options_ = options.graph;
  SessionConfig& c = server.config_;
  if (c.members < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation of ", c.members, " members: at least 2"));
  }
  if (c.threshold == 0 || c.edge_threshold == 0) {
    HUDDLE_ASSIGN_OR_RETURN(GraphParameters p,
                            ChooseParameters(c.members, c.min_survivors, options.graph));
    c.threshold = static_cast<uint32_t>(p.threshold);
    c.edge_threshold = p.edge_threshold;
  }
  HUDDLE_RETURN_IF_ERROR(internal::CheckConfig(c));
  const int64_t quorum =
      ConsistencyQuorum(c.members, Colluders(options.graph.corrupt_fraction, c.members));
  if (c.min_survivors < quorum || c.min_survivors < c.threshold) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secure aggregation: min_survivors ", c.min_survivors, " is below the threshold ",
        c.threshold, " or the consistency quorum ", quorum, " of ", c.members,
        " members (more than half, the colluders aside): raise it"));
  }
  EnsureSodium();
  randombytes_buf(c.session.data(), c.session.size());
  server.modulus_mask_ = ModulusMask(c.bits);
  return server;
}

Status Server::Expect(Stage stage, const char* what) const {
  if (stage_ != stage) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure aggregation: ", what, " is out of order in this session"));
  }
  return absl::OkStatus();
}

Status Server::CheckIndex(uint32_t index) const {
  if (index >= members_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " of ", members_.size()));
  }
  return absl::OkStatus();
}

void Server::Blames(uint32_t member, std::string reason) {
  // Once per member: its first lie is enough to name it.
  for (const Blame& b : blames_) {
    if (b.member == member) return;
  }
  blames_.push_back({member, std::move(reason)});
}

Status Server::OnAdvertise(uint32_t cohort_index, const MemberCertificate& certificate,
                           const Advertisement& keys) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kAdvertise, "a key advertisement"));
  if (cohort_index >= config_.members) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", cohort_index, " of ", config_.members));
  }
  if (advertised_.count(cohort_index) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", cohort_index, " advertised its keys twice"));
  }
  if (IsSmallOrder(keys.cipher_key) || IsSmallOrder(keys.mask_key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", cohort_index, " advertised a small-order key"));
  }
  advertised_[cohort_index] = ListedMember{cohort_index, certificate, keys};
  return absl::OkStatus();
}

StatusOr<MemberList> Server::EndAdvertise() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kAdvertise, "ending the advertisements"));
  for (auto& [index, member] : advertised_) list_.members.push_back(std::move(member));
  advertised_.clear();
  const auto n = static_cast<int64_t>(list_.members.size());
  if (n < config_.min_survivors || n < 2) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(
        absl::StrCat("secure aggregation refused: ", n, " members advertised keys; the minimum is ",
                     std::max<uint32_t>(config_.min_survivors, 2)));
  }
  colluders_ = Colluders(graph_options_.corrupt_fraction, n);
  quorum_ = ConsistencyQuorum(n, colluders_);
  list_digest_ = MemberListDigest(config_, list_);
  members_.resize(static_cast<size_t>(n));
  stage_ = Stage::kReveal;
  return list_;
}

Status Server::OnReveal(uint32_t index, const Reveal& reveal) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kReveal, "a reveal"));
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  if (members_[index].reveal) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " revealed twice"));
  }
  const ListedMember& m = list_.members[index];
  if (SeedCommitment(config_.session, reveal.seed) != m.keys.seed_commitment ||
      !VerifySignature(m.certificate.signing_key,
                       RevealMessage(config_.session, list_digest_, index, reveal.seed),
                       reveal.signature)) {
    Blames(index, "its reveal does not open its commitment or is not signed by it");
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index,
                     "'s reveal does not open its commitment or its signature does not verify"));
  }
  members_[index].reveal = reveal;
  return absl::OkStatus();
}

StatusOr<SeedList> Server::EndReveal() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kReveal, "ending the reveals"));
  SeedList seeds;
  std::vector<uint32_t> missing;
  for (uint32_t i = 0; i < members_.size(); ++i) {
    if (members_[i].reveal) {
      seeds.reveals.push_back(*members_[i].reveal);
    } else {
      missing.push_back(i);
    }
  }
  if (!missing.empty()) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation refused: ", missing.size(), " of ", members_.size(),
        " listed members did not reveal their randomness (member ", missing[0],
        missing.size() > 1 ? ", ..." : "", "): the session's graph needs every member's"));
  }
  HUDDLE_ASSIGN_OR_RETURN(
      graph_, RandomGraph(JointSeed(config_.session, list_digest_, seeds),
                          static_cast<int64_t>(members_.size()), config_.edge_threshold));
  stage_ = Stage::kShare;
  return seeds;
}

Status Server::OnShareKeys(uint32_t index, const ShareKeys& shares) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kShare, "a share message"));
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  Member& m = members_[index];
  if (m.shares) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " sent its shares twice"));
  }
  const std::vector<uint32_t>& mine = graph_[index];
  if (shares.shares.size() != mine.size()) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index, " sent ",
                                                   shares.shares.size(), " shares for its ",
                                                   mine.size(), " neighbours"));
  }
  std::set<uint32_t> peers;
  for (const ShareRecord& r : shares.shares) {
    if (!Contains(mine, r.peer) || !peers.insert(r.peer).second) {
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                     " sent a share for member ", r.peer,
                                                     ", not one of its neighbours or twice"));
    }
    if (r.ciphertext.size() != kSealedShareBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: member ", index, "'s share for member ", r.peer,
                       " has ", r.ciphertext.size(), " bytes, not ", kSealedShareBytes));
    }
    if (r.self_mask_commitment != shares.self_mask_commitment) {
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                     "'s records commit to different self masks"));
    }
  }
  m.shares = shares;
  return absl::OkStatus();
}

StatusOr<std::map<uint32_t, ShareList>> Server::EndShareKeys() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kShare, "ending the shares"));
  std::map<uint32_t, ShareList> out;
  for (uint32_t i = 0; i < members_.size(); ++i) {
    if (members_[i].shares) out[i];
  }
  for (uint32_t i = 0; i < members_.size(); ++i) {
    if (!members_[i].shares) continue;
    for (const ShareRecord& r : members_[i].shares->shares) {
      auto to = out.find(r.peer);
      if (to == out.end()) continue;
      ShareRecord forwarded = r;
      forwarded.peer = i;
      to->second.shares.push_back(std::move(forwarded));
    }
  }
  stage_ = Stage::kVerdict;
  return out;
}

Status Server::OnVerdict(uint32_t index, const Verdict& verdict) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kVerdict, "a verdict"));
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  Member& m = members_[index];
  if (!m.shares) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " sent a verdict but shared nothing"));
  }
  if (m.verdict) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " sent its verdict twice"));
  }
  std::set<uint32_t> peers;
  for (const ComplaintRecord& c : verdict.complaints) {
    if (!Contains(graph_[index], c.peer) || !peers.insert(c.peer).second) {
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                     " complains of member ", c.peer,
                                                     ", not a neighbour or twice"));
    }
  }
  m.verdict = verdict;
  return absl::OkStatus();
}

StatusOr<std::map<uint32_t, MaskRequest>> Server::EndVerdicts() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kVerdict, "ending the verdicts"));
  const auto n = static_cast<uint32_t>(members_.size());
  std::vector<char> in(n, 0);
  for (uint32_t i = 0; i < n; ++i) in[i] = members_[i].shares && members_[i].verdict;
  // Complaints: a bad signature can be checked (the coordinator forwarded the very record), so
  // the liar is known; the rest cannot, and only mean that the complainer holds no share.
  std::set<std::pair<uint32_t, uint32_t>> unheld;  // (holder, dealer)
  for (uint32_t i = 0; i < n; ++i) {
    if (!members_[i].verdict) continue;
    for (const ComplaintRecord& c : members_[i].verdict->complaints) {
      const uint32_t j = c.peer;
      unheld.insert({i, j});
      if (!members_[j].shares) continue;  // j shared nothing: a true "missing"
      if (c.reason != Complaint::kBadSignature && c.reason != Complaint::kMissing) {
        disputes_.push_back({i, j});
        continue;
      }
      const ShareRecord* record = nullptr;
      for (const ShareRecord& r : members_[j].shares->shares) {
        if (r.peer == i) record = &r;
      }
      const bool signed_well =
          record != nullptr &&
          VerifySignature(list_.members[j].certificate.signing_key,
                          ShareMessage(config_.session, list_digest_, j, i, *record),
                          record->signature);
      if (c.reason == Complaint::kMissing || signed_well) {
        // It was forwarded, and (for a signature) verifies: the complainer lies.
        Blames(i,
               absl::StrCat("complained that member ", j, "'s share was ", ComplaintName(c.reason),
                            ", but it was forwarded",
                            c.reason == Complaint::kMissing ? "" : " and its signature verifies"));
        in[i] = 0;
      } else {
        Blames(j, absl::StrCat("sent member ", i, " a share record its signature does not cover"));
        in[j] = 0;
      }
    }
  }
  // U2: members whose secrets at least t members of U2 hold; leaving may leave others short.
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t j = 0; j < n; ++j) {
      if (!in[j]) continue;
      size_t holders = 0;
      for (uint32_t i : graph_[j]) holders += in[i] && unheld.count({i, j}) == 0;
      if (holders < config_.threshold) {
        in[j] = 0;
        changed = true;
      }
    }
  }
  u2_.clear();
  for (uint32_t i = 0; i < n; ++i) {
    if (in[i]) u2_.push_back(i);
  }
  if (u2_.size() < config_.min_survivors) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation refused: ", u2_.size(),
        " members shared secrets that enough others hold; the minimum is ", config_.min_survivors));
  }
  try {
    sum_.assign(config_.length, 0);
  } catch (const std::bad_alloc&) {
    stage_ = Stage::kDone;
    return absl::ResourceExhaustedError(
        absl::StrCat("secure aggregation: no memory for the sum of ", config_.length, " words"));
  }
  // The ciphertexts are no longer needed (their hashes are in the signed messages).
  for (Member& m : members_) {
    if (!m.shares) continue;
    for (ShareRecord& r : m.shares->shares) {
      r.ciphertext.clear();
      r.ciphertext.shrink_to_fit();
    }
  }
  std::map<uint32_t, MaskRequest> out;
  for (uint32_t i : u2_) out[i].shared = u2_;
  stage_ = Stage::kMasked;
  return out;
}

void Server::Subtract(std::span<const uint64_t> words, size_t count) {
  for (size_t i = 0; i < count; ++i) sum_[i] -= words[i];
}

Status Server::OnMaskedInput(uint32_t index, std::span<const uint64_t> words) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kMasked, "a masked input"));
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  Member& m = members_[index];
  if (!Contains(u2_, index)) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                   " sent a masked input but is not among U2"));
  }
  if (m.masked) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " sent a second masked input"));
  }
  if (words.size() != config_.length) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                   "'s masked input has ", words.size(),
                                                   " words; the session's have ", config_.length));
  }
  for (size_t i = 0; i < words.size(); ++i) {
    if ((words[i] & ~modulus_mask_) != 0) {
      Subtract(words, i);
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                     "'s masked word ", i, " is not below 2^",
                                                     config_.bits));
    }
    sum_[i] += words[i];
  }
  m.masked = true;
  return absl::OkStatus();
}

Status Server::OnMaskedInput(uint32_t index, std::span<const uint32_t> words) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kMasked, "a masked input"));
  if (config_.bits != 32) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                   " sent 32-bit words to a ", config_.bits,
                                                   "-bit session"));
  }
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  Member& m = members_[index];
  if (!Contains(u2_, index) || m.masked || words.size() != config_.length) {
    // The same checks and messages as the 64-bit path.
    std::vector<uint64_t> wide(words.begin(), words.end());
    return OnMaskedInput(index, std::span<const uint64_t>(wide));
  }
  for (size_t i = 0; i < words.size(); ++i) sum_[i] += words[i];  // 32-bit words: all in range
  m.masked = true;
  return absl::OkStatus();
}

StatusOr<std::map<uint32_t, Survivors>> Server::EndMaskedInput() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kMasked, "ending the masked inputs"));
  s_.clear();
  for (uint32_t i : u2_) {
    if (members_[i].masked) s_.push_back(i);
  }
  if (s_.size() < config_.min_survivors) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation refused: ", s_.size(), " masked inputs arrived; the minimum is ",
        config_.min_survivors, ": nothing is unmasked"));
  }
  if (!Connected(graph_, s_)) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation refused: the ", s_.size(),
        " members that sent masked inputs are not connected in the session's graph (a part's own "
        "sum would be revealed): nothing is unmasked"));
  }
  std::map<uint32_t, Survivors> out;
  for (uint32_t i : s_) out[i] = Survivors{u2_, s_};
  stage_ = Stage::kConsistency;
  return out;
}

Status Server::OnConsistency(uint32_t index, const Consistency& consistency) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kConsistency, "a consistency signature"));
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  if (!Contains(s_, index)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " signed the survivors but is not one"));
  }
  if (members_[index].consistency) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " signed the survivors twice"));
  }
  if (!VerifySignature(list_.members[index].certificate.signing_key,
                       SurvivorsMessage(config_.session, list_digest_, Survivors{u2_, s_}),
                       consistency.signature)) {
    Blames(index, "its consistency signature does not verify");
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                   "'s consistency signature does not verify"));
  }
  members_[index].consistency = consistency.signature;
  return absl::OkStatus();
}

StatusOr<std::map<uint32_t, UnmaskRequest>> Server::EndConsistency() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kConsistency, "ending the consistency round"));
  UnmaskRequest request;
  signers_.clear();
  for (uint32_t i : s_) {
    if (!members_[i].consistency) continue;
    signers_.push_back(i);
    request.signatures.push_back({i, *members_[i].consistency});
  }
  if (static_cast<int64_t>(signers_.size()) < quorum_) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(
        absl::StrCat("secure aggregation refused: ", signers_.size(),
                     " survivors signed the survivor set; "
                     "members reveal nothing below ",
                     quorum_, ": nothing is unmasked"));
  }
  std::map<uint32_t, UnmaskRequest> out;
  for (uint32_t i : s_) out[i] = request;
  stage_ = Stage::kUnmask;
  return out;
}

Status Server::OnUnmask(uint32_t index, const UnmaskResponse& response) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kUnmask, "an unmask response"));
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  if (!Contains(s_, index)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secure aggregation: member ", index, " answered the unmasking but is not a survivor"));
  }
  if (members_[index].responded) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " answered the unmasking twice"));
  }
  const std::vector<uint32_t>& mine = graph_[index];
  std::set<uint32_t> owners;
  auto check = [&](const RevealedShare& r, bool survivor) -> Status {
    const bool ok_owner = Contains(mine, r.owner) && Contains(u2_, r.owner) &&
                          Contains(s_, r.owner) == survivor && owners.insert(r.owner).second;
    if (!ok_owner) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: member ", index, " revealed a ",
                       survivor ? "self-mask" : "mask-key", " share of member ", r.owner,
                       ": not a neighbour in U2, of the wrong kind for it, or twice"));
    }
    if (std::any_of(r.share.y.begin(), r.share.y.end(),
                    [](uint64_t y) { return y >= kFieldPrime; })) {
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                     "'s share of member ", r.owner,
                                                     " is not in the field"));
    }
    return absl::OkStatus();
  };
  for (const RevealedShare& r : response.self_mask_shares) HUDDLE_RETURN_IF_ERROR(check(r, true));
  for (const RevealedShare& r : response.mask_key_shares) HUDDLE_RETURN_IF_ERROR(check(r, false));
  // Each share against the hash its dealer signed for this holder: a wrong one is set aside and
  // its revealer named; the right ones count.
  auto keep = [&](const RevealedShare& r, bool self_mask) {
    const ShareRecord* record = nullptr;
    for (const ShareRecord& rec : members_[r.owner].shares->shares) {
      if (rec.peer == index) record = &rec;
    }
    const Hash32& want = self_mask ? record->self_mask_hash : record->mask_key_hash;
    Share share = r.share;
    share.x = SharePoint(index);  // a share's point is its holder's, whatever it says
    if (ShareHash(config_.session, self_mask, r.owner, index, share) != want) {
      Blames(index,
             absl::StrCat("revealed a ", self_mask ? "self-mask" : "mask-key", " share of member ",
                          r.owner, " that is not the one its dealer signed"));
      return;
    }
    (self_mask ? members_[r.owner].self_mask_shares : members_[r.owner].mask_key_shares)
        .push_back(share);
  };
  for (const RevealedShare& r : response.self_mask_shares) keep(r, true);
  for (const RevealedShare& r : response.mask_key_shares) keep(r, false);
  members_[index].responded = true;
  return absl::OkStatus();
}

StatusOr<std::vector<uint64_t>> Server::Finish() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kUnmask, "unmasking"));
  stage_ = Stage::kDone;
  responders_.clear();
  for (uint32_t i : s_) {
    if (members_[i].responded) responders_.push_back(i);
  }
  const int t = static_cast<int>(config_.threshold);
  // Every secret is rebuilt and checked before any mask is removed.
  std::vector<Secret> self_masks;
  self_masks.reserve(s_.size());
  for (uint32_t i : s_) {
    const Member& m = members_[i];
    if (m.self_mask_shares.size() < config_.threshold) {
      return absl::FailedPreconditionError(absl::StrCat(
          "secure aggregation refused: member ", i, "'s self mask has ", m.self_mask_shares.size(),
          " checked shares, fewer than the threshold ", t, ": nothing is unmasked"));
    }
    StatusOr<Secret> b = Combine(m.self_mask_shares, t);
    if (!b.ok() || Hash(*b) != m.shares->self_mask_commitment) {
      Blames(i,
             "its self-mask shares, each as it signed them, do not rebuild the seed it "
             "committed to");
      return absl::DataLossError(
          absl::StrCat("secure aggregation refused: member ", i,
                       "'s self-mask shares, each as it signed them, do not rebuild the seed it "
                       "committed to (a bad dealing): nothing is unmasked",
                       b.ok() ? "" : absl::StrCat(" (", b.status().message(), ")")));
    }
    self_masks.push_back(*b);
  }
  struct Dropped {
    uint32_t index;
    KeyPair key;
  };
  std::vector<Dropped> dropped;
  for (uint32_t j : u2_) {
    if (Contains(s_, j)) continue;
    const Member& m = members_[j];
    const bool has_survivor = std::any_of(graph_[j].begin(), graph_[j].end(),
                                          [&](uint32_t i) { return Contains(s_, i); });
    if (!has_survivor) continue;  // its pairwise masks are in no survivor's input
    if (m.mask_key_shares.size() < config_.threshold) {
      return absl::FailedPreconditionError(
          absl::StrCat("secure aggregation refused: dropped member ", j, "'s mask key has ",
                       m.mask_key_shares.size(), " checked shares, fewer than the threshold ", t,
                       ": nothing is unmasked"));
    }
    StatusOr<Secret> key = Combine(m.mask_key_shares, t);
    StatusOr<KeyPair> pair = key.ok() ? KeyPair::FromSecret(*key) : StatusOr<KeyPair>(key.status());
    if (key.ok()) sodium_memzero(key->data(), key->size());
    if (!pair.ok() || pair->public_key() != list_.members[j].keys.mask_key) {
      Blames(j,
             "its mask-key shares, each as it signed them, do not rebuild the key it "
             "advertised");
      return absl::DataLossError(
          absl::StrCat("secure aggregation refused: dropped member ", j,
                       "'s mask-key shares do not rebuild the key it advertised (a bad dealing)"));
    }
    dropped.push_back({j, *std::move(pair)});
  }
  for (Secret& b : self_masks) {
    HUDDLE_RETURN_IF_ERROR(AddMask(b, config_.bits, -1, sum_));
    sodium_memzero(b.data(), b.size());
  }
  const std::vector<uint8_t> context = AgreementContext(config_.session, list_digest_);
  for (const Dropped& d : dropped) {
    for (uint32_t i : graph_[d.index]) {
      if (!Contains(s_, i)) continue;
      HUDDLE_ASSIGN_OR_RETURN(
          Secret seed, AgreeKey(d.key, list_.members[i].keys.mask_key, kMaskPurpose, context));
      // Survivor i added MaskSign(i, d) * PRG(seed): take it out again.
      Status removed = AddMask(seed, config_.bits, -MaskSign(i, d.index), sum_);
      sodium_memzero(seed.data(), seed.size());
      HUDDLE_RETURN_IF_ERROR(removed);
    }
  }
  for (uint64_t& w : sum_) w &= modulus_mask_;
  return std::move(sum_);
}

}  // namespace huddle::aggregation::secagg
