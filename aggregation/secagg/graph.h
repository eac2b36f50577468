// SecAgg+'s communication graph (Bell, Bonawitz, Gascón, Lepoint and Raykova, CCS 2020): instead of
// every pair of the cohort's n members agreeing on a mask and holding shares of each other's
// secrets (SecAgg, Bonawitz et al. 2017: O(n) per client), each member does so with its k
// neighbours in a random k-regular graph, k = O(log n), and any t of a member's neighbours can
// rebuild its secrets.
//
// The graph is a Harary graph over a uniformly random ordering of the members (drawn from the OS
// CSPRNG by the coordinator, which follows the protocol): the members sit on a cycle in that order
// and each is joined to the k/2 nearest on either side. With k >= n - 1 it is the complete graph:
// plain SecAgg.
//
// Choosing k and t (ChooseParameters). Two things must hold for every member, by a union bound over
// the n members:
//   privacy      fewer than t of a member's neighbours are among the clients that collude with the
//                coordinator (floor(corrupt_fraction * n) of the cohort, chosen before the graph),
//                or they could rebuild its secrets and unmask it. A member's neighbours are a
//                uniformly random k-subset of the others, so the number of colluders among them is
//                hypergeometric: n * P[Hypergeometric(n - 1, colluders, k) >= t] <=
//                2^-security_bits (for the complete graph: t > the colluders, exactly);
//   correctness  at least t of a member's neighbours are still there when the coordinator unmasks
//                (each drops independently with probability `dropout_fraction` over the whole
//                round), or the round cannot finish: n * P[Binomial(k, 1 - dropout) < t] <=
//                2^-reliability_bits.
// The smallest even k (capped at n - 1: SecAgg; above 256 searched in steps of 10%) with a t
// meeting both is chosen, t the smallest meeting privacy. Privacy is a requirement, correctness a
// wish: when no graph meets both (a small cohort with many dropouts), the complete graph with the
// smallest t meeting privacy is chosen, and GraphParameters::reliability_bits says what it
// achieves. Both tails are computed exactly (log-space sums of the binomial terms). Beyond that,
// the coordinator refuses to unmask when the survivors' graph is not connected (a component's own
// sum would be revealed) or fewer than the round's minimum survived.
//
// Thread-safety: pure functions (randomness from the thread-safe OS CSPRNG).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace huddle::aggregation::secagg {

struct GraphOptions {
  double corrupt_fraction = 0.1;  // of the cohort, colluding with the coordinator; in [0, 0.5)
  double dropout_fraction = 0.1;  // of the cohort, gone before unmasking; in [0, 1)
  int security_bits = 40;         // privacy failure <= 2^-security_bits; in [8, 128]
  int reliability_bits = 20;      // a round failing for too few neighbours <= 2^-this; in [1, 64]
};

struct GraphParameters {
  int neighbours = 0;  // k: every member's degree (n - 1: the complete graph)
  int threshold = 0;   // t: shares that rebuild a member's secret, in [1, k]
  // What ChooseParameters achieved (-log2 of the union bounds above; +inf: impossible).
  double privacy_bits = 0;
  double reliability_bits = 0;
};

// k and t for a cohort of n >= 2 members (see above). InvalidArgument for options out of range, or
// when not even the complete graph keeps a member's secrets from the colluders.
StatusOr<GraphParameters> ChooseParameters(int64_t n, const GraphOptions& options);

// -log2 of the two union bounds above (privacy: the hypergeometric tail; correctness: the
// binomial), for tests and logs; +inf where the probability is 0.
double PrivacyBits(int64_t n, int k, int t, double corrupt_fraction);

// The colluding members a cohort of n is secured against: floor(corrupt_fraction * n).
int64_t Colluders(double corrupt_fraction, int64_t n);
double ReliabilityBits(int64_t n, int k, int t, double dropout_fraction);

// neighbours[i]: the sorted neighbours of member i (0-based) in a random Harary graph of degree k
// over n members (k rounded up to even; the complete graph when k >= n - 1). InvalidArgument for
// n < 2 or k < 1.
StatusOr<std::vector<std::vector<uint32_t>>> RandomGraph(int64_t n, int k);

// Whether `members` (0-based, any order) induce a connected subgraph of `graph`. An empty set is
// not connected.
bool Connected(const std::vector<std::vector<uint32_t>>& graph,
               const std::vector<uint32_t>& members);

}  // namespace huddle::aggregation::secagg
