// The client agent's protocol logic, independent of any transport.
//
// A ClientAgent holds a client's identity and its local data (a view, so simulated clients can
// share one copy of a data set). It turns each coordinator message into its replies:
//
//   Start()                 -> Join
//   Welcome                 -> (remember the job's model)
//   FitInstruction + model  -> the client's privacy guard admits the round or refuses it
//                              (client/privacy_guard.h: its own policy and ledger)
//                              -> Error rejected (refused: nothing is trained or sent), or
//                              train locally from the global model (DP-SGD when the train config
//                              asks); delta = local - global clipped to the instruction's clip
//                              norm, all on the training device (models/update.h), or across the
//                              ranks of a silo (client/silo.h); in local DP mode add the noise on
//                              the host (privacy/noise.h); a DP release is in the guard's ledger
//                              before it leaves, and a release asked for again (a coordinator
//                              restart) is the same tensors, not a new draw
//                              -> UploadRequest (the delta waits for a grant)
//   UploadGrant             -> FitResult + delta tensors
//   Heartbeat               -> (nothing; the coordinator is alive)
//   Error unknown_client    -> Join (the coordinator restarted or forgot us)
//   Error version_mismatch  -> fatal error
//   Error auth_refused      -> fatal error (key revoked, or the id is not the key's)
//   Shutdown                -> done()
//
// The same agent runs behind a ZeroMQ DEALER in `huddle client` (client/runner.h) and behind the
// in-process transport in simulations.
//
// Thread-safety: none; the caller serialises calls.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/privacy_guard.h"
#include "client/silo.h"
#include "common/status.h"
#include "data/dataset.h"
#include "models/dp_sgd.h"
#include "models/model.h"
#include "models/update.h"
#include "privacy/accountant.h"
#include "privacy/noise.h"
#include "proto/messages.h"

namespace huddle::client {

class ClientAgent {
 public:
  // `data` must outlive the agent. `routine_logs_at_info`: log joins, rounds and shutdown at info
  // (a real agent) or at debug (one of a thousand simulated agents).
  ClientAgent(std::string client_id, const data::DatasetView* data,
              bool routine_logs_at_info = true);

  wire::Message MakeJoin() const;

  // Where local training runs (kernels/backend.h; not owned, must outlive the agent).
  // nullptr, the default: the CPU.
  void set_backend(kernels::Backend* backend) { backend_ = backend; }
  // Trains every round across the ranks of `silo` (client/silo.h; not owned, must outlive the
  // agent) instead of on the backend: the client is a silo of silo->nproc() devices. nullptr, the
  // default: no silo.
  void set_silo(Silo* silo) { silo_ = silo; }

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

  // Replaces the OS-keyed noise source (local DP noise, DP-SGD) with `source`, e.g. a seeded one
  // in tests. A seeded source is NOT PRIVATE.
  void set_noise_source(privacy::NoiseSource source) { noise_.emplace(std::move(source)); }

 private:
  StatusOr<std::vector<wire::Message>> OnFit(const wire::Message& msg,
                                             const wire::FitInstruction& fit);
  std::vector<wire::Message> OnGrant(const wire::Message& msg);
  // Trains from `global` and returns the update, clipped to clip_norm (the instruction's, or the
  // client policy's if smaller) and in local mode noised as the instruction says.
  StatusOr<models::Update> TrainAndPrivatize(const wire::FitInstruction& fit, double clip_norm,
                                             uint64_t seed, const TensorList& global);
  void LogSpend(uint64_t round, bool local, bool dp_sgd);
  privacy::NoiseSource& noise();
  StatusOr<std::vector<wire::Message>> OnError(const wire::Message& msg, const wire::Error& err);

  std::string client_id_;
  const data::DatasetView* data_;
  spdlog::level::level_enum routine_level_;
  std::optional<models::ModelSpec> model_;
  std::string job_name_;  // from the Welcome
  PrivacyGuard guard_ = PrivacyGuard::Trusting();
  bool done_ = false;
  int64_t rounds_trained_ = 0;
  std::optional<privacy::NoiseSource> noise_;  // created on first use
  kernels::Backend* backend_ = nullptr;        // not owned; nullptr = the CPU
  Silo* silo_ = nullptr;                       // not owned; nullptr = no silo

  // The update waiting for an upload grant.
  struct Pending {
    uint64_t round = 0;
    wire::FitResult result;
    std::shared_ptr<const TensorList> delta;
  };
  std::optional<Pending> pending_;
};

}  // namespace huddle::client
