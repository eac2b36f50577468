// Time is passed in, never read from globals in library code, so tests can control it.
#pragma once

#include <chrono>
#include <cstdint>

namespace huddle {

// Time source: a monotonic scale for deadlines and durations, and the wall clock for the
// timestamps written in outputs (common/time_format.h). Thread-safe implementations only.
class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds on a monotonic scale with an arbitrary origin.
  virtual int64_t NowMs() const = 0;
  // Milliseconds since the Unix epoch (UTC). It may step (NTP, an operator), so it only labels
  // records (a metrics row's or ledger entry's `time`); never a deadline or a duration.
  virtual int64_t WallMs() const = 0;
  // True for a clock that only advances when its transport lets it (a discrete-event simulation,
  // transport/sim_transport.h): NowMs() then moves only while the owner waits in that transport's
  // Receive, so a wait in real time (a sleep, a poll of a worker thread) measures nothing and must
  // not be mistaken for virtual time passing. False for every clock of real time.
  virtual bool simulated() const { return false; }
};

// std::chrono::steady_clock (NowMs) and std::chrono::system_clock (WallMs).
class SteadyClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  int64_t WallMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // One shared instance; stateless, so this is not a singleton in the harmful sense.
  static const SteadyClock* Get() {
    static const SteadyClock clock;
    return &clock;
  }
};

}  // namespace huddle
