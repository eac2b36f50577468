// A client's own privacy policy and ledger: what it agrees to release, and a durable record of
// what it did release.
//
// Local DP and DP-SGD inside a client are meant to protect the client's data from the
// coordinator, so the coordinator cannot be the one that decides how much noise is enough or keeps
// the only account of the spend. The guard sits in the agent between the FitInstruction and the
// upload:
//
//   Admit(request)   checks the round against the policy before any training: the mode the policy
//                    requires, the minimum noise multiplier, and that the release would keep this
//                    client's epsilon (its own ledger, all jobs) within the maximum. A refusal is
//                    FailedPrecondition naming the rule and the numbers; the agent tells the
//                    coordinator and trains nothing. Admit also names the release (a digest of the
//                    job, round, model version, global model and every setting that shapes the
//                    update, but not the seed, nonce or deadline) and, when that release was
//                    already made, hands back the very tensors sent then: a coordinator that
//                    restarts and asks again gets the same noised update, never a second noised
//                    version of it.
//   Record(...)      appends the release to the ledger (fsync'd: one entry per unit of privacy,
//                    local DP under the policy's adjacency, DP-SGD as its (q, z, steps)) and then
//                    keeps the released tensors (ledger_path + ".last_release", written
//                    atomically), BEFORE the agent sends anything. A crash between the two leaves a
//                    ledger entry without a cached copy; the next request re-noises and is
//                    accounted again (an over-count, never an under-count).
//
// Open refuses a ledger that lost releases (privacy/ledger.h: truncated, torn or dropped lines, a
// deleted ledger or mark), and a kept release the ledger has no entry for (it is written only
// after its entry, so the ledger lost that entry), with DataLoss saying how to recover: restore the
// ledger and its mark from a backup, or set `privacy.acknowledge_ledger_loss: true`, which counts
// the lost releases as an unbounded spend (epsilon infinite: under a max_epsilon no new DP release
// is admitted) and keeps the kept release in the ledger, so that a round asked again gets the same
// tensors, never a second noised version. The ledger then opens cleanly; the flag can go.
//
// Without a ledger path the guard keeps its ledger and the last release in memory (simulations,
// tests): the same checks, not durable. Without a policy section it admits whatever the
// coordinator asks (the coordinator is then trusted with the settings) but still accounts and
// de-duplicates releases for this process's lifetime.
//
// Thread-safety: none; the agent serialises calls.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "privacy/accountant.h"
#include "privacy/ledger.h"
#include "proto/messages.h"

namespace huddle::client {

// Client-level local DP: the client clips its whole update and adds the noise itself.
struct LocalDpPolicy {
  bool require = false;               // refuse every round that is not in local DP mode
  double min_noise_multiplier = 0;    // refuse a smaller z (noise std / C)
  std::optional<double> max_epsilon;  // refuse a release that would take the spend past it
  double delta = 1e-5;                // the delta epsilon is computed at
  std::optional<double> clip_norm;    // clip to at most this C (the noise is then z * C)
  // privacy::kReplaceOne (default: the client's data swapped for any other; sensitivity 2C) or
  // privacy::kAddRemove (the client's data or none; sensitivity C, weaker).
  std::string adjacency = privacy::kReplaceOne;
};

// Example-level DP-SGD inside the client (models/dp_sgd.h).
struct DpSgdPolicy {
  bool require = false;  // refuse every round that does not train with DP-SGD
  double min_noise_multiplier = 0;
  std::optional<double> max_epsilon;
  double delta = 1e-5;
  privacy::AccountantKind accountant = privacy::AccountantKind::kRdp;
};

// Client-level distributed DP: under secure aggregation the client adds its share of the noise
// (client/secagg_member.h). The coordinator sizes the share; the client checks it by its own
// count: m honest shares of variance s at least are in any sum the coordinator can unmask, m from
// the session by this client's own assumptions (aggregation/secagg/graph.h's HonestShares: the
// session's minimum, less the colluders it assumes, less what dropping members can split away),
// a noise multiplier sqrt(m s) / Delta (Delta = C 2^e + sqrt(d) on the session's grid). Each
// release is accounted in its own ledger under replace-one.
struct DistributedDpPolicy {
  bool require = false;             // refuse every round that is not in distributed DP mode
  double min_noise_multiplier = 0;  // refuse a session whose sum's z, by the count above, is less
  std::optional<double> max_epsilon;
  double delta = 1e-5;
};

struct ClientPrivacyPolicy {
  std::optional<LocalDpPolicy> local;
  std::optional<DpSgdPolicy> dp_sgd;
  std::optional<DistributedDpPolicy> distributed;
  std::string ledger_path;  // the client's ledger; "" = in memory only
  // `privacy.acknowledge_ledger_loss`: open a ledger that lost releases anyway, counting the loss
  // as unbounded (above). Default false: such a ledger is refused.
  bool acknowledge_ledger_loss = false;
  // `privacy.reply_after_s`: the client holds its first reply to a round (after training) until
  // this long after the instruction arrived, so that the coordinator, the adversary of local and
  // distributed DP, cannot read the size of its data from when it answers. Unset: under a local
  // or distributed DP policy, half the deadline of the job's first instruction (fixed for the
  // job: a coordinator varying its deadlines learns nothing more), otherwise off; 0: off.
  std::optional<int64_t> reply_after_ms;
  bool any() const { return local.has_value() || dp_sgd.has_value() || distributed.has_value(); }
};

// One round as the guard sees it.
struct RoundRequest {
  std::string job;  // the job's name (Welcome)
  uint64_t round = 0;
  const wire::FitInstruction* fit = nullptr;
  const TensorList* global = nullptr;  // may be null for Distributed (model_values says the size)
  int64_t model_values = 0;            // the model's values (distributed DP: the session's length)
  int64_t local_examples = 0;          // n, for DP-SGD's sampling rate and steps
  // Distributed DP: the honest inputs any sum of the session holds, by this client's own count
  // (client/secagg_member.h), or the error that count refused the session with.
  StatusOr<int64_t> honest_shares = int64_t{0};
};

struct Admission {
  std::string release;      // the release's identity (hex digest)
  bool dp_release = false;  // the update is a DP release (local noise and/or DP-SGD)
  // Distributed DP: the client-level release its noise share would make in the planned session,
  // by this client's count (checked again, exactly, once the member list is known: Distributed).
  std::optional<privacy::LedgerEntry> distributed;
  double clip_norm = 0;  // local DP: the C to clip to (the instruction's, or less)
  std::shared_ptr<const TensorList> again;  // the release was made before: send exactly this
};

class PrivacyGuard {
 public:
  // Validates the policy (errors name the client YAML key, privacy.*) and opens its ledger.
  static StatusOr<PrivacyGuard> Open(ClientPrivacyPolicy policy);
  // No policy, ledger in memory: admits every round, still accounts and de-duplicates releases.
  static PrivacyGuard Trusting();

  PrivacyGuard(PrivacyGuard&&) noexcept;
  PrivacyGuard& operator=(PrivacyGuard&&) noexcept;
  ~PrivacyGuard();

  StatusOr<Admission> Admit(const RoundRequest& request) const;
  // Before `released` leaves the client: the ledger entries of this release (local DP with z and
  // C; DP-SGD with its event), then the kept copy (shared, not copied: the tensors must not change
  // afterwards). `noise` describes the noise source. (Distributed DP: RecordDistributed.)
  Status Record(const RoundRequest& request, const Admission& admission,
                std::shared_ptr<const TensorList> released,
                const std::optional<privacy::DpEvent>& dp_sgd, const std::string& noise);
  // Distributed DP: the release a session's noise share makes, by request.honest_shares, checked
  // against the policy (FailedPrecondition naming the rule and the numbers).
  // `release` is ReleaseId of the round (the ledger entry's identity).
  StatusOr<privacy::LedgerEntry> Distributed(const RoundRequest& request,
                                             const std::string& release) const;
  // Appends a distributed-DP release to the ledger: before the masked input that carries the
  // share leaves the client (a session that never gets it is then over-counted, never under).
  Status RecordDistributed(privacy::LedgerEntry entry, const std::string& noise);

  // This client's spend so far (every job it took part in) at the policy's delta (1e-5 when the
  // policy has no such section). LocalSpent: client-level (local and distributed DP together).
  StatusOr<privacy::Spend> LocalSpent() const;
  StatusOr<privacy::Spend> DpSgdSpent() const;
  const ClientPrivacyPolicy& policy() const { return policy_; }
  struct Kept {
    std::string release;
    std::shared_ptr<const TensorList> tensors;
  };
  // True when the policy protects something: the agent then reports no example counts, losses or
  // timings (under local DP and DP-SGD it never does).
  bool reports_nothing() const { return policy_.any(); }
  // Every release accounted so far (this process's, or the durable ledger's).
  const std::vector<privacy::LedgerEntry>& entries() const;

 private:
  PrivacyGuard(ClientPrivacyPolicy policy, std::optional<privacy::PrivacyLedger> ledger);
  Status Append(const privacy::LedgerEntry& entry);
  // FailedPrecondition naming `key` when `next` would take the client-level spend (every local
  // and distributed release in the ledger) past max_epsilon at delta.
  Status CheckClientLevelCap(const privacy::DpEvent& next, double delta, double max_epsilon,
                             const char* key) const;
  std::string CachePath() const;

  ClientPrivacyPolicy policy_;
  std::optional<privacy::PrivacyLedger> ledger_;  // durable; or entries_ in memory
  std::vector<privacy::LedgerEntry> memory_;
  std::optional<Kept> kept_;  // the last release (also on disk with a ledger path)
};

// The identity of the release a round asks for (see above).
std::string ReleaseId(const RoundRequest& request);

}  // namespace huddle::client
