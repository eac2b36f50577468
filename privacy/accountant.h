// Privacy accountants: how much (epsilon, delta) a sequence of Gaussian-mechanism releases spends.
//
// Every release Huddle makes under DP is one step of the Poisson-subsampled Gaussian mechanism:
// each record (a client under client-level DP, an example under DP-SGD) is included independently
// with probability q, the included records' contributions (each clipped to L2 norm C) are summed,
// and Gaussian noise of standard deviation z * C is added. z is the noise multiplier. A DpEvent is
// `steps` such releases with the same (q, z); q = 1 means no sampling.
//
// Three accountants, all upper bounds on the true privacy loss (never under-counting):
//  - kRdp: Renyi DP of the subsampled Gaussian (Mironov, Talwar and Zhang 2019), exact to double
//    precision at integer and fractional orders over DefaultRdpOrders(), converted to
//    (epsilon, delta) with the improved conversion of Canonne, Kamath and Steinke 2020 (Prop. 12)
//    / Balle et al. 2020 (Thm. 21), as dp_accounting's RdpAccountant. (dp_accounting 0.6.0 sums
//    the fractional-order series in absolute value, overstating those orders by up to 3x; ours
//    integrates the defining expectation, so our epsilon is <= theirs.) Cheap (~5 ms per event);
//    slightly loose.
//  - kPld: privacy loss distribution (Koskela et al.; Google's dp_accounting PLDAccountant with
//    its defaults: pessimistic connect-the-dots discretization, add/remove adjacency as the max
//    over both directions, 1e-15 tail truncation moved to +infinity), composed by FFT. Tighter
//    than RDP; matches dp_accounting to ~1e-8 relative. Costs grow with 1/z^2 and the spread of
//    the composed loss: q = 0.01, z = 1.1, 10000 steps takes ~0.3 s.
//  - kAnalytic: only for q = 1 events: the T-fold composition of Gaussian mechanisms with
//    multipliers z_i is one Gaussian with multiplier (sum z_i^-2)^-1/2, whose exact (epsilon,
//    delta) curve is Balle and Wang 2018 (Thm. 8). Exact, not just a bound.
//
// Units: epsilon in nats (natural log), delta a probability, q in [0, 1], z > 0.
// Thread-safety: all functions are thread-safe (no shared mutable state).
// Errors: InvalidArgument for out-of-range or NaN inputs; FailedPrecondition for kAnalytic with
// q < 1, and for kPld or kAnalytic given a kDistributedDiscreteGaussian event; ResourceExhausted
// when a computation would pass a work limit (a PLD of more than 2^24 grid points: tiny z or
// interval, or a huge number of steps; an RDP beyond its bounded exact methods); Cancelled when the
// caller's `stop` flag turns true. Work is bounded for every input: no function allocates from an
// unchecked value, loops without an iteration bound, or throws. The PLD and calibration calls, the
// only ones that can take seconds (a PLD near its 2^24-point limit), take an optional `stop` flag
// (e.g. set by a SIGINT handler), checked often enough that they return Cancelled within ~0.3 s of
// it turning true.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace huddle::privacy {

// What is released at each step.
//  - kGaussian: the sum of the clipped contributions plus Gaussian noise of std z * C (above).
//  - kDistributedDiscreteGaussian: the sum of n members' integer vectors on d coordinates, each
//    member adding its own discrete Gaussian share N_Z(0, s) per coordinate, the sum's L2
//    sensitivity being Delta on that grid (distributed DP under secure aggregation). A sum of
//    discrete Gaussians is not a discrete Gaussian; Kairouz, Liu and Steinke 2021 (Prop. 14 /
//    Eq. 17 with Thm. 1) bound its RDP at every order alpha >= 1 by
//      min(alpha / (2 z^2) + tau d, alpha / 2 (1 / z + tau sqrt(d))^2),
//    z = sqrt(n s) / Delta, tau = DistributedDiscreteGaussianTau(s, n). Accounted by the RDP
//    accountant only (the bound is an RDP one), and only unsampled (q = 1): amplification by
//    sampling would need the sampling hidden from the party the noise protects against.
enum class Mechanism { kGaussian, kDistributedDiscreteGaussian };
const char* MechanismName(Mechanism mechanism);  // "gaussian", "distributed_discrete_gaussian"

struct DpEvent {
  double sampling_rate = 1.0;     // q in [0, 1]
  double noise_multiplier = 0.0;  // z > 0 (z = inf is allowed and spends nothing)
  int64_t steps = 1;              // >= 0
  Mechanism mechanism = Mechanism::kGaussian;
  double tau = 0;         // kDistributedDiscreteGaussian: >= 0, finite
  int64_t dimension = 0;  // kDistributedDiscreteGaussian: d >= 1
};

// Kairouz et al.'s tau for the sum of `members` (>= 1) discrete Gaussians N_Z(0, variance):
// 10 sum_{k=1}^{members-1} exp(-2 pi^2 variance k / (k + 1)), rounded up. 0 for one member (a
// single discrete Gaussian is exactly one); below 1e-316 per member once variance > ~76 (every
// term underflows: each counts as the smallest subnormal). NaN for variance < 1/4 (outside the
// theorem) or members < 1.
double DistributedDiscreteGaussianTau(double variance, int64_t members);

// The event of one sum of `members` (>= 1) discrete Gaussian shares of integer variance
// `variance` (>= 1) on `dimension` coordinates whose L2 sensitivity on the grid is `sensitivity`
// (> 0): noise multiplier sqrt(members * variance) / sensitivity, tau as above, q = 1, one step,
// under add/remove (a ledger entry's replace-one halves the multiplier). The coordinator and a
// client with its own policy compute a round's release with it.
DpEvent DistributedDiscreteGaussianEvent(uint64_t variance, int64_t members, double sensitivity,
                                         int64_t dimension);

// RDP at order alpha >= 1 of one step of a kDistributedDiscreteGaussian event with q = 1 (the
// bound above); +inf for z = 0, 0 for z = inf and tau = 0.
double DistributedDiscreteGaussianRdp(double noise_multiplier, double tau, int64_t dimension,
                                      double alpha);

enum class AccountantKind { kRdp, kPld, kAnalytic };
const char* AccountantName(AccountantKind kind);  // "rdp", "pld", "analytic"
// Parses "rdp", "pld" or "analytic"; InvalidArgument otherwise (naming the choices).
StatusOr<AccountantKind> ParseAccountant(const std::string& name);

// The Renyi orders the RDP accountant tracks: 1.1, 1.2, ..., 10.9, 11, 12, ..., 63, 128, 256,
// 512, 1024 (156 orders).
const std::vector<double>& DefaultRdpOrders();

// The largest finite Renyi order SubsampledGaussianRdp takes (accounting uses orders <= 1024).
inline constexpr double kMaxRdpOrder = 1e6;

// One-step RDP at order alpha (> 1) of the Poisson-subsampled Gaussian with rate q and noise
// multiplier z: log(A_alpha) / (alpha - 1) with A_alpha = E_{x~N(0,z^2)}[(1 - q + q e^{(2x-1) /
// (2 z^2)})^alpha]. Exact (to ~1e-14 relative) for every alpha in (1, kMaxRdpOrder], integer or
// not, including tiny q (A_alpha - 1 is computed directly) and tiny z (where one term of A_alpha
// dominates and the RDP has a closed form). 0 for q = 0 or z = inf; alpha / (2 z^2) for q = 1;
// +inf where unbounded (z = 0 with q > 0, alpha = inf) or beyond the largest double (z below
// ~1e-154). InvalidArgument for q outside [0, 1], z < 0, alpha <= 1, finite alpha >
// kMaxRdpOrder, or any NaN. ResourceExhausted in the few cases no bounded method settles
// (alpha / z above ~32000 with alpha within ~1e-6 of 1, or alpha near kMaxRdpOrder with q below
// ~1e-200): never for DefaultRdpOrders(). Takes at most a few tens of milliseconds.
StatusOr<double> SubsampledGaussianRdp(double q, double z, double alpha);

// The smallest epsilon (and the order that gives it) that the RDP curve `rdp` (at `orders`)
// implies at `delta` in (0, 1), by the improved conversion
//   eps(alpha) = rdp(alpha) + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1),
// with dp_accounting's edge cases: an order whose rdp satisfies delta^2 >= 1 - exp(-rdp) gives 0
// (the KL bound), orders <= 1.01 give +inf (unstable), the first minimising order wins, and the
// result is clamped at 0. InvalidArgument for empty or unequal spans, orders < 1 or infinite,
// rdp < 0 or NaN.
struct RdpEpsilon {
  double epsilon = 0;
  double order = 0;
};
StatusOr<RdpEpsilon> RdpToEpsilon(std::span<const double> orders, std::span<const double> rdp,
                                  double delta);

// Exact (epsilon, delta) of one Gaussian mechanism with sensitivity 1 and standard deviation z
// (Balle and Wang 2018): delta(eps) = Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z).
// 0 for z = inf, 1 for z = 0; NaN for NaN or negative z.
double AnalyticGaussianDelta(double z, double epsilon);
// The smallest epsilon >= 0 with AnalyticGaussianDelta(z, epsilon) <= delta (by bisection to
// the last bit, returning the upper end; +inf for z = 0). InvalidArgument for delta outside
// (0, 1) or z < 0 / NaN.
StatusOr<double> AnalyticGaussianEpsilon(double z, double delta);

// What a sequence of events spends.
struct Spend {
  double epsilon = 0;
  double delta = 0;
  AccountantKind accountant = AccountantKind::kRdp;
  std::optional<double> order;  // the optimal Renyi order (kRdp only)
};

// Options of the PLD accountant (defaults match dp_accounting's PLDAccountant).
struct PldOptions {
  double value_discretization_interval = 1e-4;  // grid step of the privacy loss, in nats
};

// Epsilon at `delta` in (0, 1) spent by `events` (in any order; composition commutes). Events
// with steps = 0, q = 0 or z = inf spend nothing (no events: epsilon 0); z = 0 with q > 0 gives
// +inf. kAnalytic requires every event that spends anything to have q = 1 (FailedPrecondition
// otherwise). Under kPld the events are composed in the given order, as dp_accounting does;
// ResourceExhausted past the 2^24-point grid (at the default interval: z below ~0.03 for one step,
// or so many steps that the composed loss spreads over more points, e.g. 2^20 steps at q = 0.1,
// z = 1); each PLD costs O(grid) time, ~10 s on one core near the limit.
// Cancelled if *stop turns true (checked between events and inside the PLD's long loops).
StatusOr<Spend> ComputeEpsilon(std::span<const DpEvent> events, double delta, AccountantKind kind,
                               const PldOptions& pld = {}, const std::atomic<bool>* stop = nullptr);

// ComputeEpsilon with `kind`, except where every event is an unsampled Gaussian (q = 1, e.g.
// local DP): then with kAnalytic, which is exact there and tighter than kRdp or kPld; and where
// any event is a kDistributedDiscreteGaussian: then with kRdp, the only accountant its bound is
// for. No events spend nothing:
// epsilon 0 at `delta` (after the same check of delta). The rule every ledger's spend follows.
StatusOr<Spend> ComputeSpend(std::span<const DpEvent> events, double delta, AccountantKind kind);

// The noise multipliers CalibrateNoiseMultiplier searches.
inline constexpr double kMinCalibratedNoise = 1e-9;
inline constexpr double kMaxCalibratedNoise = 1e12;

// The smallest noise multiplier z for which `steps` steps at rate q spend at most target_epsilon
// at delta with accountant `kind`, to a relative precision of 1e-6 in z (the result errs on the
// side of more noise: its epsilon is <= target_epsilon). 0 when q = 0 or steps = 0 (nothing is
// released). The search is over [kMinCalibratedNoise, kMaxCalibratedNoise] with a bounded number
// of accountant evaluations: at most ~270 for kRdp and kAnalytic; kPld starts from the kRdp
// answer and takes ~10 PLD evaluations (at most ~1000), its errors (ResourceExhausted) passing
// through. InvalidArgument for a target that is not positive and finite, a target no z up to
// kMaxCalibratedNoise reaches, or one that even z = kMinCalibratedNoise stays within (a target so
// large that it protects nothing, e.g. 1e300). Cancelled if *stop turns true (checked at every
// evaluation and inside it).
StatusOr<double> CalibrateNoiseMultiplier(double target_epsilon, double delta, double sampling_rate,
                                          int64_t steps, AccountantKind kind,
                                          const PldOptions& pld = {},
                                          const std::atomic<bool>* stop = nullptr);

}  // namespace huddle::privacy
