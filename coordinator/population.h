// The enrolled population: the clients that joined, each with its connection, the example count
// it claimed and when it was last heard from. The coordinator's rounds, evaluations and secure
// aggregation look clients up here, and only here, so a client that left (its key revoked) is
// gone for all of them at once: every lookup answers "absent" rather than throwing.
//
// Ids are kept sorted (a map), so sampling over them is stable for a given seed. A client is live
// while heard from within client_timeout_ms (always, when that is <= 0).
//
// Thread-safety: none; the coordinator's thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "transport/transport.h"

namespace huddle::coordinator {

class Population {
 public:
  struct Client {
    transport::PeerId peer;
    uint64_t num_examples = 0;  // as claimed in its latest Join
    int64_t last_seen_ms = 0;
  };

  // `clock` must outlive the population.
  Population(const Clock* clock, int64_t client_timeout_ms)
      : clock_(clock), client_timeout_ms_(client_timeout_ms) {}

  // What a Join changed: whether the id had joined before, on which connection, and whether that
  // connection was heard from within `live_ms` (two agents may be sharing the id).
  struct Joined {
    bool rejoin = false;
    transport::PeerId old_peer;  // "" on a first join
    bool old_peer_live = false;  // a rejoin from another connection whose old one is live
  };
  // Records `id` as joined on `peer` with `num_examples`, heard from now. The newest connection
  // wins: the old one no longer maps to the id.
  Joined Join(const std::string& id, const transport::PeerId& peer, uint64_t num_examples,
              int64_t live_ms);
  // Removes `id` if it is joined on `peer` (its key was revoked); false when it was not.
  bool Remove(const std::string& id, const transport::PeerId& peer);
  // `id` was heard from now (no-op when absent).
  void Heard(const std::string& id);

  // The client joined as `id`, or nullptr.
  const Client* Find(const std::string& id) const;
  // The connection `id` joined on, or an empty PeerId if it is not joined (a send to it fails).
  transport::PeerId PeerOf(const std::string& id) const;
  // The client id `peer` joined as, or nullptr.
  const std::string* IdOf(const transport::PeerId& peer) const;
  // Whether `id` is joined and live.
  bool Alive(const std::string& id) const;
  int64_t LiveCount() const;
  // The live clients' ids not in `excluded`, sorted.
  std::vector<std::string> LiveIds(const std::set<std::string>& excluded = {}) const;
  size_t size() const { return clients_.size(); }
  const std::map<std::string, Client>& clients() const { return clients_; }

 private:
  bool Alive(const Client& c) const;

  const Clock* clock_;
  int64_t client_timeout_ms_;
  std::map<std::string, Client> clients_;  // by client id: sorted, so sampling is stable
  std::unordered_map<transport::PeerId, std::string> peer_to_id_;
};

}  // namespace huddle::coordinator
