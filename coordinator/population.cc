#include "coordinator/population.h"

#include <algorithm>

namespace huddle::coordinator {

Population::Joined Population::Join(const std::string& id, const transport::PeerId& peer,
                                    uint64_t num_examples, int64_t live_ms) {
  Client& c = clients_[id];
  Joined joined;
  joined.rejoin = !c.peer.empty();
  joined.old_peer = c.peer;
  const int64_t now = clock_->NowMs();
  joined.old_peer_live = joined.rejoin && c.peer != peer && now - c.last_seen_ms < live_ms;
  if (joined.rejoin && c.peer != peer) peer_to_id_.erase(c.peer);
  c.peer = peer;
  c.num_examples = num_examples;
  c.last_seen_ms = now;
  peer_to_id_[peer] = id;
  return joined;
}

bool Population::Remove(const std::string& id, const transport::PeerId& peer) {
  auto it = clients_.find(id);
  if (it == clients_.end() || it->second.peer != peer) return false;
  peer_to_id_.erase(peer);
  clients_.erase(it);
  return true;
}

void Population::Heard(const std::string& id) {
  if (auto it = clients_.find(id); it != clients_.end()) it->second.last_seen_ms = clock_->NowMs();
}

const Population::Client* Population::Find(const std::string& id) const {
  auto it = clients_.find(id);
  return it == clients_.end() ? nullptr : &it->second;
}

transport::PeerId Population::PeerOf(const std::string& id) const {
  const Client* c = Find(id);
  return c != nullptr ? c->peer : transport::PeerId();
}

const std::string* Population::IdOf(const transport::PeerId& peer) const {
  auto it = peer_to_id_.find(peer);
  return it == peer_to_id_.end() ? nullptr : &it->second;
}

bool Population::Alive(const Client& c) const {
  return client_timeout_ms_ <= 0 || clock_->NowMs() - c.last_seen_ms <= client_timeout_ms_;
}

bool Population::Alive(const std::string& id) const {
  const Client* c = Find(id);
  return c != nullptr && Alive(*c);
}

int64_t Population::LiveCount() const {
  return std::count_if(clients_.begin(), clients_.end(),
                       [this](const auto& kv) { return Alive(kv.second); });
}

std::vector<std::string> Population::LiveIds(const std::set<std::string>& excluded) const {
  std::vector<std::string> live;
  for (const auto& [id, c] : clients_) {
    if (Alive(c) && excluded.count(id) == 0) live.push_back(id);
  }
  return live;
}

}  // namespace huddle::coordinator
