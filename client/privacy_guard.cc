#include "client/privacy_guard.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

#include "aggregation/secagg/quantize.h"
#include "common/digest.h"
#include "common/file_util.h"
#include "common/tensor_io.h"
#include "models/dp_sgd.h"
#include "privacy/distributed.h"

namespace huddle::client {
namespace {

constexpr char kCacheMagic[] = "HUDDLER1";  // a kept release: magic, release id, tensors
constexpr double kDefaultDelta = 1e-5;
constexpr char kHowToAcknowledge[] =
    "or set privacy.acknowledge_ledger_loss: true in this client's configuration to go on with "
    "the lost releases counted as an unbounded spend (epsilon infinite: under a max_epsilon no "
    "new DP release is admitted)";

bool Positive(double v) { return std::isfinite(v) && v > 0; }

// The keys both parts of a policy have, under privacy.<part>.
Status CheckLimits(const char* part, double min_noise_multiplier,
                   const std::optional<double>& max_epsilon, double delta) {
  if (!(min_noise_multiplier >= 0 && std::isfinite(min_noise_multiplier))) {
    return absl::InvalidArgumentError(absl::StrCat("privacy.", part,
                                                   ".min_noise_multiplier must be finite and >= 0, "
                                                   "got ",
                                                   min_noise_multiplier));
  }
  if (max_epsilon && !Positive(*max_epsilon)) {
    return absl::InvalidArgumentError(
        absl::StrCat("privacy.", part, ".max_epsilon must be finite and > 0, got ", *max_epsilon));
  }
  if (!(delta > 0 && delta < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("privacy.", part, ".delta must lie in (0, 1), got ", delta));
  }
  return absl::OkStatus();
}

StatusOr<PrivacyGuard::Kept> ReadKeptFile(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  ByteReader r(bytes, path);
  HUDDLE_ASSIGN_OR_RETURN(std::string magic, r.Bytes(8));
  if (magic != std::string(kCacheMagic, 8)) return absl::DataLossError("bad magic");
  HUDDLE_ASSIGN_OR_RETURN(const uint64_t length, r.U64());
  if (length == 0 || length > 128) return absl::DataLossError("bad release id");
  PrivacyGuard::Kept kept;
  HUDDLE_ASSIGN_OR_RETURN(kept.release, r.Bytes(static_cast<size_t>(length)));
  HUDDLE_ASSIGN_OR_RETURN(TensorList tensors, r.TensorListValue());
  kept.tensors = std::make_shared<const TensorList>(std::move(tensors));
  if (r.remaining() != 0) return absl::DataLossError("trailing bytes");
  return kept;
}

std::string Refuse(const std::string& why) {
  return absl::StrCat("this client's privacy policy refuses the round: ", why);
}

}  // namespace

std::string ReleaseId(const RoundRequest& r) {
  Digest d;
  d.Add(std::string_view("huddle-release-v1")).Add(r.job).Add(r.round);
  const wire::FitInstruction& fit = *r.fit;
  d.Add(fit.model_version);
  d.Add(static_cast<uint64_t>(fit.privacy.mode))
      .Add(fit.privacy.clip_norm)
      .Add(fit.privacy.noise_multiplier);
  const wire::TrainConfig& t = fit.train;
  d.Add(static_cast<uint64_t>(t.epochs))
      .Add(static_cast<uint64_t>(t.batch_size))
      .Add(t.learning_rate)
      .Add(t.momentum)
      .Add(t.weight_decay);
  d.Add(static_cast<uint64_t>(t.dp_sgd.has_value()));
  if (t.dp_sgd) {
    d.Add(t.dp_sgd->noise_multiplier)
        .Add(t.dp_sgd->clip_norm)
        .Add(static_cast<uint64_t>(t.dp_sgd->expected_batch_size));
  }
  for (const Tensor& tensor : *r.global) {
    d.Add(tensor.spec.name);
    for (int64_t dim : tensor.spec.shape) d.Add(static_cast<uint64_t>(dim));
    d.Add(std::as_bytes(std::span(tensor.data)));
  }
  return d.Hex();
}

StatusOr<PrivacyGuard> PrivacyGuard::Open(ClientPrivacyPolicy policy) {
  if (policy.local) {
    const LocalDpPolicy& l = *policy.local;
    HUDDLE_RETURN_IF_ERROR(CheckLimits("local", l.min_noise_multiplier, l.max_epsilon, l.delta));
    if (l.clip_norm && !Positive(*l.clip_norm)) {
      return absl::InvalidArgumentError(
          absl::StrCat("privacy.local.clip_norm must be finite and > 0, got ", *l.clip_norm));
    }
    if (l.adjacency != privacy::kReplaceOne && l.adjacency != privacy::kAddRemove) {
      return absl::InvalidArgumentError(absl::StrCat("privacy.local.adjacency '", l.adjacency,
                                                     "' is not allowed (replace_one, add_remove)"));
    }
  }
  if (policy.dp_sgd) {
    const DpSgdPolicy& s = *policy.dp_sgd;
    HUDDLE_RETURN_IF_ERROR(CheckLimits("dp_sgd", s.min_noise_multiplier, s.max_epsilon, s.delta));
  }
  if (policy.distributed) {
    const DistributedDpPolicy& d = *policy.distributed;
    HUDDLE_RETURN_IF_ERROR(
        CheckLimits("distributed", d.min_noise_multiplier, d.max_epsilon, d.delta));
  }
  std::optional<privacy::PrivacyLedger> ledger;
  if (!policy.ledger_path.empty()) {
    const auto parent = std::filesystem::path(policy.ledger_path).parent_path();
    if (!parent.empty()) HUDDLE_RETURN_IF_ERROR(MakeDirs(parent.string()));
    privacy::LedgerOpenOptions options;
    options.acknowledge_loss = policy.acknowledge_ledger_loss;
    options.how_to_acknowledge = kHowToAcknowledge;
    HUDDLE_ASSIGN_OR_RETURN(auto opened, privacy::PrivacyLedger::Open(policy.ledger_path, options));
    ledger.emplace(std::move(opened));
  }
  PrivacyGuard guard(std::move(policy), std::move(ledger));
  if (guard.ledger_ && std::filesystem::exists(guard.CachePath())) {
    // The last release, kept so that it can be sent again as it was. An unreadable one is not
    // usable (the ledger is checked on its own: a round asked again is then noised and accounted
    // again, an over-count). A readable one without its ledger entry means the ledger lost
    // releases: the copy is written only after its entry is durable.
    auto kept = ReadKeptFile(guard.CachePath());
    if (!kept.ok()) {
      spdlog::warn("{}: not a readable kept release ({}); ignoring it", guard.CachePath(),
                   kept.status().message());
    } else if (guard.ledger_->FindRelease(kept->release) != nullptr) {
      guard.kept_ = *std::move(kept);
    } else if (guard.policy_.acknowledge_ledger_loss) {
      spdlog::error(
          "{}: release {} was made and {} has no entry for it; the loss is acknowledged: counted "
          "as an unbounded spend, and the release is sent again as it was if asked",
          guard.CachePath(), kept->release, guard.policy_.ledger_path);
      HUDDLE_RETURN_IF_ERROR(guard.ledger_->AppendLost(1, kept->release));
      guard.kept_ = *std::move(kept);
    } else {
      return absl::DataLossError(absl::StrCat(
          "the privacy ledger ", guard.policy_.ledger_path, " lost releases: the kept release ",
          guard.CachePath(), " (", kept->release,
          ") is written only after its ledger entry is durable, and the ledger has no entry for "
          "it. The privacy already spent cannot be established, so it is refused (going on "
          "would spend again what was spent, and could noise a release twice). To recover: "
          "restore ",
          guard.policy_.ledger_path, " and ", guard.ledger_->mark_path(),
          " together from a backup; ", kHowToAcknowledge));
    }
  }
  return guard;
}

PrivacyGuard PrivacyGuard::Trusting() { return PrivacyGuard(ClientPrivacyPolicy{}, std::nullopt); }

PrivacyGuard::PrivacyGuard(ClientPrivacyPolicy policy, std::optional<privacy::PrivacyLedger> ledger)
    : policy_(std::move(policy)), ledger_(std::move(ledger)) {}
PrivacyGuard::PrivacyGuard(PrivacyGuard&&) noexcept = default;
PrivacyGuard& PrivacyGuard::operator=(PrivacyGuard&&) noexcept = default;
PrivacyGuard::~PrivacyGuard() = default;

const std::vector<privacy::LedgerEntry>& PrivacyGuard::entries() const {
  return ledger_ ? ledger_->entries() : memory_;
}

std::string PrivacyGuard::CachePath() const { return policy_.ledger_path + ".last_release"; }

Status PrivacyGuard::Append(const privacy::LedgerEntry& entry) {
  if (ledger_) return ledger_->Append(entry);
  memory_.push_back(entry);
  return absl::OkStatus();
}

StatusOr<privacy::Spend> PrivacyGuard::LocalSpent() const {
  const double delta = policy_.local         ? policy_.local->delta
                       : policy_.distributed ? policy_.distributed->delta
                                             : kDefaultDelta;
  return privacy::ComputeSpend(privacy::EventsOf(entries(), privacy::kUnitClient), delta,
                               privacy::AccountantKind::kRdp);
}

StatusOr<privacy::Spend> PrivacyGuard::DpSgdSpent() const {
  const double delta = policy_.dp_sgd ? policy_.dp_sgd->delta : kDefaultDelta;
  const auto kind = policy_.dp_sgd ? policy_.dp_sgd->accountant : privacy::AccountantKind::kRdp;
  return privacy::ComputeSpend(privacy::EventsOf(entries(), privacy::kUnitExample), delta, kind);
}

StatusOr<privacy::LedgerEntry> PrivacyGuard::Distributed(const RoundRequest& request,
                                                         const std::string& release) const {
  const wire::FitInstruction& fit = *request.fit;
  const wire::SecureAggregation& session = *fit.secure_aggregation;  // the codec requires it
  if (!request.honest_shares.ok()) {
    return absl::FailedPreconditionError(
        Refuse(std::string(request.honest_shares.status().message())));
  }
  const int64_t honest = *request.honest_shares;
  if (honest < 1) {
    return absl::FailedPreconditionError(
        Refuse("no honest noise share is guaranteed in a sum of the session"));
  }
  // The words of the update (a weight word, used only without DP, carries no noise): as many as
  // the model has values, or the session is not this round's.
  const auto dim = static_cast<int64_t>(session.length - (session.weight_cap > 0 ? 1 : 0));
  const int64_t values = request.model_values;
  if (dim != values) {
    return absl::FailedPreconditionError(
        Refuse(absl::StrCat("the session masks ", dim, " values and the model has ", values)));
  }
  const double clip = std::min(session.clip_norm, fit.privacy.clip_norm);
  const double sensitivity =
      aggregation::secagg::GridSensitivity(clip, session.scale_exponent, dim);
  privacy::LedgerEntry e = privacy::DistributedRelease(
      request.round, {session.noise_variance, honest, sensitivity, dim}, clip, {});
  e.job = request.job;
  e.release = release;
  if (policy_.distributed) {
    const DistributedDpPolicy& d = *policy_.distributed;
    if (!(e.noise_multiplier >= d.min_noise_multiplier)) {
      return absl::FailedPreconditionError(Refuse(absl::StrCat(
          "the session's noise shares give the sum a noise multiplier of ", e.noise_multiplier,
          " by this client's count (", honest, " honest shares at least), below the minimum ",
          d.min_noise_multiplier, " (privacy.distributed.min_noise_multiplier)")));
    }
    if (d.max_epsilon) {
      HUDDLE_RETURN_IF_ERROR(CheckClientLevelCap(e.event(), d.delta, *d.max_epsilon,
                                                 "privacy.distributed.max_epsilon"));
    }
  }
  return e;
}

Status PrivacyGuard::RecordDistributed(privacy::LedgerEntry entry, const std::string& noise) {
  entry.noise = noise;
  return Append(entry);
}

Status PrivacyGuard::CheckClientLevelCap(const privacy::DpEvent& next, double delta,
                                         double max_epsilon, const char* key) const {
  // Client-level releases compose whatever their mode: local and distributed DP together.
  std::vector<privacy::DpEvent> events = privacy::EventsOf(entries(), privacy::kUnitClient);
  events.push_back(next);
  HUDDLE_ASSIGN_OR_RETURN(privacy::Spend would,
                          privacy::ComputeSpend(events, delta, privacy::AccountantKind::kRdp));
  if (!(would.epsilon <= max_epsilon)) {
    return absl::FailedPreconditionError(Refuse(
        absl::StrCat("this release would take the client's client-level epsilon to ", would.epsilon,
                     " at delta ", delta, ", past its maximum ", max_epsilon, " (", key, ")")));
  }
  return absl::OkStatus();
}

StatusOr<Admission> PrivacyGuard::Admit(const RoundRequest& request) const {
  const wire::FitInstruction& fit = *request.fit;
  const bool local = fit.privacy.mode == wire::UpdatePrivacy::Mode::kLocal;
  const bool distributed = fit.privacy.mode == wire::UpdatePrivacy::Mode::kDistributed;
  const bool dp_sgd = fit.train.dp_sgd.has_value();
  Admission a;
  a.dp_release = local || dp_sgd;
  a.clip_norm = fit.privacy.clip_norm;
  if (distributed) {
    HUDDLE_ASSIGN_OR_RETURN(a.distributed, Distributed(request, ReleaseId(request)));
  } else if (policy_.distributed && policy_.distributed->require) {
    return absl::FailedPreconditionError(Refuse(
        "it requires distributed DP (privacy.distributed.require) and the round asks for another "
        "mode"));
  }
  if (!a.dp_release) {
    if (policy_.local && policy_.local->require) {
      return absl::FailedPreconditionError(
          Refuse("it requires local DP (privacy.local.require) and the round asks for none"));
    }
    if (policy_.dp_sgd && policy_.dp_sgd->require) {
      return absl::FailedPreconditionError(
          Refuse("it requires DP-SGD (privacy.dp_sgd.require) and the round trains without it"));
    }
    return a;
  }
  a.release = ReleaseId(request);
  if (kept_ && kept_->release == a.release && !distributed) {
    a.again = kept_->tensors;  // already released and accounted: the same bytes again
    return a;
  }
  if (local && policy_.local) {
    const LocalDpPolicy& l = *policy_.local;
    const double z = fit.privacy.noise_multiplier;
    if (!(z >= l.min_noise_multiplier)) {
      return absl::FailedPreconditionError(
          Refuse(absl::StrCat("local DP noise multiplier ", z, " is below the minimum ",
                              l.min_noise_multiplier, " (privacy.local.min_noise_multiplier)")));
    }
    if (l.clip_norm) a.clip_norm = std::min(a.clip_norm, *l.clip_norm);
    if (l.max_epsilon) {
      const privacy::LedgerEntry next = privacy::LedgerEntry::ClientGaussian(
          privacy::kModeLocal, request.round, 1, z, a.clip_norm, l.adjacency, {});
      HUDDLE_RETURN_IF_ERROR(
          CheckClientLevelCap(next.event(), l.delta, *l.max_epsilon, "privacy.local.max_epsilon"));
    }
  } else if (!local && policy_.local && policy_.local->require) {
    return absl::FailedPreconditionError(
        Refuse("it requires local DP (privacy.local.require) and the round asks for another mode"));
  }
  if (dp_sgd && policy_.dp_sgd) {
    const DpSgdPolicy& s = *policy_.dp_sgd;
    const wire::DpSgdConfig& c = *fit.train.dp_sgd;
    if (!(c.noise_multiplier >= s.min_noise_multiplier)) {
      return absl::FailedPreconditionError(Refuse(
          absl::StrCat("DP-SGD noise multiplier ", c.noise_multiplier, " is below the minimum ",
                       s.min_noise_multiplier, " (privacy.dp_sgd.min_noise_multiplier)")));
    }
    if (s.max_epsilon) {
      const int64_t n = std::max<int64_t>(1, request.local_examples);
      const int64_t m = std::min(c.expected_batch_size, n);
      HUDDLE_ASSIGN_OR_RETURN(const int64_t steps, models::DpSgdSteps(fit.train.epochs, n, m));
      std::vector<privacy::DpEvent> events = privacy::EventsOf(entries(), privacy::kUnitExample);
      events.push_back(
          {static_cast<double>(m) / static_cast<double>(n), c.noise_multiplier, steps});
      HUDDLE_ASSIGN_OR_RETURN(privacy::Spend would,
                              privacy::ComputeSpend(events, s.delta, s.accountant));
      if (!(would.epsilon <= *s.max_epsilon)) {
        return absl::FailedPreconditionError(Refuse(
            absl::StrCat("this round's DP-SGD would take the epsilon of this client's examples to ",
                         would.epsilon, " at delta ", s.delta, ", past its maximum ",
                         *s.max_epsilon, " (privacy.dp_sgd.max_epsilon)")));
      }
    }
  } else if (!dp_sgd && policy_.dp_sgd && policy_.dp_sgd->require) {
    return absl::FailedPreconditionError(
        Refuse("it requires DP-SGD (privacy.dp_sgd.require) and the round trains without it"));
  }
  return a;
}

Status PrivacyGuard::Record(const RoundRequest& request, const Admission& admission,
                            std::shared_ptr<const TensorList> released,
                            const std::optional<privacy::DpEvent>& dp_sgd,
                            const std::string& noise) {
  if (admission.again) return absl::OkStatus();
  if (!admission.dp_release) return absl::OkStatus();
  const wire::FitInstruction& fit = *request.fit;
  auto for_this_release = [&](privacy::LedgerEntry e) {
    e.job = request.job;
    e.release = admission.release;
    return e;
  };
  if (fit.privacy.mode == wire::UpdatePrivacy::Mode::kLocal) {
    HUDDLE_RETURN_IF_ERROR(Append(for_this_release(privacy::LedgerEntry::ClientGaussian(
        privacy::kModeLocal, request.round, 1, fit.privacy.noise_multiplier, admission.clip_norm,
        policy_.local ? policy_.local->adjacency : privacy::kReplaceOne, noise))));
  }
  if (dp_sgd) {
    HUDDLE_RETURN_IF_ERROR(Append(for_this_release(privacy::LedgerEntry::DpSgdSteps(
        request.round, *dp_sgd, fit.train.dp_sgd ? fit.train.dp_sgd->clip_norm : 0, noise))));
  }
  kept_ = Kept{admission.release, std::move(released)};
  if (!ledger_) return absl::OkStatus();
  std::string bytes(kCacheMagic, 8);
  AppendU64(admission.release.size(), &bytes);
  bytes += admission.release;
  AppendTensorList(*kept_->tensors, &bytes);
  return WriteFileAtomic(CachePath(), bytes);
}

}  // namespace huddle::client
