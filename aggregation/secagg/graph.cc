#include "aggregation/secagg/graph.h"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/secure_random.h"

namespace huddle::aggregation::secagg {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log P[Binomial(k, p) = j].
double LogBinomialTerm(int k, int j, double p) {
  const double log_choose = std::lgamma(k + 1.0) - std::lgamma(j + 1.0) - std::lgamma(k - j + 1.0);
  const double a = j == 0 ? 0.0 : j * std::log(p);
  const double b = k - j == 0 ? 0.0 : (k - j) * std::log1p(-p);
  return log_choose + a + b;
}

// log P[Binomial(k, p) in [lo, hi]] (log-sum-exp over the terms); -inf for an empty range.
double LogBinomialRange(int k, double p, int lo, int hi) {
  lo = std::max(lo, 0);
  hi = std::min(hi, k);
  if (lo > hi) return -kInf;
  if (p <= 0) return lo == 0 ? 0.0 : -kInf;
  if (p >= 1) return hi == k ? 0.0 : -kInf;
  double peak = -kInf;
  for (int j = lo; j <= hi; ++j) peak = std::max(peak, LogBinomialTerm(k, j, p));
  double sum = 0;
  for (int j = lo; j <= hi; ++j) sum += std::exp(LogBinomialTerm(k, j, p) - peak);
  return peak + std::log(sum);
}

double LogChoose(int64_t a, int64_t b) {
  return std::lgamma(a + 1.0) - std::lgamma(b + 1.0) - std::lgamma(a - b + 1.0);
}

// log P[X >= t] for X ~ Hypergeometric: k draws without replacement from `others` members of
// which `bad` are corrupt.
double LogHypergeometricTail(int64_t others, int64_t bad, int k, int t) {
  const int64_t lo = std::max<int64_t>(t, k - (others - bad));
  const int64_t hi = std::min<int64_t>(k, bad);
  if (lo > hi) return -kInf;
  const double total = LogChoose(others, k);
  double peak = -kInf;
  std::vector<double> terms;
  for (int64_t x = lo; x <= hi; ++x) {
    terms.push_back(LogChoose(bad, x) + LogChoose(others - bad, k - x) - total);
    peak = std::max(peak, terms.back());
  }
  double sum = 0;
  for (double term : terms) sum += std::exp(term - peak);
  return std::min(0.0, peak + std::log(sum));
}

// -log2(n * P), from log P.
double Bits(int64_t n, double log_p) {
  if (log_p == -kInf) return kInf;
  return -(log_p + std::log(static_cast<double>(n))) / std::log(2.0);
}

}  // namespace

int64_t Colluders(double corrupt_fraction, int64_t n) {
  return static_cast<int64_t>(std::floor(corrupt_fraction * static_cast<double>(n)));
}

double PrivacyBits(int64_t n, int k, int t, double corrupt_fraction) {
  // An honest member's k neighbours are a uniformly random k-subset of the other n - 1 (the
  // Harary graph over a uniformly random order), floor(corrupt_fraction * n) of whom collude.
  const int64_t bad = Colluders(corrupt_fraction, n);
  return Bits(n, LogHypergeometricTail(n - 1, std::min(bad, n - 1), k, t));
}

double ReliabilityBits(int64_t n, int k, int t, double dropout_fraction) {
  return Bits(n, LogBinomialRange(k, 1 - dropout_fraction, 0, t - 1));
}

StatusOr<GraphParameters> ChooseParameters(int64_t n, const GraphOptions& options) {
  if (n < 2 || n > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure aggregation needs a cohort of 2 to 2^31 clients, not ", n));
  }
  if (!(options.corrupt_fraction >= 0 && options.corrupt_fraction < 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("corrupt_fraction ", options.corrupt_fraction, " must be in [0, 0.5)"));
  }
  if (!(options.dropout_fraction >= 0 && options.dropout_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dropout_fraction ", options.dropout_fraction, " must be in [0, 1)"));
  }
  if (options.security_bits < 8 || options.security_bits > 128 || options.reliability_bits < 1 ||
      options.reliability_bits > 64) {
    return absl::InvalidArgumentError(absl::StrCat("security_bits ", options.security_bits,
                                                   " must be in [8, 128] and reliability_bits ",
                                                   options.reliability_bits, " in [1, 64]"));
  }
  const int complete = static_cast<int>(std::min<int64_t>(n - 1, 1 << 20));
  // Even degrees 2, 4, ..., 256, then growing by 10% (the search stays cheap for huge cohorts).
  for (int k = std::min(2, complete);;
       k = std::min(k < 256 ? k + 2 : (k + k / 10 + 1) & ~1, complete)) {
    // The smallest t meeting privacy (PrivacyBits grows with t): binary search in [1, k + 1].
    int lo = 1, hi = k + 1;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (PrivacyBits(n, k, mid, options.corrupt_fraction) >= options.security_bits) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int t = lo;
    const double reliability = t <= k ? ReliabilityBits(n, k, t, options.dropout_fraction) : 0.0;
    if (t <= k && (reliability >= options.reliability_bits || k == complete)) {
      // At the complete graph, privacy alone decides: the best reliability there is.
      return GraphParameters{k, t, PrivacyBits(n, k, t, options.corrupt_fraction), reliability};
    }
    if (k == complete) {
      return absl::InvalidArgumentError(absl::StrCat(
          "not even the complete graph of ", n, " clients keeps a member's secrets safe from a ",
          options.corrupt_fraction, " fraction of colluding clients (2^-", options.security_bits,
          "): allow fewer corrupt clients, or enlarge the cohort"));
    }
  }
}

StatusOr<std::vector<std::vector<uint32_t>>> RandomGraph(int64_t n, int k) {
  if (n < 2 || n > (int64_t{1} << 31) || k < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a graph of ", n, " members and degree ", k, ": n in [2, 2^31], k >= 1"));
  }
  const uint32_t members = static_cast<uint32_t>(n);
  std::vector<std::vector<uint32_t>> graph(members);
  if (k >= n - 1) {
    for (uint32_t i = 0; i < members; ++i) {
      graph[i].reserve(members - 1);
      for (uint32_t j = 0; j < members; ++j) {
        if (j != i) graph[i].push_back(j);
      }
    }
    return graph;
  }
  // A uniformly random order (Fisher-Yates from the OS CSPRNG), then the Harary graph on it.
  EnsureSodium();
  std::vector<uint32_t> order(members);
  std::iota(order.begin(), order.end(), 0u);
  for (uint32_t i = members - 1; i > 0; --i) std::swap(order[i], order[randombytes_uniform(i + 1)]);
  const uint32_t half = static_cast<uint32_t>((k + 1) / 2);
  for (uint32_t p = 0; p < members; ++p) {
    std::vector<uint32_t>& mine = graph[order[p]];
    for (uint32_t d = 1; d <= half; ++d) {
      mine.push_back(order[(p + d) % members]);
      mine.push_back(order[(p + members - d) % members]);
    }
    std::sort(mine.begin(), mine.end());
    mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  }
  return graph;
}

bool Connected(const std::vector<std::vector<uint32_t>>& graph,
               const std::vector<uint32_t>& members) {
  if (members.empty()) return false;
  std::vector<char> in(graph.size(), 0), seen(graph.size(), 0);
  for (uint32_t m : members) {
    if (m >= graph.size()) return false;
    in[m] = 1;
  }
  std::vector<uint32_t> stack = {members[0]};
  seen[members[0]] = 1;
  size_t reached = 0;
  while (!stack.empty()) {
    const uint32_t v = stack.back();
    stack.pop_back();
    ++reached;
    for (uint32_t w : graph[v]) {
      if (in[w] && !seen[w]) {
        seen[w] = 1;
        stack.push_back(w);
      }
    }
  }
  size_t distinct = 0;
  for (char c : in) distinct += c != 0;
  return reached == distinct;
}

}  // namespace huddle::aggregation::secagg
