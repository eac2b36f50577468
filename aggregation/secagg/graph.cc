#include "aggregation/secagg/graph.h"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/secure_random.h"

namespace huddle::aggregation::secagg {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kLn2 = 0.69314718055994530942;
// The graph's keystream: ChaCha20 (IETF) keyed with the seed, this constant nonce.
constexpr uint8_t kGraphNonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {
    'h', 'u', 'd', 'd', 'l', 'e', '-', 'g', 'r', 'a', 'p', 'h'};

double LogChoose(double a, double b) {
  if (b < 0 || b > a) return -kInf;
  return std::lgamma(a + 1.0) - std::lgamma(b + 1.0) - std::lgamma(a - b + 1.0);
}

// log P[Binomial(n, p) = j].
double LogBinomialTerm(double n, double j, double p) {
  const double a = j == 0 ? 0.0 : j * std::log(p);
  const double b = n - j == 0 ? 0.0 : (n - j) * std::log1p(-p);
  return LogChoose(n, j) + a + b;
}

// log of a sum of exp(terms) (log-sum-exp); -inf for none.
double LogSum(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const double m = std::max(a, b);
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

// log P[Binomial(n, p) in [lo, hi]], exactly (every term).
double LogBinomialRange(int64_t n, double p, int64_t lo, int64_t hi) {
  lo = std::max<int64_t>(lo, 0);
  hi = std::min(hi, n);
  if (lo > hi) return -kInf;
  if (p <= 0) return lo == 0 ? 0.0 : -kInf;
  if (p >= 1) return hi == n ? 0.0 : -kInf;
  double sum = -kInf;
  for (int64_t j = lo; j <= hi; ++j) {
    sum = LogSum(sum, LogBinomialTerm(static_cast<double>(n), static_cast<double>(j), p));
  }
  return std::min(0.0, sum);
}

// Chernoff: log P[Binomial(n, q) <= d] <= -n KL(d/n || q) when d < n q (else 0, the trivial bound).
double LogLowerTail(double n, double q, double d) {
  if (d < 0) return -kInf;
  if (n <= 0 || d >= n * q) return 0.0;
  if (q >= 1) return -kInf;
  const double a = d / n;
  double kl = (1 - a) * std::log((1 - a) / (1 - q));
  if (a > 0) kl += a * std::log(a / q);
  return -n * kl;
}

// Chernoff: log P[2 A + B >= total] for A ~ Binomial(na, p), B ~ Binomial(nb, p) independent:
// min over lambda > 0 of log E[exp(lambda (2A + B))] - lambda total (convex: ternary search).
double LogDoubleSumUpperTail(double na, double nb, double p, double total) {
  if (2 * na * p + nb * p >= total) return 0.0;
  if (p <= 0) return total > 0 ? -kInf : 0.0;
  auto f = [&](double l) {
    return na * std::log1p(p * std::expm1(2 * l)) + nb * std::log1p(p * std::expm1(l)) - l * total;
  };
  double lo = 0, hi = 40;
  for (int i = 0; i < 100; ++i) {
    const double m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
    if (f(m1) < f(m2)) {
      hi = m2;
    } else {
      lo = m1;
    }
  }
  return std::min(0.0, f((lo + hi) / 2));
}

double Bits(double log_p) { return log_p == -kInf ? kInf : -log_p / kLn2; }

// log of the privacy failure: n * P[Binomial(c, p) >= t] (exact; p = 1: t <= c).
double LogPrivacyFailure(int64_t n, double p, int t, int64_t colluders) {
  const double tail = LogBinomialRange(colluders, p, t, colluders);
  return tail == -kInf ? -kInf : std::log(static_cast<double>(n)) + tail;
}

// Word index of the pair i < j in the triangular order (row i's pairs contiguous).
uint64_t PairIndex(uint64_t n, uint64_t i, uint64_t j) {
  return i * (2 * n - i - 1) / 2 + (j - i - 1);
}

// Words [first, first + count) of the graph's keystream, as little-endian uint32.
void Words(const GraphSeed& seed, uint64_t first, size_t count, std::vector<uint32_t>& out) {
  constexpr uint64_t kWordsPerBlock = 16;  // a ChaCha20 block is 64 bytes
  const uint64_t block0 = first / kWordsPerBlock;
  const uint64_t skip = first % kWordsPerBlock;
  const uint64_t blocks = (skip + count + kWordsPerBlock - 1) / kWordsPerBlock;
  std::vector<uint8_t> stream(blocks * 64, 0);
  crypto_stream_chacha20_ietf_xor_ic(stream.data(), stream.data(), stream.size(), kGraphNonce,
                                     static_cast<uint32_t>(block0), seed.data());
  out.resize(count);
  std::memcpy(out.data(), stream.data() + skip * 4, count * 4);  // little-endian hosts only
}

Status CheckGraphArguments(int64_t n, uint64_t edge_threshold) {
  if (n < 2 || n > kMaxMembers || edge_threshold < 1 || edge_threshold > kCompleteGraph) {
    return absl::InvalidArgumentError(
        absl::StrCat("a graph of ", n, " members with edge threshold ", edge_threshold,
                     ": members in [2, ", kMaxMembers, "], threshold in [1, 2^32]"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t Colluders(double corrupt_fraction, int64_t n) {
  return static_cast<int64_t>(std::floor(corrupt_fraction * static_cast<double>(n)));
}

uint64_t EdgeThreshold(int64_t n, int k) {
  if (n < 2 || k >= n - 1) return kCompleteGraph;
  const double p = static_cast<double>(std::max(k, 1)) / static_cast<double>(n - 1);
  return std::clamp<uint64_t>(static_cast<uint64_t>(std::floor(p * 4294967296.0)), 1,
                              kCompleteGraph);
}

double EdgeProbability(uint64_t edge_threshold) {
  return static_cast<double>(edge_threshold) / 4294967296.0;
}

double PrivacyBits(int64_t n, uint64_t edge_threshold, int t, int64_t colluders) {
  return Bits(LogPrivacyFailure(n, EdgeProbability(edge_threshold), t, colluders));
}

double ReliabilityBits(int64_t n, uint64_t edge_threshold, int t, double dropout_fraction) {
  const double q = EdgeProbability(edge_threshold) * (1 - dropout_fraction);
  const double tail = LogBinomialRange(n - 1, q, 0, t - 1);
  return tail == -kInf ? kInf : Bits(std::log(static_cast<double>(n)) + tail);
}

namespace {

// IsolationBound's sums run over up to n/2 part sizes (milliseconds at 1000 members, tens at
// 10,000), and every member of a session computes the same one, round after round: the results
// of the last few argument sets are kept for the process (an in-process simulation's members
// share them).
using IsolationKey = std::tuple<int64_t, uint64_t, int, int64_t, int64_t, int>;

struct IsolationMemo {
  absl::Mutex mu;
  std::map<IsolationKey, Isolation> results ABSL_GUARDED_BY(mu);
};

IsolationMemo& Memo() {
  static IsolationMemo* memo = new IsolationMemo();  // never destroyed: usable at exit
  return *memo;
}

StatusOr<Isolation> ComputeIsolationBound(int64_t n, uint64_t edge_threshold, int t,
                                          int64_t colluders, int64_t min_survivors,
                                          int security_bits);

}  // namespace

StatusOr<Isolation> IsolationBound(int64_t n, uint64_t edge_threshold, int t, int64_t colluders,
                                   int64_t min_survivors, int security_bits) {
  const IsolationKey key{n, edge_threshold, t, colluders, min_survivors, security_bits};
  IsolationMemo& memo = Memo();
  {
    absl::MutexLock lock(&memo.mu);
    auto it = memo.results.find(key);
    if (it != memo.results.end()) return it->second;
  }
  HUDDLE_ASSIGN_OR_RETURN(Isolation out, ComputeIsolationBound(n, edge_threshold, t, colluders,
                                                               min_survivors, security_bits));
  absl::MutexLock lock(&memo.mu);
  if (memo.results.size() >= 64) memo.results.clear();
  memo.results.emplace(key, out);
  return out;
}

namespace {

StatusOr<Isolation> ComputeIsolationBound(int64_t n, uint64_t edge_threshold, int t,
                                          int64_t colluders, int64_t min_survivors,
                                          int security_bits) {
  HUDDLE_RETURN_IF_ERROR(CheckGraphArguments(n, edge_threshold));
  if (colluders < 0 || colluders >= n || min_survivors < 1 || min_survivors > n || t < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("isolation bound: colluders ", colluders, " in [0, ", n, "), min_survivors ",
                     min_survivors, " in [1, ", n, "], t ", t, " >= 1"));
  }
  const double p = EdgeProbability(edge_threshold);
  const double log_privacy = LogPrivacyFailure(n, p, t, colluders);
  Isolation out;
  if (edge_threshold >= kCompleteGraph) {
    // Every honest survivor neighbours every other: they form one part, whatever is dropped.
    out.failure_bits = Bits(log_privacy);
    return out;
  }
  const int64_t honest = n - colluders;
  const double drops = static_cast<double>(n - min_survivors);
  const int64_t half = honest / 2;
  std::vector<double> cut_terms(static_cast<size_t>(half) + 2, -kInf);
  double small_part = -kInf;
  for (int64_t w = 1; w <= half; ++w) {
    const double wd = static_cast<double>(w);
    const double q = -std::expm1(wd * std::log1p(-p));  // 1 - (1 - p)^w
    const double outside = static_cast<double>(n - w - colluders);
    const double boundary = LogLowerTail(outside, q, drops);
    const double choose = LogChoose(static_cast<double>(honest), wd);
    cut_terms[static_cast<size_t>(w)] = choose + boundary;
    if (w == 1) continue;  // one member alone: the privacy bound's event (>= t colluders)
    const double rebuild = LogDoubleSumUpperTail(
        wd * (wd - 1) / 2, wd * static_cast<double>(colluders), p, static_cast<double>(t) * wd);
    small_part = LogSum(small_part, choose + rebuild + boundary);
  }
  // The smallest cut whose tail (every larger part) is within a quarter of the budget.
  const double quarter = -(security_bits + 2) * kLn2;
  double tail = -kInf;
  int64_t cut = half;
  for (int64_t w = half; w >= 1; --w) {
    const double with_w = LogSum(tail, cut_terms[static_cast<size_t>(w)]);
    if (with_w > quarter) break;
    tail = with_w;
    cut = w - 1;
  }
  out.cut = cut;
  out.failure_bits = Bits(LogSum(LogSum(log_privacy, tail), small_part));
  return out;
}

}  // namespace

StatusOr<int64_t> HonestShares(int64_t n, uint64_t edge_threshold, int t, int64_t colluders,
                               int64_t min_survivors, int security_bits) {
  HUDDLE_ASSIGN_OR_RETURN(
      Isolation iso, IsolationBound(n, edge_threshold, t, colluders, min_survivors, security_bits));
  if (iso.failure_bits < security_bits) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the session's graph (", n, " members, expected degree ",
        EdgeProbability(edge_threshold) * static_cast<double>(n - 1), ", t ", t, ") fails against ",
        colluders, " colluders with probability 2^-", iso.failure_bits, ", above 2^-",
        security_bits, " (too few neighbours, or t too small, for that many colluders)"));
  }
  const int64_t shares = min_survivors - colluders - iso.cut;
  if (shares < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("a session of ", n, " members unmasking ", min_survivors,
                     " inputs or more guarantees no "
                     "honest member in a sum: ",
                     colluders, " may collude and a coordinator dropping the other ",
                     n - min_survivors, " can cut ", iso.cut, " more away"));
  }
  return shares;
}

int64_t ConsistencyQuorum(int64_t n, int64_t colluders) { return (n + colluders) / 2 + 1; }

StatusOr<GraphParameters> ChooseParameters(int64_t n, int64_t min_survivors,
                                           const GraphOptions& options) {
  if (n < 2 || n > kMaxMembers) {
    return absl::InvalidArgumentError(absl::StrCat("secure aggregation needs a session of 2 to ",
                                                   kMaxMembers, " members, not ", n));
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
  if (min_survivors < 1 || min_survivors > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_survivors ", min_survivors, " must be in [1, ", n, "]"));
  }
  const int64_t c = Colluders(options.corrupt_fraction, n);
  const int complete = static_cast<int>(n - 1);
  const int sparse_cap = std::min(complete, 300);  // beyond: the complete graph
  for (int k = std::min(2, complete);;
       k = k >= sparse_cap ? complete
                           : std::min(k < 64 ? k + 2 : (k + k / 10 + 1) & ~1, sparse_cap)) {
    if (k > kMaxNeighbours) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no graph of at most ", kMaxNeighbours, " neighbours secures ", n, " members against ", c,
          " colluders (2^-", options.security_bits, "): allow fewer corrupt clients"));
    }
    const uint64_t thr = EdgeThreshold(n, k);
    // The smallest t meeting privacy with a quarter of the budget (PrivacyBits grows with t).
    int lo = 1, hi = static_cast<int>(c) + 1;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (PrivacyBits(n, thr, mid, c) >= options.security_bits + 2) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int t = lo;
    const bool at_complete = k == complete;
    const double reliability = ReliabilityBits(n, thr, t, options.dropout_fraction);
    if (t <= k && (reliability >= options.reliability_bits || at_complete)) {
      auto shares = HonestShares(n, thr, t, c, min_survivors, options.security_bits);
      if (shares.ok() || at_complete) {
        return GraphParameters{k, thr, t, PrivacyBits(n, thr, t, c), reliability};
      }
    }
    if (at_complete) {
      return absl::InvalidArgumentError(absl::StrCat(
          "not even the complete graph of ", n, " members keeps a member's secrets safe from ", c,
          " colluding clients (corrupt_fraction ", options.corrupt_fraction,
          "): allow fewer corrupt clients, or enlarge the cohort"));
    }
  }
}

StatusOr<std::vector<uint32_t>> Neighbours(const GraphSeed& seed, int64_t n,
                                           uint64_t edge_threshold, uint32_t i) {
  HUDDLE_RETURN_IF_ERROR(CheckGraphArguments(n, edge_threshold));
  if (i >= n) {
    return absl::InvalidArgumentError(absl::StrCat("member ", i, " of a graph of ", n));
  }
  std::vector<uint32_t> out;
  const uint64_t un = static_cast<uint64_t>(n);
  std::vector<uint32_t> words;
  EnsureSodium();
  for (uint32_t j = 0; j < i; ++j) {  // pairs (j, i): one word each
    Words(seed, PairIndex(un, j, i), 1, words);
    if (words[0] < edge_threshold) out.push_back(j);
  }
  if (i + 1 < n) {  // pairs (i, j > i): contiguous
    Words(seed, PairIndex(un, i, i + 1), static_cast<size_t>(n - i - 1), words);
    for (size_t d = 0; d < words.size(); ++d) {
      if (words[d] < edge_threshold) out.push_back(static_cast<uint32_t>(i + 1 + d));
    }
  }
  return out;
}

StatusOr<std::vector<std::vector<uint32_t>>> RandomGraph(const GraphSeed& seed, int64_t n,
                                                         uint64_t edge_threshold) {
  HUDDLE_RETURN_IF_ERROR(CheckGraphArguments(n, edge_threshold));
  EnsureSodium();
  std::vector<std::vector<uint32_t>> graph(static_cast<size_t>(n));
  std::vector<uint32_t> words;
  const uint64_t un = static_cast<uint64_t>(n);
  for (uint32_t i = 0; i + 1 < n; ++i) {
    Words(seed, PairIndex(un, i, i + 1), static_cast<size_t>(n - i - 1), words);
    for (size_t d = 0; d < words.size(); ++d) {
      if (words[d] < edge_threshold) {
        const auto j = static_cast<uint32_t>(i + 1 + d);
        graph[i].push_back(j);
        graph[j].push_back(i);  // rows fill in increasing i: each stays sorted
      }
    }
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
