// Test helpers for integration tests: start `huddle` subprocesses, wait with deadlines, kill them,
// and read the files a job writes. Every wait has a deadline; nothing here can hang a test run.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace huddle::testing {

// Path of the huddle binary (HUDDLE_BIN, set by CTest).
std::string HuddleBin();

class Process {
 public:
  // Starts argv[0] with stdout+stderr appended to `log`. `own_group`: in a new process group of
  // its own, which its children join, so that KillGroup reaches them all (a launcher and its
  // ranks, as a machine failure would).
  Process(const std::vector<std::string>& argv, const std::string& log, bool own_group = false);
  ~Process();  // SIGKILLs the process (its group, with own_group) if it is still running
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  void Kill(int signal = SIGKILL);
  // Every process of the group (own_group only; the group outlives its leader while children
  // run).
  void KillGroup(int signal);
  // Exit code (128+signal if killed), or -1 if it did not exit within the timeout.
  int Wait(std::chrono::milliseconds timeout);
  bool running();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  bool own_group_ = false;
};

// What a process run to its end left: its exit code (as Process::Wait: 128+signal if killed, -1 if
// it had not exited within the timeout, and was then SIGKILLed) and the text of its log.
struct Finished {
  int exit_code = -1;
  std::string log;
};
// Runs `argv` with stdout+stderr appended to `log` and waits for it at most `timeout`.
Finished RunToEnd(const std::vector<std::string>& argv, const std::string& log,
                  std::chrono::milliseconds timeout);

// Polls `done` every 50 ms until it returns true or `timeout` passes; returns its last value.
bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout);

// Lines of a text file (empty if missing).
std::vector<std::string> ReadLines(const std::string& path);
std::string ReadAll(const std::string& path);
std::string MakeTempDir(const std::string& name);
void WriteText(const std::string& path, const std::string& text);
int FreeLoopbackPort();

}  // namespace huddle::testing
