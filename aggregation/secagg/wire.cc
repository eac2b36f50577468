#include "aggregation/secagg/wire.h"

#include <algorithm>
#include <cstring>

namespace huddle::aggregation::secagg {

namespace {

template <size_t N>
std::string Bytes(const std::array<uint8_t, N>& a) {
  return std::string(reinterpret_cast<const char*>(a.data()), a.size());
}

// The codec has checked the length; a shorter string leaves the rest zero.
template <size_t N>
std::array<uint8_t, N> Array(const std::string& s) {
  std::array<uint8_t, N> a{};
  std::memcpy(a.data(), s.data(), std::min(N, s.size()));
  return a;
}

std::vector<uint8_t> Vec(const std::string& s) { return {s.begin(), s.end()}; }
std::string Str(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

std::vector<wire::SecAggSealedShare> SharesToWire(const std::vector<SealedShare>& shares) {
  std::vector<wire::SecAggSealedShare> out;
  out.reserve(shares.size());
  for (const SealedShare& s : shares) out.push_back({s.peer, Str(s.ciphertext)});
  return out;
}

std::vector<SealedShare> SharesFromWire(const std::vector<wire::SecAggSealedShare>& shares) {
  std::vector<SealedShare> out;
  out.reserve(shares.size());
  for (const wire::SecAggSealedShare& s : shares) out.push_back({s.peer, Vec(s.ciphertext)});
  return out;
}

std::vector<wire::SecAggRevealedShare> RevealedToWire(const std::vector<RevealedShare>& shares) {
  std::vector<wire::SecAggRevealedShare> out;
  out.reserve(shares.size());
  for (const RevealedShare& r : shares) out.push_back({r.owner, r.share.y});
  return out;
}

std::vector<RevealedShare> RevealedFromWire(const std::vector<wire::SecAggRevealedShare>& shares,
                                            uint32_t sender) {
  std::vector<RevealedShare> out;
  out.reserve(shares.size());
  for (const wire::SecAggRevealedShare& r : shares) {
    RevealedShare s;
    s.owner = r.owner;
    s.share.x = SharePoint(sender);
    s.share.y = r.y;
    out.push_back(s);
  }
  return out;
}

}  // namespace

StatusOr<SessionConfig> SessionFromWire(const wire::SecureAggregation& a) {
  if (a.session.size() != SessionId{}.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation: a session id of ", a.session.size(), " bytes"));
  }
  SessionConfig c;
  c.session = Array<32>(a.session);
  c.members = a.members;
  c.threshold = a.threshold;
  c.bits = static_cast<int>(a.bits);
  c.length = a.length;
  c.min_survivors = a.min_survivors;
  return c;
}

wire::SecureAggregation SessionToWire(const SessionConfig& c, uint32_t index) {
  wire::SecureAggregation a;
  a.session = Bytes(c.session);
  a.index = index;
  a.members = c.members;
  a.threshold = c.threshold;
  a.bits = static_cast<uint32_t>(c.bits);
  a.length = c.length;
  a.min_survivors = c.min_survivors;
  return a;
}

wire::SecAggAdvertise ToWire(const AdvertiseKeys& keys, const std::string& nonce) {
  return {nonce, Bytes(keys.cipher_key), Bytes(keys.mask_key)};
}

AdvertiseKeys FromWire(const wire::SecAggAdvertise& m) {
  return {Array<32>(m.cipher_key), Array<32>(m.mask_key)};
}

wire::SecAggKeyList ToWire(const KeyList& list) {
  wire::SecAggKeyList out;
  for (const Neighbour& n : list.neighbours) {
    out.neighbours.push_back({n.index, Bytes(n.keys.cipher_key), Bytes(n.keys.mask_key)});
  }
  return out;
}

KeyList FromWire(const wire::SecAggKeyList& m) {
  KeyList out;
  for (const wire::SecAggNeighbour& n : m.neighbours) {
    out.neighbours.push_back({n.index, {Array<32>(n.cipher_key), Array<32>(n.mask_key)}});
  }
  return out;
}

wire::SecAggShares ToWire(const ShareKeys& shares, const std::string& nonce) {
  return {nonce, Bytes(shares.self_mask_commitment), SharesToWire(shares.shares)};
}

ShareKeys FromWire(const wire::SecAggShares& m) {
  return {Array<32>(m.self_mask_commitment), SharesFromWire(m.shares)};
}

wire::SecAggShareList ToWire(const ShareList& list) { return {SharesToWire(list.shares)}; }

ShareList FromWire(const wire::SecAggShareList& m) { return {SharesFromWire(m.shares)}; }

wire::SecAggUnmask ToWire(const UnmaskRequest& request) {
  return {request.survivors, request.total};
}

UnmaskRequest FromWire(const wire::SecAggUnmask& m) { return {m.total, m.survivors}; }

wire::SecAggUnmaskResponse ToWire(const UnmaskResponse& response, const std::string& nonce) {
  return {nonce, RevealedToWire(response.self_mask_shares),
          RevealedToWire(response.mask_key_shares)};
}

UnmaskResponse FromWire(const wire::SecAggUnmaskResponse& m, uint32_t sender) {
  return {RevealedFromWire(m.self_mask_shares, sender),
          RevealedFromWire(m.mask_key_shares, sender)};
}

}  // namespace huddle::aggregation::secagg
