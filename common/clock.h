// Time is passed in, never read from globals in library code, so tests can control it.
#pragma once

#include <chrono>
#include <cstdint>

namespace huddle {

// Monotonic time source. Thread-safe implementations only.
class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds on a monotonic scale with an arbitrary origin.
  virtual int64_t NowMs() const = 0;
};

// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // One shared instance; stateless, so this is not a singleton in the harmful sense.
  static const SteadyClock* Get() {
    static const SteadyClock clock;
    return &clock;
  }
};

}  // namespace huddle
