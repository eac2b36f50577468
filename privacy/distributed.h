// The release of one distributed-DP round (budget.h, "distributed"), computed one way wherever it
// is computed: by the coordinator when it plans and accounts the round (coordinator/
// secure_round.cc) and by each client's guard from its own view of the session before it adds
// its share (client/privacy_guard.h). Each side checks with its own inputs; the formula is this
// one.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "privacy/ledger.h"

namespace huddle::privacy {

// What the secure sum of a round holds, as one party counts it.
struct DistributedShares {
  uint64_t variance = 0;       // each member's share: N_Z(0, variance) per coordinate, >= 1
  int64_t honest_members = 0;  // the fewest honest shares any sum that can be unmasked holds
  double sensitivity = 0;      // the clipped update's L2 bound on the grid (secagg's Delta) > 0
  int64_t dimension = 0;       // the values summed, d >= 1
};

// The round's ledger entry (LedgerEntry::DistributedSum): the sum's noise multiplier
// sqrt(honest_members * variance) / sensitivity and Kairouz et al.'s tau for that many shares
// (DistributedDiscreteGaussianEvent), q = 1, client-level, replace-one; `job` and `release` are
// the caller's to add.
LedgerEntry DistributedRelease(uint64_t round, const DistributedShares& shares, double clip_norm,
                               std::string noise);

}  // namespace huddle::privacy
