#include "privacy/distributed.h"

#include <utility>

#include "privacy/accountant.h"

namespace huddle::privacy {

LedgerEntry DistributedRelease(uint64_t round, const DistributedShares& shares, double clip_norm,
                               std::string noise) {
  const DpEvent sum = DistributedDiscreteGaussianEvent(shares.variance, shares.honest_members,
                                                       shares.sensitivity, shares.dimension);
  return LedgerEntry::DistributedSum(round, sum, clip_norm, std::move(noise));
}

}  // namespace huddle::privacy
