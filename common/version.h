// The build's identity: `huddle --version`, the Join's agent_version, build_info metrics.
//
// Version() is the project's release (CMake's PROJECT_VERSION); BuildRevision() the git revision
// the binary was built from (12 hex digits, "-dirty" when tracked files differed from it, "unknown"
// when built outside a git checkout). Both are generated at build time (cmake/GitVersion.cmake).
#pragma once

#include <string>

namespace huddle {

const char* Version();
const char* BuildRevision();
// "0.1.0 (git 1f14bdc0a9e2)".
inline std::string VersionLine() {
  return std::string(Version()) + " (git " + BuildRevision() + ")";
}

}  // namespace huddle
