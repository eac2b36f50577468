// Secure aggregation's communication graph (SecAgg+, Bell, Bonawitz, Gascón, Lepoint and Raykova,
// CCS 2020): instead of every pair of a session's n members agreeing on a mask and holding shares
// of each other's secrets (SecAgg, Bonawitz et al. 2017: O(n) per member), each member does so with
// its neighbours in a sparse random graph, and any t of a member's neighbours can rebuild its
// secrets.
//
// The graph is G(n, p): each pair of members is joined independently with probability p =
// edge_threshold / 2^32, decided by a 32-bit word of a ChaCha20 keystream keyed with the session's
// joint seed (RandomGraph): a seed the members draw together after the member list is fixed
// (aggregation/secagg/protocol.h), so that the coordinator cannot choose who neighbours whom; it
// can only abort a session and start another. p = 1 is the complete graph (plain SecAgg). Expected
// degree k = p (n - 1).
//
// The adversary: an active coordinator together with up to c = floor(corrupt_fraction * n) of the
// session's members (fixed before the seed), which pool everything they hold. It decides which
// members count as survivors (the consistency round makes every honest member see the same sets),
// so it can drop honest members at will, as long as at least m = min_survivors survive. Every bound
// below is a union bound computed exactly in log space (Chernoff bounds where an exact tail would
// cost O(n^2)), over the graph's randomness only:
//
//   privacy      a member's secrets leak when >= t of its neighbours collude:
//                n * P[Binomial(c, p) >= t] (PrivacyBits; for the complete graph, t > c exactly).
//   reliability  a round cannot finish when a member has fewer than t surviving neighbours
//                (each dropping with probability `dropout_fraction`): n * P[Binomial(n - 1,
//                p (1 - dropout)) < t] (ReliabilityBits). A wish, not a guarantee.
//   isolation    the coordinator learns the sum of each connected part ("component") of the
//                honest survivors in the graph, not just of all of them: it removes the masks a
//                part shares with dropped members (their keys are rebuilt) and with colluders (it
//                knows those). Splitting the honest survivors needs every honest neighbour of a
//                part outside it dropped, and there are at most n - m of those. A part W of w
//                honest members has N(W) outside W, colluders aside, distributed as Binomial(n - w
//                - c, 1 - (1 - p)^w): for every w up to half the honest members,
//                  C(n - c, w) P[Binomial(n - w - c, 1 - (1 - p)^w) <= n - m]
//                bounds the chance that some part of w can be cut off. IsolationBound takes the
//                largest w whose bound is not negligible as the most the coordinator can cut away
//                from a victim's part (the rest of the honest survivors: `cut`), and checks that
//                the victim's own part cannot be the small one: a small part whose members' self
//                masks can all be rebuilt needs each member to have >= t neighbours inside it or
//                among the colluders, i.e. 2 Binomial(C(w, 2), p) + Binomial(w c, p) >= t w,
//                together with the cut above (independent edge sets).
//   So the sum that holds any honest survivor holds at least m - c - cut honest members
//   (HonestShares): distributed DP sizes every member's noise share for that many.
//
// The total failure probability (privacy + the isolation tail + the small-part bound,
// ChooseParameters giving the first two a quarter of the budget each) is at most 2^-security_bits
// per session. A coordinator that aborts sessions to draw again multiplies it by the sessions it
// gets; clients bound their sessions per round (client/secagg_member.h).
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace huddle::aggregation::secagg {

using GraphSeed = std::array<uint8_t, 32>;

// The most neighbours a member may have (the complete graph of up to 1001 members).
inline constexpr int kMaxNeighbours = 1000;
// The most members of a session.
inline constexpr int64_t kMaxMembers = 65536;
// Edge threshold of the complete graph: every 32-bit word is below it.
inline constexpr uint64_t kCompleteGraph = uint64_t{1} << 32;

struct GraphOptions {
  double corrupt_fraction = 0.1;  // of the session, colluding with the coordinator; in [0, 0.5)
  double dropout_fraction = 0.1;  // of the session, gone before unmasking; in [0, 1)
  int security_bits = 40;         // total failure <= 2^-security_bits; in [8, 128]
  int reliability_bits = 20;      // a round failing for too few neighbours <= 2^-this; in [1, 64]
};

struct GraphParameters {
  int neighbours = 0;           // k: expected degree (n - 1: the complete graph)
  uint64_t edge_threshold = 0;  // an edge exists when its word is below this; in [1, 2^32]
  int threshold = 0;            // t: shares that rebuild a member's secret
  // What ChooseParameters achieved (-log2 of the bounds above; +inf: impossible).
  double privacy_bits = 0;
  double reliability_bits = 0;
};

// The colluding members a session of n is secured against: floor(corrupt_fraction * n).
int64_t Colluders(double corrupt_fraction, int64_t n);
// p = edge_threshold / 2^32 for an expected degree k among n members (k >= n - 1: 2^32).
uint64_t EdgeThreshold(int64_t n, int k);
double EdgeProbability(uint64_t edge_threshold);

// -log2 of the union bounds above; +inf where the probability is 0.
double PrivacyBits(int64_t n, uint64_t edge_threshold, int t, int64_t colluders);
double ReliabilityBits(int64_t n, uint64_t edge_threshold, int t, double dropout_fraction);

// How far an active coordinator can split a session's honest survivors (see above).
struct Isolation {
  int64_t cut = 0;  // honest survivors it can cut away from any victim's part
  // -log2 of the total failure probability: privacy + the isolation tail beyond `cut` + the
  // victim's part being small.
  double failure_bits = 0;
};
// InvalidArgument for arguments out of range (min_survivors in [1, n], colluders in [0, n)).
StatusOr<Isolation> IsolationBound(int64_t n, uint64_t edge_threshold, int t, int64_t colluders,
                                   int64_t min_survivors, int security_bits);

// The honest members any sum the coordinator can unmask holds: min_survivors - colluders - cut.
// FailedPrecondition when that is below 1 or the bound misses 2^-security_bits (a graph too sparse
// for the session: the message says which).
StatusOr<int64_t> HonestShares(int64_t n, uint64_t edge_threshold, int t, int64_t colluders,
                               int64_t min_survivors, int security_bits);

// Signatures over one survivor set that a member needs before it reveals anything: more than half
// of the members the colluders aside, floor((n + c) / 2) + 1, so that no two different sets can
// both gather them (honest members sign one set per session).
int64_t ConsistencyQuorum(int64_t n, int64_t colluders);

// k, p and t for a session of n >= 2 members of which at least min_survivors must survive: the
// smallest even k (up to the complete graph) whose smallest private t also meets reliability and
// the isolation bound; the complete graph with the best reliability when none does.
// InvalidArgument for options out of range, or when not even the complete graph keeps a member's
// secrets from the colluders.
StatusOr<GraphParameters> ChooseParameters(int64_t n, int64_t min_survivors,
                                           const GraphOptions& options);

// Member i's neighbours (sorted) in the graph of `seed` over n members. InvalidArgument for n out
// of [2, kMaxMembers], i >= n or a threshold out of [1, 2^32].
StatusOr<std::vector<uint32_t>> Neighbours(const GraphSeed& seed, int64_t n,
                                           uint64_t edge_threshold, uint32_t i);
// Every member's neighbours (the same rows as Neighbours).
StatusOr<std::vector<std::vector<uint32_t>>> RandomGraph(const GraphSeed& seed, int64_t n,
                                                         uint64_t edge_threshold);

// Whether `members` (any order) induce a connected subgraph of `graph`. An empty set is not.
bool Connected(const std::vector<std::vector<uint32_t>>& graph,
               const std::vector<uint32_t>& members);

}  // namespace huddle::aggregation::secagg
