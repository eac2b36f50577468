#include "datacenter/privacy_session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "models/dp_sgd.h"
#include "privacy/budget.h"
#include "privacy/report.h"

namespace huddle::datacenter {
namespace {

std::string LedgerPath(const std::string& out_dir) {
  return (std::filesystem::path(out_dir) / privacy::kLedgerFile).string();
}

// Why this session's noise is not private (when SessionNoise::is_private is false).
std::string SessionWhyNot(double z, const SessionNoise& noise) {
  if (!(z > 0)) return "noise_multiplier is 0: no noise is added";
  return fmt::format("the noise comes from '{}', not from the OS CSPRNG", noise.description);
}

}  // namespace

StatusOr<privacy::DpEvent> PlanDpSgd(const DatacenterConfig& c, int64_t n) {
  const DatacenterDpSgd& d = *c.dp_sgd;
  const int64_t m = d.dp.expected_batch_size;
  if (m > n) {
    return absl::InvalidArgumentError(fmt::format(
        "train.dp_sgd.expected_batch_size is {}; the training set has only {} examples", m, n));
  }
  HUDDLE_ASSIGN_OR_RETURN(const int64_t steps, models::DpSgdSteps(c.train.epochs, n, m));
  const privacy::DpEvent event{static_cast<double>(m) / static_cast<double>(n),
                               d.dp.noise_multiplier, steps};
  if (!d.epsilon_budget) return event;
  // The same check as a federated job's plan (privacy/budget.h).
  HUDDLE_ASSIGN_OR_RETURN(
      const privacy::BudgetFit fit,
      privacy::FitBudget(std::span(&event, 1), *d.epsilon_budget, d.delta, d.accountant));
  if (!fit.fits) {
    const std::optional<double>& z = fit.noise_multiplier_that_fits;
    return absl::FailedPreconditionError(fmt::format(
        "train.dp_sgd: {} steps at q = {:.4g} with noise_multiplier {} would spend epsilon {:.4g} "
        "at delta {:g}, over the budget of {} (noise_multiplier {} would fit; or fewer epochs, "
        "or a smaller expected_batch_size)",
        event.steps, event.sampling_rate, event.noise_multiplier, fit.spend.epsilon, d.delta,
        *d.epsilon_budget, z ? fmt::format("{:.4g}", *z) : "none up to 1e12"));
  }
  return event;
}

Status CheckNoLedgerForNonDpRun(const std::string& out_dir) {
  const std::string path = LedgerPath(out_dir);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(fmt::format(
      "{} records DP-SGD releases of an earlier job in this output directory: a run without "
      "train.dp_sgd would replace its DP-protected outputs with non-private ones; use a new "
      "output directory",
      path));
}

std::string JobSpend::Text() const {
  if (is_private) return fmt::format("epsilon {:.4g} at delta {:g}", nominal_epsilon, delta);
  return fmt::format("epsilon: NOT PRIVATE ({}; nominal epsilon {:.4g} at delta {:g})",
                     fmt::join(not_private_because, "; "), nominal_epsilon, delta);
}

void JobSpend::AddTo(nlohmann::json* j) const {
  (*j)["private"] = is_private;
  (*j)["epsilon"] = is_private ? nlohmann::json(nominal_epsilon) : nlohmann::json(nullptr);
  // An infinite nominal epsilon (no noise) is written as null: JSON has no infinity.
  if (!is_private) (*j)["nominal_epsilon"] = nominal_epsilon;
  (*j)["delta"] = delta;
  (*j)["ledger_steps"] = ledger_steps;
}

StatusOr<PrivacySession> PrivacySession::Open(const DatacenterConfig& c, int world_size, int64_t n,
                                              bool resume, const privacy::DpEvent& plan,
                                              SessionNoise noise) {
  HUDDLE_ASSIGN_OR_RETURN(
      privacy::JobLedger ledger,
      privacy::JobLedger::Open(c.out_dir,
                               {.resume = resume, .releases = "DP-SGD", .count_steps = true}));
  for (const privacy::LedgerEntry& e : ledger.entries()) {
    if (e.unit != privacy::kUnitExample || e.mode != privacy::kModeDpSgd) {
      return absl::FailedPreconditionError(fmt::format(
          "{} holds a {} release of unit '{}' (round {}): it is not a datacenter DP-SGD job's "
          "ledger; use this job's own output directory",
          ledger.path(), e.mode, e.unit, e.round));
    }
  }
  return PrivacySession(c, world_size, n, plan, std::move(noise), std::move(ledger));
}

PrivacySession::PrivacySession(const DatacenterConfig& c, int world_size, int64_t n,
                               const privacy::DpEvent& plan, SessionNoise noise,
                               privacy::JobLedger ledger)
    : c_(&c),
      world_size_(world_size),
      n_(n),
      plan_(plan),
      noise_(std::move(noise)),
      ledger_(std::move(ledger)) {}

Status PrivacySession::CheckStart(int64_t start_steps, bool from_checkpoint) {
  const DatacenterDpSgd& d = *c_->dp_sgd;
  if (from_checkpoint) {
    HUDDLE_RETURN_IF_ERROR(ledger_.CheckStepsCovered(start_steps, c_->out_dir + "/checkpoint.bin"));
  }
  recorded_steps_ = start_steps;
  if (!d.epsilon_budget) return absl::OkStatus();
  HUDDLE_ASSIGN_OR_RETURN(const JobSpend done, SpentWhenDone());
  if (done.nominal_epsilon <= *d.epsilon_budget) return absl::OkStatus();
  HUDDLE_ASSIGN_OR_RETURN(const JobSpend spent, Spent());
  return absl::FailedPreconditionError(fmt::format(
      "train.dp_sgd: {} records {} steps (epsilon {:.4g}) and this run has {} of its {} steps "
      "left (q = {:.4g}, noise_multiplier {}): together epsilon {:.4g} at delta {:g}, over the "
      "budget of {}; the job cannot continue within its budget",
      ledger_.path(), spent.ledger_steps, spent.nominal_epsilon,
      std::max<int64_t>(0, plan_.steps - start_steps), plan_.steps, plan_.sampling_rate,
      plan_.noise_multiplier, done.nominal_epsilon, d.delta, *d.epsilon_budget));
}

Status PrivacySession::Record(int64_t epoch, int64_t steps_so_far) {
  privacy::LedgerEntry e = privacy::LedgerEntry::DpSgdSteps(
      static_cast<uint64_t>(epoch),
      privacy::DpEvent{plan_.sampling_rate, plan_.noise_multiplier, steps_so_far - recorded_steps_},
      c_->dp_sgd->dp.clip_norm, noise_.description);
  e.job = c_->job_name;
  HUDDLE_RETURN_IF_ERROR(ledger_.Append(e));
  recorded_steps_ = steps_so_far;
  return absl::OkStatus();
}

StatusOr<JobSpend> PrivacySession::SpendOf(std::vector<privacy::DpEvent> extra) const {
  const DatacenterDpSgd& d = *c_->dp_sgd;
  std::vector<privacy::DpEvent> events = ledger_.Events(privacy::kUnitExample);
  JobSpend s;
  s.delta = d.delta;
  s.ledger_steps = ledger_.steps();
  s.ledger_entries = static_cast<int64_t>(ledger_.entries().size());
  privacy::SessionNoise session{.is_private = noise_.is_private,
                                .why_not = SessionWhyNot(plan_.noise_multiplier, noise_)};
  for (const privacy::DpEvent& e : extra) {
    if (e.steps <= 0) continue;
    session.adds_releases = true;
    // Merged as the ledger merges, so that the same steps give the same number either way.
    if (!events.empty() && events.back().sampling_rate == e.sampling_rate &&
        events.back().noise_multiplier == e.noise_multiplier) {
      events.back().steps += e.steps;
    } else {
      events.push_back(e);
    }
  }
  s.not_private_because = ledger_.NotPrivateBecause("epoch", session);
  s.is_private = s.not_private_because.empty();
  HUDDLE_ASSIGN_OR_RETURN(privacy::Spend spend,
                          privacy::ComputeEpsilon(events, d.delta, d.accountant));
  s.nominal_epsilon = spend.epsilon;
  return s;
}

int64_t PrivacySession::ledger_steps() const { return ledger_.steps(); }

StatusOr<JobSpend> PrivacySession::Spent() const { return SpendOf({}); }

StatusOr<JobSpend> PrivacySession::SpentWhenDone() const {
  return SpendOf({privacy::DpEvent{plan_.sampling_rate, plan_.noise_multiplier,
                                   std::max<int64_t>(0, plan_.steps - recorded_steps_)}});
}

Status PrivacySession::WriteReport(const std::string& stopped_early) const {
  const DatacenterDpSgd& d = *c_->dp_sgd;
  HUDDLE_ASSIGN_OR_RETURN(const JobSpend spent, Spent());
  const int64_t m = d.dp.expected_batch_size;
  privacy::PrivacyReport r;
  r.job = c_->job_name;
  r.scope = "datacenter";
  r.unit = privacy::kUnitExample;
  r.adjacency = privacy::kAddRemove;
  r.mechanism = fmt::format(
      "DP-SGD across {} ranks: Poisson-subsampled Gaussian, per-example clipping (L2 norm {}), "
      "the clipped gradients summed exactly (integers on the noise grid, across chunks and "
      "ranks), exact discrete Gaussian noise of standard deviation at least noise_multiplier x "
      "the sum's sensitivity added once per global step by rank 0 (on the host, whatever the "
      "device)",
      world_size_, d.dp.clip_norm);
  r.sampling = fmt::format(
      "Poisson, rate q = expected_batch_size / n = {} / {}, drawn from a key rank 0 draws from "
      "the OS CSPRNG and shares with the ranks only; amplification assumes the sample stays "
      "secret from everyone but the ranks",
      m, n_);
  r.accountant = privacy::AccountantName(d.accountant);
  r.delta = d.delta;
  r.nominal_epsilon = spent.nominal_epsilon;
  r.is_private = spent.is_private;
  r.not_private_because = spent.not_private_because;
  r.budget_epsilon = d.epsilon_budget;
  r.noise_source = noise_.description;
  r.assumptions = {
      "The ranks are trusted: all of them know the secret sample and see each other's clipped "
      "gradient sums, and their network (the rendezvous store, Gloo's TCP, NCCL) is neither "
      "authenticated nor encrypted (docs/datacenter.md, threat model).",
      fmt::format("The protected data set is the training set every rank loads, a population of "
                  "n = {} examples; n is public (q is computed from it). Epsilon bounds what the "
                  "outputs reveal about one example's presence or absence.",
                  n_),
      "The training data itself is not released: the guarantee covers the model (model.bin, "
      "checkpoint.bin's parameters and momentum) and what is computed from the model alone.",
      "The evaluation set (evaluation.data) is public, or at least not the protected training "
      "data: test loss and accuracy are post-processing of the released model only then.",
      "Every step draws a fresh Poisson sample and fresh noise: the sampling key and the noise "
      "stream are never written (a resumed session draws new ones), so the ledger's steps compose "
      "as independent releases.",
      "The ledger counts every step that any output reflected: each epoch's entry is fsync'd "
      "before that epoch's outputs are written, and an epoch re-run after a resume is counted "
      "again.",
      "Float arithmetic: each chunk's sum of clipped gradients is computed in float32 before "
      "it is rounded to the grid; that rounding (relative ~1e-7 per operation, inside the "
      "chunks a neighbouring data set changes) is not accounted, as in Opacus and TF Privacy. "
      "The sum across chunks and ranks is exact, and the grid rounding is covered by the noise "
      "(models/dp_sgd.h)."};
  r.not_covered = {
      std::string(kOperatorMetricsFile) +
          " and summary.json's `operator` object: training loss and accuracy computed from the "
          "private data without noise, timings and other operator figures (operator-only: not "
          "DP-protected).",
      "The values the progress lines label \"(not private)\", and the ranks' logs (OUT/logs/).",
      "Timing and other side channels (step times depend on the size of the secret sample).",
      "The ranks themselves, and whoever can read their memory, disks or network: they hold the "
      "training data, know the secret sample and see the clipped sums (this mode trusts them).",
      "checkpoint.bin's training time (its parameters and momentum are post-processing of the "
      "noised steps, as model.bin is).",
      "Other uses of the same people's data: this ledger composes the releases of this job only."};
  r.stopped_early = stopped_early;
  return ledger_.WriteReport(std::move(r));
}

}  // namespace huddle::datacenter
