// The client agent's protocol logic, independent of any transport.
//
// A ClientAgent holds a client's identity and drives its trainer (huddle/client/trainer.h): a
// user's trainer (the client SDK), or Huddle's built-in trainer on a local data set (a view, so
// simulated clients can share one copy of a data set). Every trainer's result is processed the
// same way here. It turns each coordinator message into its replies:
//
//   Start()                 -> Join (the trainer's example count, unless a privacy policy hides it)
//   Welcome                 -> the job's model: its tensors, which every global model and every
//                              result must match; the built-in trainer gets the model's layers;
//                              the trainer's Start may refuse the job (a fatal error)
//   FitInstruction + model  -> the client's privacy guard admits the round or refuses it
//                              (client/privacy_guard.h: its own policy and ledger)
//                              -> Error rejected (refused: nothing is trained or sent), or
//                              the trainer's Fit from the global model (DP-SGD when the train
//                              config asks: the trainer reports the run, which must be within what
//                              the round allowed); its result checked (names, shapes, finite
//                              values, example count); delta = local - global (or the trainer's
//                              delta) clipped to the instruction's clip norm (models/update.h);
//                              in local DP mode the noise added on the host (privacy/noise.h); a
//                              DP release is in the guard's ledger before it leaves, and a release
//                              asked for again (a coordinator restart) is the same tensors, not a
//                              new draw
//                              -> UploadRequest (the delta waits for a grant)
//                              (with secure aggregation, the update is quantized and masked
//                              instead, client/secagg_member.h: -> advertise, then each of the
//                              coordinator's SecAggData stages gets its answer; the mask request
//                              -> UploadRequest, UploadGrant -> SecAggMaskedInput. Under
//                              distributed DP the session is checked against the client's policy
//                              once its member list is known, and the noise share is in the
//                              ledger before the masked input that carries it leaves)
//   UploadGrant             -> FitResult + delta tensors
//   Heartbeat               -> (nothing; the coordinator is alive)
//   Error unknown_client    -> Join (the coordinator restarted or forgot us)
//   Error version_mismatch  -> fatal error
//   Error auth_refused      -> fatal error (key revoked, or the id is not the key's)
//   Shutdown                -> done()
//
// The same agent runs behind a ZeroMQ DEALER in `huddle client` and the client SDK
// (client/runner.h) and behind the in-process transport in simulations.
//
// Thread-safety: none; the caller serialises calls.
#pragma once

#include <spdlog/spdlog.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/builtin_trainer.h"
#include "client/privacy_guard.h"
#include "client/secagg_member.h"
#include "client/silo.h"
#include "common/status.h"
#include "data/dataset.h"
#include "huddle/client/trainer.h"
#include "models/dp_sgd.h"
#include "models/model.h"
#include "models/update.h"
#include "privacy/accountant.h"
#include "privacy/noise.h"
#include "proto/messages.h"

namespace huddle::client {

class ClientAgent {
 public:
  // Drives `trainer` (not owned; must outlive the agent). `routine_logs_at_info`: log joins,
  // rounds and shutdown at info (a real agent) or at debug (one of a thousand simulated agents).
  ClientAgent(std::string client_id, Trainer* trainer, bool routine_logs_at_info = true);
  // Huddle's built-in trainer (owned by the agent) on `data`, which must outlive the agent.
  ClientAgent(std::string client_id, const data::DatasetView* data,
              bool routine_logs_at_info = true);

  wire::Message MakeJoin() const;

  // The built-in trainer (nullptr for an agent driving a user's trainer), for its device:
  // set_backend (kernels/backend.h; not owned, must outlive the agent; nullptr, the default: the
  // CPU), or set_silo (client/silo.h; every round trains across the silo's ranks).
  BuiltinTrainer* builtin() { return builtin_.get(); }

  // Replies to one coordinator message. An error is fatal for the agent (e.g. the coordinator
  // speaks another protocol version); everything recoverable is logged and answered instead.
  StatusOr<std::vector<wire::Message>> Handle(const wire::Message& msg);

  bool done() const { return done_; }
  const std::string& client_id() const { return client_id_; }
  // Rounds trained so far (for logs and tests).
  int64_t rounds_trained() const { return rounds_trained_; }
  // The client's privacy policy and the releases it accounted (by default: no policy, the
  // coordinator's settings are trusted, the ledger is in memory).
  void set_privacy_guard(PrivacyGuard guard) { guard_ = std::move(guard); }
  const PrivacyGuard& privacy_guard() const { return guard_; }
  // The guard back, when the agent's job is over (a service agent keeps one guard, its policy and
  // ledger, across the jobs it takes part in); the agent is then trusting, as a fresh one.
  PrivacyGuard TakePrivacyGuard() {
    PrivacyGuard out = std::move(guard_);
    guard_ = PrivacyGuard::Trusting();
    return out;
  }
  // A service's job this agent joins (its Join names it: service/service.h); "" for a
  // coordinator's one job.
  void set_job(std::string job) { job_ = std::move(job); }

  // Replaces the OS-keyed noise source (local DP noise, DP-SGD) with `source`, e.g. a seeded one
  // in tests. A seeded source is NOT PRIVATE.
  void set_noise_source(privacy::NoiseSource source) { noise_.emplace(std::move(source)); }

  // This client's identity in secure aggregation (its certified signing key, the project key it
  // pins, what it assumes). Without one it refuses every round that aggregates securely. Its
  // policy's signature cache, when null, is the agent's own (kept for the agent's life, so that
  // the same certificates are verified once).
  void set_secagg_identity(SecAggIdentity identity);
  // Sessions of secure aggregation this client joins for one round at most (a coordinator that
  // aborts sessions to draw other graphs gets no more; default 4).
  void set_max_sessions_per_round(int64_t n) { max_sessions_per_round_ = n; }
  // Makes this client behave like a device `factor` (>= 1; default 1) times slower: after each
  // round's local training it waits (factor - 1) x the training's wall time before it asks to
  // upload (or advertises, in secure aggregation), and reports factor x that time as its training
  // seconds. `sleep` (default: std::this_thread::sleep_for) waits the given milliseconds; tests
  // pass one that records instead.
  void set_slowdown(double factor, std::function<void(int64_t ms)> sleep = {});

 private:
  StatusOr<std::vector<wire::Message>> OnFit(const wire::Message& msg,
                                             const wire::FitInstruction& fit);
  std::vector<wire::Message> OnGrant(const wire::Message& msg);
  // Secure aggregation's stages (the member of the round in secagg_).
  std::vector<wire::Message> OnSecAgg(const wire::Message& msg);
  // Ends this client's part in the round's secure aggregation with `why` (logged and answered).
  std::vector<wire::Message> LeaveSecAgg(uint64_t round, const Status& why);
  // Federated evaluation (client/agent_evaluate.cc): the instruction's model, checked against the
  // job's layout, evaluated by the trainer on its data -> EvaluateResult; or an Error: kRejected
  // when the trainer cannot evaluate, the privacy guard reports nothing computed from the data
  // without noise, or the model is not the job's; kInternal when the evaluation failed.
  std::vector<wire::Message> OnEvaluate(const wire::Message& msg,
                                        const wire::EvaluateInstruction& evaluate);
  // The trainer's Fit from `global`, its result checked, and the update: clipped to clip_norm
  // (the instruction's, or the client policy's if smaller) and in local mode noised as the
  // instruction says. `n`: the examples the round was admitted for (DP-SGD's sampling rate).
  StatusOr<models::Update> TrainAndPrivatize(const wire::Message& msg,
                                             const wire::FitInstruction& fit, double clip_norm,
                                             int64_t n, const TensorList& global);
  // The round's update from the built-in trainer (trained and clipped where the model lives, as a
  // status) or from a user's (its Fit, its result checked, then the delta and the clip on the
  // host), each clipped once to `clip` (0: not clipped) by models::ClipUpdate.
  StatusOr<models::Update> FitBuiltin(const wire::FitInstruction& fit, const FitConfig& config,
                                      double clip, int64_t n, const TensorList& global);
  StatusOr<models::Update> FitUser(const wire::FitInstruction& fit, const FitConfig& config,
                                   double clip, int64_t n, const TensorList& global);
  // The user trainer's Fit, with its exceptions as errors.
  StatusOr<FitResult> CallFit(const TensorList& global, const FitConfig& config);
  void LogSpend(uint64_t round, bool local, bool dp_sgd);
  privacy::NoiseSource& noise();
  // The trainer's example count (0 when it throws).
  int64_t num_examples() const;
  StatusOr<std::vector<wire::Message>> OnError(const wire::Message& msg, const wire::Error& err);
  // Holds the round's first reply until the policy's reply time after `received_ms` (the
  // instruction's arrival), whatever the training took (privacy_guard.h, reply_after_ms).
  void HoldReply(uint64_t round, int64_t received_ms, const wire::FitInstruction& fit);

  std::string client_id_;
  std::unique_ptr<BuiltinTrainer> builtin_;  // the built-in trainer, when the agent owns one
  Trainer* trainer_;                         // builtin_ or the user's
  spdlog::level::level_enum routine_level_;
  std::optional<models::ModelSpec> model_;  // the job's (its Layout: the tensors)
  std::string job_name_;                    // from the Welcome
  std::string job_;                         // the service's job it joins ("": none)
  PrivacyGuard guard_ = PrivacyGuard::Trusting();
  bool done_ = false;
  int64_t rounds_trained_ = 0;
  std::optional<privacy::NoiseSource> noise_;  // created on first use

  // The update waiting for an upload grant.
  struct Pending {
    uint64_t round = 0;
    wire::FitResult result;
    std::shared_ptr<const TensorList> delta;
    // Distributed DP: the round as the guard sees it (no model: its values counted), the release's
    // identity, and the entry to record before the masked input leaves (set at the member list).
    std::optional<wire::FitInstruction> fit;
    int64_t model_values = 0;
    std::string release;
    std::optional<privacy::LedgerEntry> distributed;
    bool distributed_recorded = false;
    bool masked_input_sent = false;  // secure aggregation: this round's input left (once a round)
  };
  std::optional<Pending> pending_;
  // The round's secure aggregation, from its FitInstruction to the unmasking (pending_.round).
  std::optional<SecAggMember> secagg_;
  std::optional<SecAggIdentity> secagg_identity_;
  std::unique_ptr<aggregation::secagg::SignatureCache> own_cache_;
  int64_t max_sessions_per_round_ = 4;
  std::optional<int64_t> reply_hold_ms_;  // the job's, fixed at its first instruction
  double slowdown_ = 1;                   // set_slowdown
  std::function<void(int64_t ms)> sleep_;
  uint64_t sessions_round_ = 0;  // the round sessions_joined_ counts for
  int64_t sessions_joined_ = 0;
};

}  // namespace huddle::client
