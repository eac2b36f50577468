// Internals of the PLD accountant (privacy loss distributions on a grid), exposed for tests.
//
// The algorithm mirrors Google's dp_accounting (pld/privacy_loss_distribution.py, pld_pmf.py,
// common.py): the pessimistic "connect the dots" discretization of Doroshenko et al. 2022 for the
// Poisson-subsampled Gaussian under add/remove adjacency (one PMF per direction, epsilon = the
// max of the two), self-composition by an FFT power with a Chernoff-bounded output window, and
// composition by FFT convolution, each truncating at most 1e-15 of tail mass and moving the
// truncated upper tail to +infinity (so the result stays an upper bound). Differences: the PMF is
// always dense (dp_accounting keeps PMFs of <= 1000 points sparse and composes those exactly),
// FFT lengths are powers of two, and losses are (index * interval), not a running float sum.
#pragma once

#include <atomic>
#include <complex>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"

namespace huddle::privacy::internal {

// Mass probs[i] at privacy loss (lower_loss + i) * discretization, plus mass at +infinity.
struct PldPmf {
  double discretization = 1e-4;
  int64_t lower_loss = 0;
  std::vector<double> probs{1.0};
  double infinity_mass = 0;
};

// The PMFs of one mechanism for REMOVE (mu_upper = the mixture, mu_lower = N(0, sigma^2)) and
// ADD adjacency; `add` is empty when the two coincide (q = 1).
struct Pld {
  PldPmf remove;
  std::optional<PldPmf> add;
};

inline constexpr double kTailMassTruncation = 1e-15;
// Largest FFT / PMF length (2^24 doubles: 256 MiB as complex); beyond it ResourceExhausted.
// Every PMF, FFT and output below is checked against it before it is allocated.
inline constexpr int64_t kMaxPldLength = int64_t{1} << 24;
// Largest |loss index| (lower_loss + i): beyond it ResourceExhausted, so that index arithmetic
// never overflows int64 and index * discretization stays exact (losses beyond 2^52 grid steps
// only arise from absurd step counts).
inline constexpr int64_t kMaxPldLossIndex = int64_t{1} << 52;

// The long loops below (O(length) per pass) check `stop` every 2^16 iterations and each FFT
// stage, and return Cancelled when it is true; nullptr never stops.

// Exact hockey-stick divergence delta(epsilon) of the subsampled Gaussian (sensitivity 1, noise
// sigma, rate q in (0, 1]) for one adjacency direction, as dp_accounting's GaussianPrivacyLoss.
double SubsampledGaussianHockeyStick(double q, double sigma, bool add, double epsilon);

// The pessimistic connect-the-dots PLD (log mass truncation bound -50, as dp_accounting).
// Requires q in (0, 1], 0 < sigma < inf, discretization > 0.
// ResourceExhausted if either PMF would pass kMaxPldLength points (checked before allocating).
StatusOr<Pld> SubsampledGaussianPld(double q, double sigma, double discretization,
                                    const std::atomic<bool>* stop = nullptr);

StatusOr<PldPmf> SelfCompose(const PldPmf& pmf, int64_t times,
                             double tail_mass_truncation = kTailMassTruncation,
                             const std::atomic<bool>* stop = nullptr);
StatusOr<PldPmf> Compose(const PldPmf& a, const PldPmf& b,
                         double tail_mass_truncation = kTailMassTruncation,
                         const std::atomic<bool>* stop = nullptr);

double DeltaForEpsilon(const PldPmf& pmf, double epsilon);
// Smallest epsilon >= 0 with DeltaForEpsilon <= delta (+inf if the infinity mass exceeds delta).
double EpsilonForDelta(const PldPmf& pmf, double delta);

// In-place radix-2 FFT (size a power of two); the inverse includes the 1/n factor. The second
// form returns Cancelled (leaving `data` partly transformed) once *stop is true.
void Fft(std::vector<std::complex<double>>& data, bool inverse);
Status Fft(std::vector<std::complex<double>>& data, bool inverse, const std::atomic<bool>* stop);

}  // namespace huddle::privacy::internal
