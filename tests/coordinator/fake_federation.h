// A scripted federation for coordinator tests: a fake ServerTransport whose peers are synthetic
// clients with a behaviour each (honest, silent, NaN update, wrong shape, ...), and a manual clock
// that advances only when the coordinator waits on an empty transport. Rounds therefore run in
// simulated time: a deadline of 60 s costs nothing.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "models/model.h"
#include "transport/transport.h"

namespace huddle::testing {

class ManualClock final : public Clock {
 public:
  // The wall clock moves with the monotonic one, from kWallOriginMs (2026-11-28T22:51:03.000Z)
  // at NowMs() 0, so rows' `time` values are deterministic.
  static constexpr int64_t kWallOriginMs = 1'795'906'263'000;

  int64_t NowMs() const override { return now_ms_; }
  int64_t WallMs() const override { return kWallOriginMs + now_ms_; }
  void Advance(int64_t ms) { now_ms_ += ms; }

 private:
  int64_t now_ms_ = 1'000'000;
};

enum class Behaviour {
  kHonest,         // deterministic delta derived from (round, client)
  kSilent,         // joins, then never answers a fit instruction
  kNaN,            // a NaN in its update
  kWrongShape,     // a tensor with a wrong shape
  kWrongRound,     // answers with round - 1
  kUnsolicited,    // sends a FitResult without asking for an upload slot
  kHugeValue,      // a value above the aggregation bound
  kGrabber,        // asks for an upload slot, gets it, never uploads
  kReplay,         // from its second instruction on, uploads with the previous instruction's nonce
  kWrongNonce,     // asks for an upload slot with a nonce it was never sent
  kDeclines,       // its privacy policy refuses every round: answers each instruction with an Error
  kCanary,         // a worst-case update for a privacy audit: `value` (1.0 if 0) in the first
                   // coordinate, 0 elsewhere
  kFailsTraining,  // answers each instruction with Error kInternal (its training failed)
  kGarbageResult,  // gets an upload slot, then sends bytes that do not decode
  kRejoinFlood,    // answers each instruction by joining again
  kFlat,           // uploads `value` in every coordinate (e.g. a long update of small values)
  kPoisonFirst,    // uploads `value` in every coordinate in round 1, honest deltas afterwards
  kLeaves,         // honest in round 1, then never heard from again
  kFailsFirst,     // answers its first instruction with Error kInternal, then honest
};

struct SyntheticClient {
  std::string id;
  Behaviour behaviour = Behaviour::kHonest;
  uint64_t num_examples = 100;
  std::string join_as;  // if set, the Join claims this id instead of `id` (impersonation)
  float value = 0;      // kFlat, kPoisonFirst, kCanary
  // Simulated time between an instruction and the client's answer (its upload request): a slow
  // device. 0: it answers at once.
  int64_t delay_ms = 0;
};

// The delta an honest client sends in `round`: a deterministic function of (round, id).
TensorList HonestDelta(const ModelLayout& layout, uint64_t round, const std::string& id);

class FakeFederation final : public transport::ServerTransport {
 public:
  // `delivery_seed` permutes the order in which queued client messages reach the coordinator.
  // `authenticated`: behave like the CurveZMQ transport, where every inbound message carries the
  // id its peer's key is enrolled as (here: the SyntheticClient's `id`).
  FakeFederation(std::vector<SyntheticClient> clients, ModelLayout layout, ManualClock* clock,
                 uint64_t delivery_seed, bool authenticated = false);

  Status Send(const transport::PeerId& peer, const wire::Message& msg) override;
  StatusOr<std::optional<transport::Inbound>> Receive(int64_t timeout_ms) override;
  uint64_t bytes_in() const override { return bytes_in_; }
  uint64_t bytes_out() const override { return bytes_out_; }
  bool authenticates() const override { return authenticated_; }

  // Queues raw bad bytes from a stranger (a decode error reaches the coordinator).
  void InjectGarbage(const std::string& peer);
  // Queues `msg` from `peer` as if it had sent it; `auth_id` overrides the enrolled id it carries.
  void Inject(const std::string& peer, wire::Message msg, std::string auth_id = {});
  // Queues a decode failure with this status from `peer`.
  void InjectDecodeError(const std::string& peer, Status error);
  // Number of Error messages each peer received, by code name.
  int ErrorsSent(const std::string& peer, wire::ErrorCode code) const;
  // The text of the last Error message `peer` received ("" if none).
  std::string LastErrorText(const std::string& peer) const;

  // Federated evaluation: how a client answers an EvaluateInstruction (the instruction message,
  // with the global model as its tensors). The messages returned are queued as the peer's; none:
  // it stays silent. Unset (the default): every client ignores evaluations, as an agent of an
  // earlier release would.
  using EvaluateAnswer =
      std::function<std::vector<wire::Message>(const std::string& peer, const wire::Message&)>;
  void set_evaluate_answer(EvaluateAnswer answer) { evaluate_answer_ = std::move(answer); }
  // Every evaluate instruction sent, in order.
  struct SeenEvaluate {
    uint64_t round = 0;
    std::string peer;
    uint64_t model_version = 0;
    std::string nonce;
    TensorList model;
  };
  const std::vector<SeenEvaluate>& evaluations() const { return evaluations_; }
  int shutdowns() const { return shutdowns_; }
  // Every fit instruction sent, in order: what each client saw of its round.
  struct SeenFit {
    uint64_t round = 0;
    std::string peer;
    uint64_t seed = 0;
  };
  const std::vector<SeenFit>& fits() const { return fits_; }
  // Clients send a Heartbeat every `ms` of simulated time while idle (0, the default: never), as
  // real agents do; a kLeaves client stops once it has left.
  void set_heartbeat_ms(int64_t ms) { heartbeat_ms_ = ms; }
  // Receive() calls so far; safe to read from another thread.
  int64_t receive_calls() const { return receive_calls_.load(); }

 private:
  void Queue(const std::string& peer, wire::Message msg);

  std::map<std::string, SyntheticClient> clients_;  // by peer id (== client id)
  ModelLayout layout_;
  ManualClock* clock_;
  Rng delivery_;
  std::vector<transport::Inbound> pending_;
  // Answers of slow clients (delay_ms), each with the simulated time it is due.
  std::vector<std::pair<int64_t, transport::Inbound>> delayed_;
  std::map<std::pair<std::string, int>, int> errors_;
  std::map<std::string, std::string> last_error_text_;
  EvaluateAnswer evaluate_answer_;
  std::vector<SeenEvaluate> evaluations_;
  std::map<std::string, uint64_t> versions_;   // model version of each peer's last instruction
  std::map<std::string, std::string> nonces_;  // nonce of each peer's last instruction
  std::map<std::string, std::string> previous_nonces_;
  bool authenticated_ = false;
  int64_t heartbeat_ms_ = 0;
  int64_t last_heartbeat_ms_ = 0;
  std::set<std::string> gone_;            // kLeaves clients that have left
  std::map<std::string, int> fits_seen_;  // kFailsFirst: instructions each peer was sent
  std::vector<SeenFit> fits_;
  int shutdowns_ = 0;
  std::atomic<int64_t> receive_calls_{0};
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
};

}  // namespace huddle::testing
