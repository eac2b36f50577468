#include "coordinator/upload_slots.h"

#include <algorithm>

namespace huddle::coordinator {

std::optional<std::string> UploadSlots::NextWaiting() {
  if (held() >= slots_ || waiting_.empty()) return std::nullopt;
  std::string id = std::move(waiting_.front());
  waiting_.pop_front();
  return id;
}

void UploadSlots::Hold(const std::string& id, const transport::PeerId& peer, size_t bytes) {
  holders_[id] = Holder{peer, clock_->NowMs()};
  transport_->SetUploadAllowance(peer, bytes);
}

bool UploadSlots::Release(const std::string& id) {
  std::erase(waiting_, id);
  auto it = holders_.find(id);
  if (it == holders_.end()) return false;
  transport_->SetUploadAllowance(it->second.peer, 0);
  holders_.erase(it);
  return true;
}

std::optional<int64_t> UploadSlots::HeldSinceMs(const std::string& id) const {
  auto it = holders_.find(id);
  if (it == holders_.end()) return std::nullopt;
  return it->second.since_ms;
}

std::vector<std::string> UploadSlots::Stale() const {
  const int64_t now = clock_->NowMs();
  std::vector<std::string> stale;
  for (const auto& [id, h] : holders_) {
    if (now - h.since_ms > timeout_ms_) stale.push_back(id);
  }
  return stale;
}

void UploadSlots::Reset() {
  for (const auto& [id, h] : holders_) transport_->SetUploadAllowance(h.peer, 0);
  holders_.clear();
  waiting_.clear();
}

}  // namespace huddle::coordinator
