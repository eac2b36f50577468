// Upload slots: at most `slots` members of a round upload at once, the others wait in the order
// they asked. A member holding a slot may make the transport buffer up to its result's size
// (ServerTransport::SetUploadAllowance), and no member holds one past `timeout_ms`: a member that
// asked for a slot and never uploads must not starve the others (Stale()).
//
// The slots own the allowances: granted with Hold(), withdrawn by Release() or Reset(), so no
// allowance outlives the upload it was granted for.
//
// Thread-safety: none; the coordinator's thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "transport/transport.h"

namespace huddle::coordinator {

// Upload allowance beyond a result's tensor bytes: the FitResult header and framing.
inline constexpr size_t kResultOverheadBytes = size_t{64} << 10;

class UploadSlots {
 public:
  // `transport` and `clock` must outlive the slots.
  UploadSlots(transport::ServerTransport* transport, const Clock* clock, int64_t slots,
              int64_t timeout_ms)
      : transport_(transport), clock_(clock), slots_(slots), timeout_ms_(timeout_ms) {}

  // `id` asks for a slot: it waits behind those who asked before.
  void Enqueue(const std::string& id) { waiting_.push_back(id); }
  // The next member in line, taken out of the queue, while a slot is free; nullopt otherwise.
  // (The caller checks that it still wants one, sends its grant, then calls Hold.)
  std::optional<std::string> NextWaiting();
  // `id` holds a slot from now on: its connection `peer` may send up to `bytes` bytes.
  void Hold(const std::string& id, const transport::PeerId& peer, size_t bytes);
  // `id` leaves the queue and gives its slot back (it uploaded, failed or rejoined): the
  // allowance of the connection it was granted on is withdrawn. True when it held a slot.
  bool Release(const std::string& id);
  // When `id` was granted the slot it holds (Clock::NowMs at Hold), nullopt when it holds none:
  // the start of its upload, for the round's upload durations.
  std::optional<int64_t> HeldSinceMs(const std::string& id) const;
  // Members that have held their slot for longer than the timeout.
  std::vector<std::string> Stale() const;
  // Every slot given back and the queue emptied (a round's end or start).
  void Reset();
  int64_t held() const { return static_cast<int64_t>(holders_.size()); }

 private:
  struct Holder {
    transport::PeerId peer;
    int64_t since_ms = 0;
  };

  transport::ServerTransport* transport_;
  const Clock* clock_;
  int64_t slots_;
  int64_t timeout_ms_;
  std::deque<std::string> waiting_;        // in request order
  std::map<std::string, Holder> holders_;  // by member id
};

}  // namespace huddle::coordinator
