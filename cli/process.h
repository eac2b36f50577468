// Child processes of the local launchers (`huddle run`, `huddle datacenter --nproc`).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace huddle::cli {

// Starts `argv` (argv[0] an absolute path) with stderr, and stdout unless keep_stdout, sent to
// the file `log` (truncated). The child's environment is this process's plus `extra_env`
// ("NAME=value", overriding): a way to hand a child a secret that the command line, which every
// user can read in /proc, must not carry (a process's environment is readable by its owner only).
// The child gets SIGTERM when the thread that started it ends (the launcher's main thread: when
// the launcher exits, however it dies), so no child outlives its launcher.
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log,
                      bool keep_stdout, const std::vector<std::string>& extra_env = {});

// The shell's convention: the exit status, or 128 + the signal that ended the process.
int ExitCode(int wait_status);

// The last non-empty line of a log file ("" when unreadable), to quote a child's error.
std::string LastLogLine(const std::string& path);

}  // namespace huddle::cli
