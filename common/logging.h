// Logging goes through spdlog. The `huddle` binary configures the default logger once at start-up
// (`SetupLogging`); library code only calls spdlog::info/warn/error.
#pragma once

#include <string>

#include "common/status.h"

namespace huddle {

// Sets the default logger's level ("trace".."critical", "off") and a pattern that starts with
// `component` (e.g. "coordinator", "client 3"). Returns InvalidArgument for an unknown level.
Status SetupLogging(const std::string& level, const std::string& component);

}  // namespace huddle
