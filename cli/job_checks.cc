// The load-time checks of a job (cli/job_checks.h).
#include "cli/job_checks.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "models/model.h"
#include "privacy/budget.h"

namespace huddle::cli {
namespace {

// The features per row of the CSV file at `path` (data/csv.h: every row, and a header, has the
// same width) from its first non-blank line, reading at most 1 MiB; nullopt when it is not a
// readable regular file or that line is not within the first MiB (the full load reports those).
std::optional<int64_t> CsvFeatures(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  constexpr size_t kMaxHead = size_t{1} << 20;
  std::ifstream in(path, std::ios::binary);
  std::string head(kMaxHead, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  for (size_t begin = 0; begin < head.size();) {
    const size_t end = head.find('\n', begin);
    if (end == std::string::npos && head.size() == kMaxHead) return std::nullopt;  // cut short
    const std::string_view line = std::string_view(head).substr(
        begin, end == std::string::npos ? std::string::npos : end - begin);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
      return static_cast<int64_t>(std::count(line.begin(), line.end(), ','));
    }
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return std::nullopt;
}

// A data file named by `key` against the model's input, from the file's first line (CSV only: an
// IDX file's width is known only once it is read, at start).
Status CheckCsvWidth(ConfigMap& m, std::string_view key, const std::string& path,
                     const models::ModelSpec& model) {
  const std::optional<int64_t> features = CsvFeatures(path);
  if (!features || *features == model.input_dim()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      m.Where(key), ": ", path, " has ", *features, " features per example; the model (",
      models::DescribeModel(model), ") expects ", model.input_dim()));
}

}  // namespace

// The coordinator's test set, once the data section is known: `evaluation.data` defaults to
// Fashion-MNIST's test split only for a model of its input (28x28, 784 features); any other
// model's server evaluation needs it. Its format defaults to what the path is (a directory: idx,
// a file: csv; not there: `data.format`) and scale_255 to `data.scale_255`, so that the test set
// is read as the training data is. A CSV test set's width is checked against the model here;
// everything else (an IDX set's width, the labels against the model's classes) when the
// coordinator loads it, before round 1.
Status ResolveEvaluationData(ConfigMap& eval, const data::DataSpec& client_data, JobConfig* job) {
  const coordinator::CoordinatorOptions& o = job->coordinator;
  if (o.eval_every <= 0 || o.eval_mode != coordinator::CoordinatorOptions::EvalMode::kServer ||
      o.model.external()) {
    return absl::OkStatus();
  }
  constexpr int64_t kFashionMnistFeatures = 28 * 28;
  if (!eval.Has("data")) {
    if (o.model.input_dim() != kFashionMnistFeatures) {
      return absl::InvalidArgumentError(fmt::format(
          "{} is required for a model whose input is not Fashion-MNIST's 28x28 (the model's input "
          "is {}, {} features): give the server's test set (e.g. evaluation: {{data: test.csv, "
          "format: csv}}), or evaluation: {{every: 0}} to evaluate nothing on the server, or "
          "evaluation: {{mode: federated}} to have the clients evaluate on their own data",
          eval.Where("data"), ShapeString(o.model.input), o.model.input_dim()));
    }
    job->eval_data = data::kDefaultFashionMnistDir;
    job->eval_format = "idx";
  } else {
    // An IDX test set is a directory, a CSV one a file; one not (yet) there is read as the
    // clients' data is.
    std::error_code ec;
    const bool dir = std::filesystem::is_directory(job->eval_data, ec);
    const bool file = std::filesystem::is_regular_file(job->eval_data, ec);
    if (!eval.Has("format")) job->eval_format = dir ? "idx" : file ? "csv" : client_data.format;
    if (!eval.Has("scale_255")) job->eval_scale_255 = client_data.csv_scale_255;
  }
  if (job->eval_format != "csv") return absl::OkStatus();
  return CheckCsvWidth(eval, "data", job->eval_data, o.model);
}

// `huddle run`'s client data against the model, as far as it is cheap (a CSV file's first line;
// data.num_classes when given): a standalone coordinator never reads it, so a file that is not
// there is no error here.
Status CheckClientData(ConfigMap& data, const JobConfig& job) {
  const models::ModelSpec& model = job.coordinator.model;
  if (model.external()) return absl::OkStatus();  // huddle run refuses it anyway
  if (data.Has("num_classes") && job.client_data.num_classes > model.num_classes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        data.Where("num_classes"), " is ", job.client_data.num_classes, "; the model (",
        models::DescribeModel(model), ") has ", model.num_classes(), " classes, so labels from ",
        model.num_classes(), " on could not be trained on"));
  }
  if (job.client_data.format != "csv") return absl::OkStatus();
  return CheckCsvWidth(data, "path", job.client_data.path, model);
}

namespace {

// The DP mean's fixed denominator under central DP: set, or derived from the population the
// job's own configuration names (never from the clients that happen to enrol), or refused.
Status ResolveExpectedCohort(const std::string& path, std::optional<int64_t> population,
                             JobConfig* job) {
  privacy::PrivacyOptions& p = job->coordinator.privacy;
  if (p.mode != privacy::PrivacyMode::kCentral || p.expected_cohort_size) return absl::OkStatus();
  // Asynchronous steps divide by async.buffer.
  if (job->coordinator.async.enabled) return absl::OkStatus();
  const double rate = job->coordinator.cohort.rate;
  if (!population) {
    // The plan's other mistakes (no budget, a bad schedule) first, as PrivacyPlan::Create orders
    // them: checked with a stand-in denominator, which only this refusal then replaces.
    privacy::PrivacyOptions probe = p;
    probe.expected_cohort_size = 1;
    auto plan = privacy::PrivacyPlan::Create(probe, rate, job->coordinator.rounds);
    if (!plan.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", plan.status().message()));
    }
    return absl::InvalidArgumentError(fmt::format(
        "{}: privacy.expected_cohort_size is required with privacy.mode central when the job does "
        "not start its own clients (no simulation.clients, no clients): it is the fixed "
        "denominator of the noised mean, the expected number of client updates per round. Set it "
        "to cohort.rate ({:g}) x the number of clients you expect to be enrolled, e.g. {:g} x 30 "
        "clients = {:g}. It must not follow who enrols (dividing by the live count would publish "
        "it without noise); a value off the real cohort scales every round's update like a server "
        "learning rate, never the privacy, and the noise on the mean is noise_multiplier x "
        "clip_norm / this value",
        path, rate, rate, std::max(1.0, rate * 30)));
  }
  p.expected_cohort_size = std::max(1.0, rate * static_cast<double>(*population));
  job->notes.push_back(fmt::format(
      "privacy.expected_cohort_size derived: cohort.rate {:g} x {} {} = {:g} (the noised mean's "
      "fixed denominator; a coordinator whose clients are not the ones this job starts must set "
      "it)",
      rate, *population, job->simulation ? "simulated clients" : "clients (started by huddle run)",
      *p.expected_cohort_size));
  return absl::OkStatus();
}

// The clients expected to send an update in a round (for the noise on the mean), or nullopt when
// the configuration does not say: central DP's fixed denominator; otherwise the cohort drawn from
// the population the job names (a fixed cohort of cohort.size at most).
std::optional<double> ExpectedContributions(const coordinator::CoordinatorOptions& o,
                                            std::optional<int64_t> population) {
  if (o.privacy.mode == privacy::PrivacyMode::kCentral) return o.privacy.expected_cohort_size;
  if (o.cohort.sampling == coordinator::CohortOptions::Sampling::kFixed) {
    const int64_t size = population ? std::min(o.cohort.size, *population) : o.cohort.size;
    return static_cast<double>(size);
  }
  if (population) return o.cohort.rate * static_cast<double>(*population);
  return o.privacy.expected_cohort_size;
}

}  // namespace

// Under client-level DP, before any client joins: the budget is valid (a typo or an impossible
// budget fails here), every planned round fits the total (or the job opted into stopping at the
// budget), and a warning when the noise on the mean update is larger than the update itself.
Status CheckPrivacyPlan(const std::string& path, std::optional<int64_t> population,
                        JobConfig* job) {
  const coordinator::CoordinatorOptions& o = job->coordinator;
  if (o.privacy.mode == privacy::PrivacyMode::kNone) return absl::OkStatus();
  HUDDLE_RETURN_IF_ERROR(ResolveExpectedCohort(path, population, job));
  auto error = [&path](const Status& st) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
  };
  auto plan = privacy::PrivacyPlan::Create(o.privacy, o.cohort.rate, o.rounds);
  if (!plan.ok()) return error(plan.status());
  // The stop rule before every round would end such a job at its last fitting round, with no
  // word at start: the plan's rounds are refused unless privacy.stop_at_budget says to stop.
  StatusOr<privacy::PlanFit> fit = plan->Fit();
  if (!fit.ok()) return error(fit.status());
  if (!fit->fits && (!o.privacy.stop_at_budget || fit->rounds_that_fit == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", fit->Shortfall(),
        fit->rounds_that_fit == 0 ? ""
                                  : "; or set privacy.stop_at_budget: true to run until the "
                                    "budget is spent and stop there"));
  }
  if (!fit->fits) {
    job->notes.push_back(
        fmt::format("privacy.stop_at_budget: the job stops after round {} of {} (the last within "
                    "privacy.epsilon {:g})",
                    fit->rounds_that_fit, fit->rounds, *o.privacy.total_epsilon));
  }
  // The noise on the mean update has std sigma = z * C / n per value (central, distributed; local:
  // z * C / sqrt(n)). Past sigma > C no value of a round's update can carry more signal than
  // noise even if the whole update (L2 norm <= C) lay in that one value; DP-FedAvg that learns
  // runs far below it (McMahan et al. 2018: z about 1 with 100 to 5000 clients a round, sigma / C
  // of 0.01 to 0.0002). So it flags only plans that cannot make progress in any one round and
  // stays quiet for working ones; a plan under it can still learn poorly.
  const std::optional<double> n = ExpectedContributions(o, population);
  if (!n) return absl::OkStatus();
  const privacy::PlannedRange* worst = nullptr;
  for (const privacy::PlannedRange& r : fit->schedule) {
    if (worst == nullptr || r.noise_multiplier > worst->noise_multiplier) worst = &r;
  }
  if (worst == nullptr) return absl::OkStatus();
  const double ratio = privacy::MeanNoiseToClip(o.privacy.mode, worst->noise_multiplier, *n);
  if (ratio <= 1) return absl::OkStatus();
  const bool all = worst->first_round == 1 && worst->last_round == o.rounds;
  job->warnings.push_back(fmt::format(
      "privacy: noise std on the mean update {:.3g} is {:.3g}x the clip norm {:g} with an expected "
      "cohort of {:g} ({} DP, noise_multiplier {:.4g}{}): the model will likely not learn; raise "
      "the cohort (more clients, a larger cohort.rate or cohort.size) or lower noise_multiplier "
      "(a larger privacy.epsilon or fewer rounds)",
      ratio * worst->clip_norm, ratio, worst->clip_norm, *n,
      privacy::PrivacyModeName(o.privacy.mode), worst->noise_multiplier,
      all ? std::string()
          : fmt::format(" in rounds {}-{}", worst->first_round, worst->last_round)));
  return absl::OkStatus();
}

}  // namespace huddle::cli
