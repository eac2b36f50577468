// `huddle provision project.yaml --out kits/` (cli/provision.h): flags to options, the run's
// lines on stdout, its warnings and errors on stderr, and the exit-code contract.
#include <cstdio>

#include "cli/commands.h"
#include "cli/provision.h"

namespace huddle::cli {

int RunProvisionCommand(const ProvisionFlags& flags) {
  constexpr const char* kCommand = "huddle provision";
  ProvisionOptions o;
  o.project_file = flags.project;
  o.out_dir = flags.out_dir;
  o.etc_dir = flags.etc_dir;
  o.state_dir = flags.state_dir;
  int actions = 0;
  for (const auto& [name, action] :
       {std::pair{&flags.add_site, ProvisionOptions::Action::kAddSite},
        std::pair{&flags.rotate, ProvisionOptions::Action::kRotate},
        std::pair{&flags.remove_site, ProvisionOptions::Action::kRemoveSite}}) {
    if (name->empty()) continue;
    ++actions;
    o.action = action;
    o.target = *name;
  }
  if (actions > 1) {
    std::fprintf(stderr, "%s: --add-site, --rotate and --remove-site: one at a time\n", kCommand);
    return kExitUsage;
  }
  StatusOr<ProvisionResult> result = Provision(o);
  if (!result.ok()) {
    std::fprintf(stderr, "%s: %s\n", kCommand, std::string(result.status().message()).c_str());
    return IsProvisionUsageError(result.status()) ? kExitUsage : kExitFailed;
  }
  for (const std::string& line : result->lines) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  for (const std::string& w : result->warnings)
    std::fprintf(stderr, "%s: %s\n", kCommand, w.c_str());
  return kExitOk;
}

}  // namespace huddle::cli
