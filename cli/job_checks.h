// The checks a job passes when it is loaded, before any client joins (cli/job_config.cc calls
// them): its data against its model, and its privacy plan against its budget. Internal to cli/.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "cli/job_config.h"
#include "common/config_reader.h"
#include "common/status.h"

namespace huddle::cli {

// The coordinator's test set, once the data section is known: `evaluation.data` defaults to
// Fashion-MNIST's test split only for a model of its input; its format and scale from the path
// and the clients' data; a CSV test set's width against the model.
Status ResolveEvaluationData(ConfigMap& eval, const data::DataSpec& client_data, JobConfig* job);
// `huddle run`'s client data against the model, as far as it is cheap.
Status CheckClientData(ConfigMap& data, const JobConfig& job);
// Under client-level DP: the budget valid, every planned round within it (or
// privacy.stop_at_budget), the fixed denominator set or derived from `population` (the clients
// the job itself starts), and a warning when the noise on the mean is larger than the update.
Status CheckPrivacyPlan(const std::string& path, std::optional<int64_t> population, JobConfig* job);

}  // namespace huddle::cli
