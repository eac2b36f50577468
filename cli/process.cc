#include "cli/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "common/file_util.h"

namespace huddle::cli {

StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log,
                      bool keep_stdout, const std::vector<std::string>& extra_env) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  // Everything the child needs is prepared here: between fork and exec a child of a
  // multithreaded process (ZeroMQ's I/O threads, a rendezvous server) may only make
  // async-signal-safe calls. An allocation there can wait forever on a lock another thread held
  // at the fork (seen under ASan: a rank that never started).
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view var(*e);
    const bool overridden = std::any_of(extra_env.begin(), extra_env.end(), [&](const auto& x) {
      const size_t eq = x.find('=');
      return eq != std::string::npos && var.starts_with(std::string_view(x).substr(0, eq + 1));
    });
    if (!overridden) env.push_back(*e);
  }
  for (const std::string& x : extra_env) env.push_back(const_cast<char*>(x.c_str()));
  env.push_back(nullptr);
  const std::string failed = "cannot start " + argv[0] + "\n";
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // A launcher's children never outlive it: killed (SIGKILL, a closed pipe), it takes them
    // along (SIGTERM, their clean stop) rather than leaving agents or ranks running unowned.
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) ::_exit(127);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      if (!keep_stdout) ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    ::execve(args[0], args.data(), env.data());
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, failed.data(), failed.size());
    ::_exit(127);
  }
  return pid;
}

int ExitCode(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::string LastLogLine(const std::string& path) {
  auto text = ReadFile(path);
  std::string last = text.ok() ? std::string(*text) : "";
  while (!last.empty() && last.back() == '\n') last.pop_back();
  const size_t nl = last.rfind('\n');
  return nl == std::string::npos ? last : last.substr(nl + 1);
}

}  // namespace huddle::cli
