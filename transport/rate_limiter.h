// A token bucket per source, for the server's transport: messages per authenticated identity
// (zmq_transport.cc) and handshakes per enrolled key (zap_handler.cc).
//
// Not thread-safe: one thread calls it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace huddle::transport {

// Token bucket per source (a string: an identity, a routing id). Entries idle for a minute are
// pruned, so the table stays small. A rate of 0 admits everything.
class RateLimiter {
 public:
  RateLimiter(double rate, double burst) : rate_(rate), burst_(std::max(1.0, burst)) {}

  // Whether a message from `source` at `now_ms` is admitted.
  bool Admit(const std::string& source, int64_t now_ms) {
    if (rate_ <= 0) return true;
    if (now_ms - last_prune_ms_ > 60'000) {
      std::erase_if(buckets_, [&](const auto& kv) { return now_ms - kv.second.last_ms > 60'000; });
      last_prune_ms_ = now_ms;
    }
    auto [it, fresh] = buckets_.try_emplace(source, Bucket{burst_, now_ms});
    Bucket& b = it->second;
    b.tokens = std::min(burst_, b.tokens + (now_ms - b.last_ms) * rate_ / 1000.0);
    b.last_ms = now_ms;
    if (b.tokens < 1.0) return false;
    b.tokens -= 1.0;
    return true;
  }

 private:
  struct Bucket {
    double tokens;
    int64_t last_ms;
  };
  double rate_;
  double burst_;
  int64_t last_prune_ms_ = 0;
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace huddle::transport
