// Child processes of the local launchers (`huddle run`, `huddle datacenter --nproc`).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace huddle::cli {

// Starts `argv` (argv[0] an absolute path) with stderr, and stdout unless keep_stdout, sent to
// the file `log` (truncated).
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log,
                      bool keep_stdout);

// The shell's convention: the exit status, or 128 + the signal that ended the process.
int ExitCode(int wait_status);

// The last non-empty line of a log file ("" when unreadable), to quote a child's error.
std::string LastLogLine(const std::string& path);

}  // namespace huddle::cli
