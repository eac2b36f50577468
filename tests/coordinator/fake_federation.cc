#include "tests/coordinator/fake_federation.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace huddle::testing {

TensorList HonestDelta(const ModelLayout& layout, uint64_t round, const std::string& id) {
  Rng rng(DeriveSeed(round, StableHash(id)));
  TensorList delta;
  for (const TensorSpec& spec : layout) {
    Tensor t(spec.name, spec.shape);
    for (float& x : t.data) x = static_cast<float>(0.01 * rng.Normal());
    delta.push_back(std::move(t));
  }
  return delta;
}

FakeFederation::FakeFederation(std::vector<SyntheticClient> clients, ModelLayout layout,
                               ManualClock* clock, uint64_t delivery_seed, bool authenticated)
    : layout_(std::move(layout)),
      clock_(clock),
      delivery_(delivery_seed),
      authenticated_(authenticated) {
  for (SyntheticClient& c : clients) {
    wire::Join join{c.join_as.empty() ? c.id : c.join_as, c.num_examples, "test"};
    Queue(c.id, wire::MakeMessage(join, 0, c.id));
    clients_[c.id] = std::move(c);
  }
}

void FakeFederation::Queue(const std::string& peer, wire::Message msg) {
  transport::Inbound in;
  in.peer = peer;
  if (authenticated_) in.auth_id = peer;
  in.wire_bytes = msg.PayloadBytes() + 32;
  bytes_in_ += in.wire_bytes;
  in.message = std::move(msg);
  pending_.push_back(std::move(in));
}

void FakeFederation::Inject(const std::string& peer, wire::Message msg, std::string auth_id) {
  Queue(peer, std::move(msg));
  if (!auth_id.empty()) pending_.back().auth_id = std::move(auth_id);
}

void FakeFederation::InjectGarbage(const std::string& peer) {
  InjectDecodeError(peer, absl::InvalidArgumentError("malformed message: header does not parse"));
}

void FakeFederation::InjectDecodeError(const std::string& peer, Status error) {
  transport::Inbound in;
  in.peer = peer;
  if (authenticated_) in.auth_id = peer;
  in.message = std::move(error);
  pending_.push_back(std::move(in));
}

std::string FakeFederation::LastErrorText(const std::string& peer) const {
  auto it = last_error_text_.find(peer);
  return it == last_error_text_.end() ? "" : it->second;
}

int FakeFederation::ErrorsSent(const std::string& peer, wire::ErrorCode code) const {
  auto it = errors_.find({peer, static_cast<int>(code)});
  return it == errors_.end() ? 0 : it->second;
}

Status FakeFederation::Send(const transport::PeerId& peer, const wire::Message& msg) {
  bytes_out_ += msg.PayloadBytes() + 32;
  if (msg.type() == wire::MessageType::kError) {
    errors_[{peer, static_cast<int>(std::get<wire::Error>(msg.body).code)}]++;
    last_error_text_[peer] = std::get<wire::Error>(msg.body).message;
    return absl::OkStatus();
  }
  if (msg.type() == wire::MessageType::kShutdown) {
    ++shutdowns_;
    return absl::OkStatus();
  }
  auto it = clients_.find(peer);
  if (it == clients_.end()) return absl::NotFoundError("unknown peer");
  const SyntheticClient& c = it->second;
  const uint64_t round = msg.round;
  switch (msg.type()) {
    case wire::MessageType::kEvaluateInstruction: {
      const auto& e = std::get<wire::EvaluateInstruction>(msg.body);
      evaluations_.push_back({round, peer, e.model_version, e.nonce, wire::ToTensors(msg.tensors)});
      if (gone_.contains(peer) || !evaluate_answer_) return absl::OkStatus();
      for (wire::Message& reply : evaluate_answer_(peer, msg)) Queue(peer, std::move(reply));
      return absl::OkStatus();
    }
    case wire::MessageType::kFitInstruction: {
      fits_.push_back({round, peer, std::get<wire::FitInstruction>(msg.body).seed});
      versions_[peer] = std::get<wire::FitInstruction>(msg.body).model_version;
      previous_nonces_[peer] = nonces_[peer];
      nonces_[peer] = std::get<wire::FitInstruction>(msg.body).nonce;
      if (c.behaviour == Behaviour::kSilent) return absl::OkStatus();
      if (c.behaviour == Behaviour::kLeaves && round > 1) {
        gone_.insert(peer);
        return absl::OkStatus();
      }
      if (c.behaviour == Behaviour::kFailsTraining ||
          (c.behaviour == Behaviour::kFailsFirst && fits_seen_[peer]++ == 0)) {
        Queue(peer, wire::MakeError(wire::ErrorCode::kInternal,
                                    "local training failed: loss is NaN at epoch 1", round));
        return absl::OkStatus();
      }
      if (c.behaviour == Behaviour::kRejoinFlood) {
        Queue(peer, wire::MakeMessage(wire::Join{c.id, c.num_examples, "test"}, 0, c.id));
        return absl::OkStatus();
      }
      if (c.behaviour == Behaviour::kDeclines) {
        Queue(peer, wire::MakeError(
                        wire::ErrorCode::kRejected,
                        "this client's privacy policy refuses the round: " + std::string(4000, 'x'),
                        round));
        return absl::OkStatus();
      }
      if (c.behaviour == Behaviour::kUnsolicited) {
        wire::Message r = wire::MakeMessage(
            wire::FitResult{c.num_examples, 0.5, 0.5, 0.1,
                            std::get<wire::FitInstruction>(msg.body).model_version, nonces_[peer]},
            round, c.id);
        for (Tensor& t : HonestDelta(layout_, round, c.id)) {
          r.tensors.push_back(wire::TensorPayload::CopyOf(t));
        }
        Queue(peer, std::move(r));
        return absl::OkStatus();
      }
      const uint64_t reply_round = c.behaviour == Behaviour::kWrongRound ? round - 1 : round;
      const std::string nonce = c.behaviour == Behaviour::kWrongNonce
                                    ? std::string(wire::kNonceBytes, 'x')
                                    : nonces_[peer];
      Queue(peer, wire::MakeMessage(wire::UploadRequest{c.num_examples, nonce}, reply_round, c.id));
      if (c.delay_ms > 0) {
        delayed_.emplace_back(clock_->NowMs() + c.delay_ms, std::move(pending_.back()));
        pending_.pop_back();
      }
      return absl::OkStatus();
    }
    case wire::MessageType::kUploadGrant: {
      if (c.behaviour == Behaviour::kGrabber) return absl::OkStatus();
      if (c.behaviour == Behaviour::kGarbageResult) {
        InjectGarbage(peer);
        return absl::OkStatus();
      }
      TensorList delta = HonestDelta(layout_, round, c.id);
      if (c.behaviour == Behaviour::kNaN) delta[0].data[3] = std::nanf("");
      if (c.behaviour == Behaviour::kHugeValue) delta[1].data[0] = 1e9f;
      if (c.behaviour == Behaviour::kFlat ||
          (c.behaviour == Behaviour::kPoisonFirst && round == 1)) {
        for (Tensor& t : delta) std::fill(t.data.begin(), t.data.end(), c.value);
      }
      if (c.behaviour == Behaviour::kCanary) {
        for (Tensor& t : delta) std::fill(t.data.begin(), t.data.end(), 0.0f);
        delta[0].data[0] = c.value != 0 ? c.value : 1.0f;
      }
      if (c.behaviour == Behaviour::kWrongShape) {
        Tensor bad(delta[0].name(), {delta[0].spec.shape[0] + 1, delta[0].spec.shape[1]});
        delta[0] = std::move(bad);
      }
      wire::Message r = wire::MakeMessage(
          wire::FitResult{c.num_examples, 0.5, 0.5, 0.1, versions_[peer],
                          c.behaviour == Behaviour::kReplay && !previous_nonces_[peer].empty()
                              ? previous_nonces_[peer]
                              : nonces_[peer]},
          round, c.id);
      for (Tensor& t : delta) r.tensors.push_back(wire::TensorPayload::CopyOf(t));
      Queue(peer, std::move(r));
      return absl::OkStatus();
    }
    default:
      return absl::OkStatus();
  }
}

StatusOr<std::optional<transport::Inbound>> FakeFederation::Receive(int64_t timeout_ms) {
  receive_calls_++;
  if (pending_.empty() && heartbeat_ms_ > 0 &&
      clock_->NowMs() - last_heartbeat_ms_ >= heartbeat_ms_) {
    last_heartbeat_ms_ = clock_->NowMs();
    for (const auto& [peer, c] : clients_) {
      if (!gone_.contains(peer)) Queue(peer, wire::MakeMessage(wire::Heartbeat{}, 0, c.id));
    }
  }
  if (pending_.empty()) clock_->Advance(std::max<int64_t>(1, timeout_ms));
  for (auto it = delayed_.begin(); it != delayed_.end();) {
    if (it->first > clock_->NowMs()) {
      ++it;
      continue;
    }
    pending_.push_back(std::move(it->second));
    it = delayed_.erase(it);
  }
  if (pending_.empty()) return std::optional<transport::Inbound>();
  const size_t pick = static_cast<size_t>(delivery_.UniformInt(pending_.size()));
  transport::Inbound in = std::move(pending_[pick]);
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(pick));
  clock_->Advance(1);
  return std::optional<transport::Inbound>(std::move(in));
}

}  // namespace huddle::testing
