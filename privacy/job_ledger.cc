#include "privacy/job_ledger.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace huddle::privacy {

StatusOr<JobLedger> JobLedger::Open(const std::string& out_dir, const JobLedgerOptions& options) {
  const std::string path = (std::filesystem::path(out_dir) / kLedgerFile).string();
  HUDDLE_ASSIGN_OR_RETURN(PrivacyLedger ledger,
                          PrivacyLedger::Open(path, {.clock = options.clock}));
  JobLedger job(out_dir, std::move(ledger));
  if (!options.resume && !job.entries().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " records ", job.entries().size(), " ", options.releases, " releases",
        options.count_steps ? absl::StrCat(" (", job.steps(), " steps)") : "",
        " of an earlier run: continue that job with --resume, or use a new output directory "
        "(deleting the ledger would forget privacy already spent)"));
  }
  return job;
}

JobLedger::JobLedger(std::string out_dir, PrivacyLedger ledger)
    : out_dir_(std::move(out_dir)), ledger_(std::move(ledger)) {
  for (const LedgerEntry& e : entries()) {
    not_private_entries_ += IsPrivateRelease(e.noise_multiplier, e.noise) ? 0 : 1;
  }
}

Status JobLedger::Append(const LedgerEntry& entry) {
  HUDDLE_RETURN_IF_ERROR(ledger_.Append(entry));
  not_private_entries_ += IsPrivateRelease(entry.noise_multiplier, entry.noise) ? 0 : 1;
  return absl::OkStatus();
}

Status JobLedger::CheckRoundsCovered(uint64_t completed_rounds) const {
  if (completed_rounds == 0) return absl::OkStatus();
  std::vector<bool> covered(completed_rounds + 1, false);
  for (const LedgerEntry& e : entries()) {
    if (e.round >= 1 && e.round <= completed_rounds) covered[e.round] = true;
  }
  for (uint64_t r = 1; r <= completed_rounds; ++r) {
    if (!covered[r]) {
      return absl::DataLossError(absl::StrCat(
          "--resume: the checkpoint has completed ", completed_rounds, " DP rounds but ", path(),
          " records no release for round ", r, " (it holds ", entries().size(),
          " entries): the privacy already spent cannot be established; restore the ledger, or "
          "start the job afresh in a new output directory"));
    }
  }
  return absl::OkStatus();
}

Status JobLedger::CheckStepsCovered(int64_t checkpoint_steps, std::string_view checkpoint) const {
  const int64_t counted = steps();
  if (counted >= checkpoint_steps) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      path(), " counts ", counted, " DP-SGD steps, but ", std::string(checkpoint), " is at step ",
      checkpoint_steps,
      ": the ledger was deleted or truncated, so the privacy already spent cannot be established "
      "(restore the ledger from a backup, or start afresh in a new output directory)"));
}

std::vector<std::string> JobLedger::NotPrivateBecause(std::string_view round,
                                                      const SessionNoise& session) const {
  std::vector<std::string> why;
  for (const ReportReleases& run : GroupReleases(entries())) {
    if (IsPrivateRelease(run.noise_multiplier, run.noise)) continue;
    const std::string where =
        run.first_round == run.last_round
            ? absl::StrCat(std::string(round), " ", run.first_round, " (", run.steps, " steps)")
            : absl::StrCat(std::string(round), "s ", run.first_round, "-", run.last_round, " (",
                           run.steps, " steps)");
    if (!(run.noise_multiplier > 0)) {
      why.push_back(where + ": noise_multiplier 0, no noise was added");
    } else {
      why.push_back(absl::StrCat(where, ": the noise came from '", run.noise,
                                 "', not from the OS CSPRNG (whoever can reproduce it can "
                                 "remove it)"));
    }
  }
  if (why.empty() && SessionMakesItNotPrivate(session)) why.push_back(session.why_not);
  return why;
}

bool JobLedger::IsPrivate(const SessionNoise& session) const {
  return not_private_entries_ == 0 && !SessionMakesItNotPrivate(session);
}

bool JobLedger::SessionMakesItNotPrivate(const SessionNoise& session) const {
  return !session.is_private && (session.adds_releases || entries().empty());
}

Status JobLedger::WriteReport(PrivacyReport report) const {
  report.ledger = kLedgerFile;
  report.releases = GroupReleases(entries());
  return WritePrivacyReport(out_dir_, report);
}

int64_t JobLedger::steps() const {
  int64_t steps = 0;
  for (const LedgerEntry& e : entries()) steps += e.steps;
  return steps;
}

}  // namespace huddle::privacy
