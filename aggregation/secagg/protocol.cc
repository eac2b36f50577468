#include "aggregation/secagg/protocol.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <set>

#include "common/secure_random.h"

namespace huddle::aggregation::secagg {

namespace {

constexpr std::string_view kShareKeyPurpose = "huddle-secagg-share-key";
constexpr std::string_view kMaskPurpose = "huddle-secagg-pairwise-mask";
// A sealed pair of shares: the self-mask share's limbs, then the mask key share's, u64 LE each.
constexpr size_t kSharePlaintextBytes = 2 * kSecretLimbs * 8;

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> EncodeShares(const Share& self_mask, const Share& mask_key) {
  std::vector<uint8_t> out;
  out.reserve(kSharePlaintextBytes);
  for (const Share* s : {&self_mask, &mask_key}) {
    for (uint64_t y : s->y) {
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(y >> (8 * i)));
    }
  }
  return out;
}

StatusOr<std::pair<Share, Share>> DecodeShares(std::span<const uint8_t> bytes, uint64_t x) {
  if (bytes.size() != kSharePlaintextBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a sealed share pair holds ", bytes.size(),
                                                   " bytes, not ", kSharePlaintextBytes));
  }
  std::pair<Share, Share> out;
  out.first.x = out.second.x = x;
  size_t at = 0;
  for (Share* s : {&out.first, &out.second}) {
    for (uint64_t& y : s->y) {
      y = 0;
      for (int i = 0; i < 8; ++i) y |= uint64_t{bytes[at++]} << (8 * i);
      if (y >= kFieldPrime) return absl::InvalidArgumentError("a share value is outside the field");
    }
  }
  return out;
}

std::span<const uint8_t> SessionBytes(const SessionId& session) { return session; }

// +1 when the lower index adds the pairwise mask, -1 for the higher.
int MaskSign(uint32_t self, uint32_t peer) { return self < peer ? 1 : -1; }

Status CheckConfig(const SessionConfig& c) {
  if (c.bits != 32 && c.bits != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation over ", c.bits, " bits: 32 or 64"));
  }
  if (c.members < 2 || c.threshold < 1 || c.threshold >= c.members) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation of ", c.members, " members with threshold ", c.threshold,
                     ": at least 2 members and a threshold in [1, members)"));
  }
  if (c.length < 1 || c.length > (uint64_t{1} << 36)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation of ", c.length, " words: 1 to 2^36"));
  }
  if (c.min_survivors > c.members) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_survivors ", c.min_survivors, " exceeds the ", c.members, " members"));
  }
  return absl::OkStatus();
}

uint64_t ModulusMask(int bits) { return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1; }

bool Contains(const std::vector<uint32_t>& sorted, uint32_t v) {
  return std::binary_search(sorted.begin(), sorted.end(), v);
}

}  // namespace

std::vector<uint8_t> ShareAssociatedData(const SessionId& session, uint32_t from, uint32_t to) {
  // purpose || session || from || to (little-endian)
  std::vector<uint8_t> ad(kShareKeyPurpose.size() + session.size());
  std::memcpy(ad.data(), kShareKeyPurpose.data(), kShareKeyPurpose.size());
  std::memcpy(ad.data() + kShareKeyPurpose.size(), session.data(), session.size());
  PutU32(ad, from);
  PutU32(ad, to);
  return ad;
}

// ---- Client ----

Client::Client(const SessionConfig& config, uint32_t index)
    : config_(config), index_(index), cipher_(KeyPair::Generate()), mask_(KeyPair::Generate()) {}

Client::~Client() {
  sodium_memzero(self_mask_seed_.data(), self_mask_seed_.size());
  for (auto& [peer, shares] : held_) {
    sodium_memzero(&shares, sizeof shares);
  }
}

StatusOr<Client> Client::Create(const SessionConfig& config, uint32_t index) {
  HUDDLE_RETURN_IF_ERROR(CheckConfig(config));
  if (index >= config.members) {
    return absl::InvalidArgumentError(
        absl::StrCat("member index ", index, " of ", config.members, " members"));
  }
  return Client(config, index);
}

AdvertiseKeys Client::Advertise() const { return {cipher_.public_key(), mask_.public_key()}; }

StatusOr<ShareKeys> Client::SealShares(const KeyList& keys) {
  if (stage_ != Stage::kAdvertised) {
    return absl::FailedPreconditionError("secure aggregation: key list after stage 1");
  }
  std::map<uint32_t, AdvertiseKeys> neighbours;
  for (const Neighbour& n : keys.neighbours) {
    if (n.index >= config_.members || n.index == index_) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: the key list names member ", n.index,
                       " (this member is ", index_, " of ", config_.members, ")"));
    }
    if (IsSmallOrder(n.keys.cipher_key) || IsSmallOrder(n.keys.mask_key)) {
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", n.index,
                                                     "'s public key is a small-order point"));
    }
    if (!neighbours.emplace(n.index, n.keys).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: the key list names member ", n.index, " twice"));
    }
  }
  if (neighbours.size() < config_.threshold) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure aggregation: ", neighbours.size(),
                     " neighbours advertised keys; the threshold is ", config_.threshold));
  }
  EnsureSodium();
  randombytes_buf(self_mask_seed_.data(), self_mask_seed_.size());
  std::vector<uint64_t> points;
  for (const auto& [peer, unused] : neighbours) points.push_back(SharePoint(peer));
  const int t = static_cast<int>(config_.threshold);
  HUDDLE_ASSIGN_OR_RETURN(std::vector<secagg::Share> self_mask, Split(self_mask_seed_, t, points));
  HUDDLE_ASSIGN_OR_RETURN(std::vector<secagg::Share> mask_key,
                          Split(mask_.secret_key(), t, points));
  ShareKeys out;
  out.self_mask_commitment = Hash(self_mask_seed_);
  size_t s = 0;
  for (const auto& [peer, their] : neighbours) {
    HUDDLE_ASSIGN_OR_RETURN(Secret key, AgreeKey(cipher_, their.cipher_key, kShareKeyPurpose,
                                                 SessionBytes(config_.session)));
    std::vector<uint8_t> plaintext = EncodeShares(self_mask[s], mask_key[s]);
    out.shares.push_back(
        {peer, Seal(key, plaintext, ShareAssociatedData(config_.session, index_, peer))});
    sodium_memzero(plaintext.data(), plaintext.size());
    sodium_memzero(key.data(), key.size());
    ++s;
  }
  sodium_memzero(self_mask.data(), self_mask.size() * sizeof self_mask[0]);
  sodium_memzero(mask_key.data(), mask_key.size() * sizeof mask_key[0]);
  neighbours_ = std::move(neighbours);
  stage_ = Stage::kShared;
  return out;
}

StatusOr<std::vector<uint64_t>> Client::MaskInput(const ShareList& shares,
                                                  std::span<const uint64_t> input) {
  if (stage_ != Stage::kShared) {
    return absl::FailedPreconditionError("secure aggregation: masking before stage 1 or twice");
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
  std::map<uint32_t, std::pair<secagg::Share, secagg::Share>> held;
  for (const SealedShare& s : shares.shares) {
    auto it = neighbours_.find(s.peer);
    if (it == neighbours_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: a share from member ",
                                                     s.peer, ", not a listed neighbour"));
    }
    if (held.count(s.peer) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: two shares from member ", s.peer));
    }
    HUDDLE_ASSIGN_OR_RETURN(Secret key, AgreeKey(cipher_, it->second.cipher_key, kShareKeyPurpose,
                                                 SessionBytes(config_.session)));
    StatusOr<std::vector<uint8_t>> plain =
        Open(key, s.ciphertext, ShareAssociatedData(config_.session, s.peer, index_));
    sodium_memzero(key.data(), key.size());
    if (!plain.ok()) {
      return absl::DataLossError(absl::StrCat("secure aggregation: the share from member ", s.peer,
                                              ": ", plain.status().message()));
    }
    StatusOr<std::pair<secagg::Share, secagg::Share>> pair =
        DecodeShares(*plain, SharePoint(index_));
    sodium_memzero(plain->data(), plain->size());
    if (!pair.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: the share from member ",
                                                     s.peer, ": ", pair.status().message()));
    }
    held.emplace(s.peer, *pair);
  }
  if (held.size() < config_.threshold) {
    return absl::FailedPreconditionError(absl::StrCat("secure aggregation: shares from ",
                                                      held.size(), " neighbours; the threshold is ",
                                                      config_.threshold));
  }
  std::vector<uint64_t> masked(input.begin(), input.end());
  HUDDLE_RETURN_IF_ERROR(AddMask(self_mask_seed_, config_.bits, 1, masked));
  for (const auto& [peer, unused] : held) {
    HUDDLE_ASSIGN_OR_RETURN(Secret seed, AgreeKey(mask_, neighbours_.at(peer).mask_key,
                                                  kMaskPurpose, SessionBytes(config_.session)));
    Status added = AddMask(seed, config_.bits, MaskSign(index_, peer), masked);
    sodium_memzero(seed.data(), seed.size());
    HUDDLE_RETURN_IF_ERROR(added);
  }
  for (uint64_t& w : masked) w &= mask;
  held_ = std::move(held);
  stage_ = Stage::kMasked;
  return masked;
}

StatusOr<UnmaskResponse> Client::Unmask(const UnmaskRequest& request) {
  if (stage_ != Stage::kMasked) {
    return absl::FailedPreconditionError("secure aggregation: unmask before masking or twice");
  }
  const std::vector<uint32_t>& listed = request.survivors;
  for (size_t i = 0; i < listed.size(); ++i) {
    if ((i > 0 && listed[i] <= listed[i - 1]) ||
        (listed[i] != index_ && neighbours_.count(listed[i]) == 0)) {
      return absl::InvalidArgumentError(
          "secure aggregation: the survivors list is not sorted, repeats a member or names one "
          "that is neither this member nor a neighbour");
    }
  }
  if (request.total < listed.size()) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: ", request.total,
                                                   " survivors in all, but ", listed.size(),
                                                   " listed"));
  }
  const uint32_t minimum = std::max<uint32_t>(config_.min_survivors, config_.threshold);
  if (request.total < minimum) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation: ", request.total, " survivors, fewer than the session's minimum ",
        minimum, ": nothing revealed"));
  }
  if (!Contains(listed, index_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure aggregation: the survivors list omits this member (", index_,
                     "), which sent its masked input: nothing revealed"));
  }
  UnmaskResponse out;
  for (const auto& [peer, shares] : held_) {
    if (Contains(listed, peer)) {
      out.self_mask_shares.push_back({peer, shares.first});
    } else {
      out.mask_key_shares.push_back({peer, shares.second});
    }
  }
  stage_ = Stage::kDone;
  return out;
}

// ---- Server ----

StatusOr<Server> Server::Create(const ServerOptions& options) {
  if (options.members < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation of ", options.members, " members: at least 2"));
  }
  GraphParameters params;
  if (options.parameters) {
    params = *options.parameters;
  } else {
    HUDDLE_ASSIGN_OR_RETURN(params, ChooseParameters(options.members, options.graph));
  }
  if (params.neighbours < 1 || params.threshold < 1 || params.threshold > params.neighbours ||
      static_cast<uint32_t>(params.threshold) >= options.members) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secure aggregation: ", params.neighbours, " neighbours and threshold ", params.threshold,
        " for ", options.members, " members (need 1 <= threshold <= neighbours)"));
  }
  if (std::min<int64_t>(params.neighbours, int64_t{options.members} - 1) > kMaxNeighbours) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: ", params.neighbours, " neighbours per member; at most ",
                     kMaxNeighbours, " are supported (allow fewer dropouts or corrupt clients)"));
  }
  Server server;
  HUDDLE_ASSIGN_OR_RETURN(server.graph_, RandomGraph(options.members, params.neighbours));
  params.neighbours = static_cast<int>(server.graph_[0].size());  // even, or n - 1
  server.parameters_ = params;
  SessionConfig& c = server.config_;
  EnsureSodium();
  randombytes_buf(c.session.data(), c.session.size());
  c.members = options.members;
  c.threshold = static_cast<uint32_t>(params.threshold);
  c.bits = options.bits;
  c.length = options.length;
  c.min_survivors = std::max(options.min_survivors, c.threshold);
  HUDDLE_RETURN_IF_ERROR(CheckConfig(c));
  server.members_.resize(options.members);
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

Status Server::OnAdvertise(uint32_t index, const AdvertiseKeys& keys) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kAdvertise, "a key advertisement"));
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  if (members_[index].keys) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " advertised its keys twice"));
  }
  if (IsSmallOrder(keys.cipher_key) || IsSmallOrder(keys.mask_key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " advertised a small-order key"));
  }
  members_[index].keys = keys;
  return absl::OkStatus();
}

StatusOr<std::map<uint32_t, KeyList>> Server::EndAdvertise() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kAdvertise, "ending stage 0"));
  // Members with fewer than t advertising neighbours cannot share their secrets: they leave the
  // session, which may leave others short in turn (repeat until none is).
  std::vector<char> in(members_.size(), 0);
  for (size_t i = 0; i < members_.size(); ++i) in[i] = members_[i].keys.has_value();
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t i = 0; i < members_.size(); ++i) {
      if (!in[i]) continue;
      size_t n = 0;
      for (uint32_t j : graph_[i]) n += in[j] != 0;
      if (n < config_.threshold) {
        in[i] = 0;
        changed = true;
      }
    }
  }
  u1_.clear();
  for (uint32_t i = 0; i < members_.size(); ++i) {
    if (in[i]) u1_.push_back(i);
  }
  stage_ = Stage::kShare;
  if (u1_.size() < config_.min_survivors) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation refused: ", u1_.size(), " members advertised keys (with at least ",
        config_.threshold, " neighbours that did); the minimum is ", config_.min_survivors));
  }
  std::map<uint32_t, KeyList> out;
  for (uint32_t i : u1_) {
    KeyList& list = out[i];
    for (uint32_t j : graph_[i]) {
      if (!in[j]) continue;
      members_[i].listed.push_back(j);
      list.neighbours.push_back({j, *members_[j].keys});
    }
  }
  return out;
}

Status Server::OnShareKeys(uint32_t index, const ShareKeys& shares) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kShare, "a share message"));
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  Member& m = members_[index];
  if (!Contains(u1_, index)) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                   " sent shares but was not sent a key list"));
  }
  if (m.commitment) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: member ", index, " sent its shares twice"));
  }
  if (shares.shares.size() != m.listed.size()) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index, " sent ",
                                                   shares.shares.size(), " shares for its ",
                                                   m.listed.size(), " listed neighbours"));
  }
  std::set<uint32_t> peers;
  for (const SealedShare& s : shares.shares) {
    if (!Contains(m.listed, s.peer) || !peers.insert(s.peer).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation: member ", index, " sent a share for member ", s.peer,
                       ", not one of its listed neighbours or twice"));
    }
    if (s.ciphertext.size() != kSealOverhead + kSharePlaintextBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "secure aggregation: member ", index, "'s share for member ", s.peer, " has ",
          s.ciphertext.size(), " bytes, not ", kSealOverhead + kSharePlaintextBytes));
    }
  }
  m.commitment = shares.self_mask_commitment;
  m.shares = shares.shares;
  return absl::OkStatus();
}

StatusOr<std::map<uint32_t, ShareList>> Server::EndShareKeys() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kShare, "ending stage 1"));
  u2_.clear();
  for (uint32_t i : u1_) {
    if (members_[i].commitment) u2_.push_back(i);
  }
  if (u2_.size() < config_.min_survivors) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(absl::StrCat("secure aggregation refused: ", u2_.size(),
                                                      " members shared their keys; the minimum is ",
                                                      config_.min_survivors));
  }
  std::map<uint32_t, ShareList> out;
  for (uint32_t i : u2_) out[i];
  for (uint32_t i : u2_) {
    for (SealedShare& s : members_[i].shares) {
      if (Contains(u2_, s.peer)) out[s.peer].shares.push_back({i, std::move(s.ciphertext)});
    }
    members_[i].shares.clear();
    members_[i].shares.shrink_to_fit();
  }
  try {
    sum_.assign(config_.length, 0);
  } catch (const std::bad_alloc&) {
    stage_ = Stage::kDone;
    return absl::ResourceExhaustedError(
        absl::StrCat("secure aggregation: no memory for the sum of ", config_.length, " words"));
  }
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
    return absl::InvalidArgumentError(absl::StrCat(
        "secure aggregation: member ", index, " sent a masked input but did not share its keys"));
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

StatusOr<std::map<uint32_t, UnmaskRequest>> Server::EndMaskedInput() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kMasked, "ending stage 2"));
  u3_.clear();
  for (uint32_t i : u2_) {
    if (members_[i].masked) u3_.push_back(i);
  }
  if (u3_.size() < config_.min_survivors) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation refused: ", u3_.size(), " masked inputs arrived; the minimum is ",
        config_.min_survivors, ": nothing is unmasked"));
  }
  if (!Connected(graph_, u3_)) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation refused: the ", u3_.size(),
        " members that sent masked inputs are not connected in the round's graph (a part's own "
        "sum would be revealed): nothing is unmasked"));
  }
  stage_ = Stage::kUnmask;
  std::map<uint32_t, UnmaskRequest> out;
  for (uint32_t i : u3_) {
    UnmaskRequest& r = out[i];
    r.total = static_cast<uint32_t>(u3_.size());
    r.survivors.push_back(i);
    for (uint32_t j : graph_[i]) {
      if (Contains(u3_, j)) r.survivors.push_back(j);
    }
    std::sort(r.survivors.begin(), r.survivors.end());
  }
  return out;
}

Status Server::OnUnmask(uint32_t index, const UnmaskResponse& response) {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kUnmask, "an unmask response"));
  HUDDLE_RETURN_IF_ERROR(CheckIndex(index));
  if (!Contains(u3_, index)) {
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
                          Contains(u3_, r.owner) == survivor && owners.insert(r.owner).second;
    if (!ok_owner) {
      return absl::InvalidArgumentError(absl::StrCat(
          "secure aggregation: member ", index, " revealed a ", survivor ? "self-mask" : "mask-key",
          " share of member ", r.owner,
          ": not a neighbour that shared its keys, of the wrong kind for it, or twice"));
    }
    if (r.share.x != SharePoint(index) ||
        std::any_of(r.share.y.begin(), r.share.y.end(),
                    [](uint64_t y) { return y >= kFieldPrime; })) {
      return absl::InvalidArgumentError(absl::StrCat("secure aggregation: member ", index,
                                                     "'s share of member ", r.owner,
                                                     " is not at its point or not in the field"));
    }
    return absl::OkStatus();
  };
  for (const RevealedShare& r : response.self_mask_shares) HUDDLE_RETURN_IF_ERROR(check(r, true));
  for (const RevealedShare& r : response.mask_key_shares) HUDDLE_RETURN_IF_ERROR(check(r, false));
  for (const RevealedShare& r : response.self_mask_shares) {
    members_[r.owner].self_mask_shares.push_back(r.share);
  }
  for (const RevealedShare& r : response.mask_key_shares) {
    members_[r.owner].mask_key_shares.push_back(r.share);
  }
  members_[index].responded = true;
  return absl::OkStatus();
}

StatusOr<std::vector<uint64_t>> Server::Finish() {
  HUDDLE_RETURN_IF_ERROR(Expect(Stage::kUnmask, "unmasking"));
  stage_ = Stage::kDone;
  u4_.clear();
  for (uint32_t i : u3_) {
    if (members_[i].responded) u4_.push_back(i);
  }
  const int t = static_cast<int>(config_.threshold);
  // Every secret is rebuilt and checked before any mask is removed.
  std::vector<Secret> self_masks;
  self_masks.reserve(u3_.size());
  for (uint32_t i : u3_) {
    const Member& m = members_[i];
    if (m.self_mask_shares.size() < config_.threshold) {
      return absl::FailedPreconditionError(absl::StrCat(
          "secure aggregation refused: member ", i, "'s self mask has ", m.self_mask_shares.size(),
          " shares, fewer than the threshold ", t, ": nothing is unmasked"));
    }
    StatusOr<Secret> b = Combine(m.self_mask_shares, t);
    if (!b.ok() || Hash(*b) != *m.commitment) {
      return absl::DataLossError(
          absl::StrCat("secure aggregation refused: the shares of member ", i,
                       "'s self mask do not rebuild the seed it committed to",
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
    if (Contains(u3_, j)) continue;
    const Member& m = members_[j];
    const bool has_survivor = std::any_of(graph_[j].begin(), graph_[j].end(),
                                          [&](uint32_t i) { return Contains(u3_, i); });
    if (!has_survivor) continue;  // its pairwise masks are in no survivor's input
    if (m.mask_key_shares.size() < config_.threshold) {
      return absl::FailedPreconditionError(
          absl::StrCat("secure aggregation refused: dropped member ", j, "'s mask key has ",
                       m.mask_key_shares.size(), " shares, fewer than the threshold ", t,
                       ": nothing is unmasked"));
    }
    StatusOr<Secret> key = Combine(m.mask_key_shares, t);
    StatusOr<KeyPair> pair = key.ok() ? KeyPair::FromSecret(*key) : StatusOr<KeyPair>(key.status());
    if (key.ok()) sodium_memzero(key->data(), key->size());
    if (!pair.ok() || pair->public_key() != m.keys->mask_key) {
      return absl::DataLossError(
          absl::StrCat("secure aggregation refused: the shares of dropped member ", j,
                       "'s mask key do not rebuild the key it advertised"));
    }
    dropped.push_back({j, *std::move(pair)});
  }
  for (Secret& b : self_masks) {
    HUDDLE_RETURN_IF_ERROR(AddMask(b, config_.bits, -1, sum_));
    sodium_memzero(b.data(), b.size());
  }
  for (const Dropped& d : dropped) {
    for (uint32_t i : graph_[d.index]) {
      if (!Contains(u3_, i)) continue;
      HUDDLE_ASSIGN_OR_RETURN(Secret seed, AgreeKey(d.key, members_[i].keys->mask_key, kMaskPurpose,
                                                    SessionBytes(config_.session)));
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
