#include "tests/integration/process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "transport/ports.h"

namespace huddle::testing {

std::string HuddleBin() {
  const char* bin = std::getenv("HUDDLE_BIN");
  return bin != nullptr ? bin : "huddle";
}

Process::Process(const std::vector<std::string>& argv, const std::string& log, bool own_group)
    : own_group_(own_group) {
  // Prepared before the fork: the child may only make async-signal-safe calls before exec.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    if (own_group) ::setpgid(0, 0);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  if (own_group && pid_ > 0) ::setpgid(pid_, pid_);  // also here, so that no kill comes before it
}

Process::~Process() {
  if (running()) {
    own_group_ ? KillGroup(SIGKILL) : Kill(SIGKILL);
    Wait(std::chrono::seconds(5));
  }
}

void Process::KillGroup(int signal) {
  if (own_group_ && pid_ > 0) ::kill(-pid_, signal);
}

void Process::Kill(int signal) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, signal);
}

bool Process::running() {
  if (pid_ <= 0 || reaped_) return false;
  if (::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

int Process::Wait(std::chrono::milliseconds timeout) {
  WaitFor([this] { return !running(); }, timeout);
  if (!reaped_) return -1;
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

Finished RunToEnd(const std::vector<std::string>& argv, const std::string& log,
                  std::chrono::milliseconds timeout) {
  Finished out;
  {
    Process p(argv, log);
    out.exit_code = p.Wait(timeout);
  }
  out.log = ReadAll(log);
  return out;
}

bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string MakeTempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("huddle_it_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

int FreeLoopbackPort() {
  auto port = transport::FreeLoopbackPort();
  return port.ok() ? *port : 0;
}

}  // namespace huddle::testing
