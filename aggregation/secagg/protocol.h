// Secure aggregation: the coordinator learns the sum of a cohort's integer vectors (modulo 2^bits)
// and nothing else about any one of them. SecAgg (Bonawitz et al., CCS 2017) over SecAgg+'s sparse
// random graph (Bell et al., CCS 2020; aggregation/secagg/graph.h), honest-but-curious coordinator.
//
// Each of the round's n members has an index i in [0, n) and k neighbours. Per round, fresh keys:
//
//   stage 0  advertise   member i: two X25519 pairs, (c_i) for encrypting shares and (s_i) for
//                        masks; sends both public keys.              Server::OnAdvertise
//            coordinator: U1 = who advertised; to each, its neighbours in U1 with their keys
//                                                                     Server::EndAdvertise
//   stage 1  share keys  member i: a random 32-byte self-mask seed b_i; Shamir shares (t of k,
//                        shamir.h) of b_i and of s_i's secret key for each neighbour j, each pair
//                        sealed to j (XChaCha20-Poly1305 under AgreeKey(c_i, c_j), bound to the
//                        session, i and j); and a commitment BLAKE2b(b_i). Client::SealShares
//            coordinator: U2 = who shared with every listed neighbour; to each, the ciphertexts
//                        addressed to it from U2                       Server::EndShareKeys
//   stage 2  masked      member i: y_i = x_i + PRG(b_i) + sum over its neighbours j in U2 of
//            input       +PRG(s_ij) if i < j, -PRG(s_ij) if i > j (s_ij = AgreeKey(s_i, s_j), the
//                        same for both; PRG: ChaCha20, crypto.h), mod 2^bits.  Client::MaskInput
//            coordinator: adds the y_i as they arrive (O(length) memory); U3 = who sent one. It
//                        refuses to go on (nothing is revealed) when |U3| < min_survivors or U3 is
//                        not connected in the graph (a component's own sum would show).
//                                                                     Server::EndMaskedInput
//   stage 3  unmask      member j in U3, told |U3| and which of its neighbours are in U3: for each
//                        neighbour i it holds shares of, the
//                        share of b_i if i is in U3, of s_i's key if not; never both, and nothing
//                        when U3 is below the minimum.                Client::Unmask
//            coordinator: rebuilds each b_i of U3 and each dropped member's key from >= t shares
//                        (checked against the commitment and the advertised public key), removes
//                        the self masks and the dropped members' pairwise masks from the sum, and
//                        releases sum of x_i over U3; with fewer than t shares of any secret it
//                        releases nothing.                             Server::Finish
//
// Pairwise masks between survivors cancel in the sum; those with members that dropped after stage
// 1 are removed by rebuilding the dropped member's key; the self mask keeps a survivor's input
// hidden even if its pairwise masks are rebuilt (a member thought dropped that was only late).
// Members may drop at any stage; the round completes as long as every needed secret still has t
// shares, and is refused otherwise.
//
// Threat model (docs/security.md): the coordinator follows the protocol but tries to learn inputs
// from what it sees; up to the fraction of members the graph was chosen for may collude with it.
// Against a coordinator that deviates (sends different U3 lists to different members, forges keys),
// SecAgg's consistency round with signatures would be needed; it is not implemented. A member's
// input is not checked (it is masked): a malicious member can corrupt the sum, not learn others'.
//
// Every message is validated and refused with an error naming the member and what is wrong; a
// refused message changes nothing. Thread-safety: none (one thread per object).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "aggregation/secagg/crypto.h"
#include "aggregation/secagg/graph.h"
#include "aggregation/secagg/shamir.h"
#include "common/status.h"

namespace huddle::aggregation::secagg {

using SessionId = std::array<uint8_t, 32>;

// The most neighbours a member may have (a complete graph of up to 401 members): every stage's
// message then stays small (proto/messages.h's kMaxSecAggNeighbours).
inline constexpr int kMaxNeighbours = 400;

// What every member is told before stage 0.
struct SessionConfig {
  SessionId session{};         // random per round: binds every key, share and mask to it
  uint32_t members = 0;        // n
  uint32_t threshold = 0;      // t: shares that rebuild a secret
  int bits = 32;               // inputs and sums are integers mod 2^bits, bits 32 or 64
  uint64_t length = 0;         // words in an input
  uint32_t min_survivors = 0;  // fewer masked inputs than this: nothing is unmasked
};

// Stage 0, member -> coordinator.
struct AdvertiseKeys {
  PublicKey cipher_key{};
  PublicKey mask_key{};
};
// Stage 0 -> 1, coordinator -> member: its neighbours that advertised.
struct Neighbour {
  uint32_t index = 0;
  AdvertiseKeys keys;
};
struct KeyList {
  std::vector<Neighbour> neighbours;
};
// Stage 1, member -> coordinator.
struct SealedShare {
  uint32_t peer = 0;  // to (from the member) or from (to the member)
  std::vector<uint8_t> ciphertext;
};
struct ShareKeys {
  std::array<uint8_t, 32> self_mask_commitment{};  // BLAKE2b-256 of b_i
  std::vector<SealedShare> shares;                 // one for each neighbour of the KeyList
};
// Stage 1 -> 2, coordinator -> member: what its neighbours in U2 sealed to it.
struct ShareList {
  std::vector<SealedShare> shares;
};
// Stage 2 -> 3, coordinator -> member: how many masked inputs arrived (|U3|), and which of the
// member's neighbours (and itself) are among them: all it needs, so that the message stays O(k).
struct UnmaskRequest {
  uint32_t total = 0;               // |U3|
  std::vector<uint32_t> survivors;  // U3 among the member and its neighbours, sorted
};
// Stage 3, member -> coordinator.
struct RevealedShare {
  uint32_t owner = 0;  // whose secret this is a share of
  Share share;
};
struct UnmaskResponse {
  std::vector<RevealedShare> self_mask_shares;  // of neighbours in U3
  std::vector<RevealedShare> mask_key_shares;   // of neighbours not in U3
};

// The Shamir point of member i's shares: i + 1.
inline uint64_t SharePoint(uint32_t index) { return uint64_t{index} + 1; }
// The bytes a share's seal is bound to (session, sender, receiver).
std::vector<uint8_t> ShareAssociatedData(const SessionId& session, uint32_t from, uint32_t to);

// One member's side.
class Client {
 public:
  // InvalidArgument for a config out of range (bits, members < 2, threshold, index >= members).
  static StatusOr<Client> Create(const SessionConfig& config, uint32_t index);

  const SessionConfig& config() const { return config_; }
  uint32_t index() const { return index_; }

  // Stage 0.
  AdvertiseKeys Advertise() const;
  // Stage 1. InvalidArgument for a list naming this member, a member twice or one out of range,
  // or a small-order key; FailedPrecondition for fewer than `threshold` neighbours.
  StatusOr<ShareKeys> SealShares(const KeyList& keys);
  // Stage 2: the masked `input` (config().length words, each < 2^bits). InvalidArgument for a
  // wrong length or a word out of range, a share from a member that is not a listed neighbour or
  // sent twice; DataLoss for a ciphertext that fails authentication; FailedPrecondition for fewer
  // than `threshold` neighbours' shares, or when called out of order.
  StatusOr<std::vector<uint64_t>> MaskInput(const ShareList& shares,
                                            std::span<const uint64_t> input);
  // Stage 3. FailedPrecondition (nothing revealed) when U3 has fewer than min_survivors members or
  // does not list this member; InvalidArgument for an unsorted list, repeats, a member that is
  // neither this one nor a neighbour, or a total below the list's length.
  StatusOr<UnmaskResponse> Unmask(const UnmaskRequest& request);

 private:
  Client(const SessionConfig& config, uint32_t index);

  enum class Stage { kAdvertised, kShared, kMasked, kDone };
  SessionConfig config_;
  uint32_t index_ = 0;
  Stage stage_ = Stage::kAdvertised;
  KeyPair cipher_;
  KeyPair mask_;
  std::map<uint32_t, AdvertiseKeys> neighbours_;  // from the KeyList
  Secret self_mask_seed_{};                       // b_i (stage 1 on)
  // Shares this member holds of its neighbours' secrets (from the ShareList): index -> (b, key).
  std::map<uint32_t, std::pair<secagg::Share, secagg::Share>> held_;

 public:
  Client(const Client&) = default;
  Client(Client&&) = default;
  Client& operator=(const Client&) = default;
  Client& operator=(Client&&) = default;
  ~Client();  // wipes b_i and the shares held (the key pairs wipe themselves)
};

struct ServerOptions {
  uint32_t members = 0;  // n
  int bits = 32;
  uint64_t length = 0;
  uint32_t min_survivors = 0;  // in [threshold, members]; raised to the threshold when lower
  // The graph: k and t chosen from these (graph.h), unless `parameters` is given.
  GraphOptions graph;
  std::optional<GraphParameters> parameters;
};

// The coordinator's side: one round's session.
class Server {
 public:
  // Draws the session id and the graph. InvalidArgument for options out of range, or more than
  // kMaxNeighbours neighbours.
  static StatusOr<Server> Create(const ServerOptions& options);

  const SessionConfig& config() const { return config_; }
  const GraphParameters& parameters() const { return parameters_; }
  const std::vector<uint32_t>& neighbours(uint32_t index) const { return graph_[index]; }

  // Stage 0. InvalidArgument for an index out of range, a second message or a small-order key.
  Status OnAdvertise(uint32_t index, const AdvertiseKeys& keys);
  // Ends stage 0: each advertiser's neighbours that advertised. FailedPrecondition (the round is
  // refused) with fewer than min_survivors advertisers.
  StatusOr<std::map<uint32_t, KeyList>> EndAdvertise();
  // Stage 1. InvalidArgument unless it holds exactly one share for each neighbour the member was
  // listed, each of a plausible size; for a member that did not advertise or sent before.
  Status OnShareKeys(uint32_t index, const ShareKeys& shares);
  // Ends stage 1: for each member of U2, the shares sealed to it by its neighbours in U2.
  // FailedPrecondition with fewer than min_survivors in U2.
  StatusOr<std::map<uint32_t, ShareList>> EndShareKeys();
  // Stage 2: a member of U2's masked input, added to the sum. InvalidArgument for a wrong length,
  // a word >= 2^bits, a member not in U2 or a second input (the sum is then unchanged).
  Status OnMaskedInput(uint32_t index, std::span<const uint64_t> words);
  Status OnMaskedInput(uint32_t index, std::span<const uint32_t> words);  // bits 32
  // Ends stage 2: for each member of U3, its UnmaskRequest. FailedPrecondition (nothing will be
  // unmasked) with fewer than min_survivors, or when U3 is not connected in the graph.
  StatusOr<std::map<uint32_t, UnmaskRequest>> EndMaskedInput();
  // Stage 3. InvalidArgument for a member not in U3, a second response, a share of a
  // non-neighbour, of the wrong kind for its owner (a key share of a survivor, a self-mask share of
  // a dropped member), a repeated owner, or a share point that is not the sender's.
  Status OnUnmask(uint32_t index, const UnmaskResponse& response);
  // The sum of U3's inputs mod 2^bits. FailedPrecondition when some needed secret has fewer than t
  // shares; DataLoss when shares rebuild a secret that fails its check (commitment, public key).
  // Either way nothing is released.
  StatusOr<std::vector<uint64_t>> Finish();

  // Members that advertised (U1), shared (U2), sent a masked input (U3), answered stage 3 (U4).
  const std::vector<uint32_t>& advertised() const { return u1_; }
  const std::vector<uint32_t>& shared() const { return u2_; }
  const std::vector<uint32_t>& survivors() const { return u3_; }
  const std::vector<uint32_t>& responders() const { return u4_; }

 private:
  Server() = default;
  enum class Stage { kAdvertise, kShare, kMasked, kUnmask, kDone };
  struct Member {
    std::optional<AdvertiseKeys> keys;
    std::vector<uint32_t> listed;  // neighbours in its KeyList (stage 1)
    std::optional<std::array<uint8_t, 32>> commitment;
    std::vector<SealedShare> shares;  // sealed by it, until EndShareKeys
    bool masked = false;
    bool responded = false;
    std::vector<secagg::Share> self_mask_shares;  // of its b, revealed by its neighbours
    std::vector<secagg::Share> mask_key_shares;   // of its s key, revealed by its neighbours
  };
  Status Expect(Stage stage, const char* what) const;
  Status CheckIndex(uint32_t index) const;
  // Undo a partially added input (stage 2's validation failed mid-way).
  void Subtract(std::span<const uint64_t> words, size_t count);

  SessionConfig config_;
  GraphParameters parameters_;
  std::vector<std::vector<uint32_t>> graph_;
  std::vector<Member> members_;
  Stage stage_ = Stage::kAdvertise;
  std::vector<uint64_t> sum_;  // sum of masked inputs mod 2^64
  std::vector<uint32_t> u1_, u2_, u3_, u4_;
  uint64_t modulus_mask_ = 0;  // 2^bits - 1
};

}  // namespace huddle::aggregation::secagg
