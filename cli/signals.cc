// Signals for every command: SIGINT/SIGTERM ask for a clean stop (StopFlag), SIGHUP for a reload
// of the client allow-list (ReloadRequests).
#include <csignal>

#include "cli/commands.h"

namespace huddle::cli {

std::atomic<bool>& StopFlag() {
  static std::atomic<bool> stop{false};
  return stop;
}

std::atomic<int>& StopSignal() {
  static std::atomic<int> signal{0};
  return signal;
}

std::atomic<uint64_t>& ReloadRequests() {
  static std::atomic<uint64_t> requests{0};
  return requests;
}

int StopExitCode() { return 128 + (StopSignal().load() != 0 ? StopSignal().load() : SIGTERM); }
const char* StopSignalName() { return StopSignal().load() == SIGINT ? "SIGINT" : "SIGTERM"; }
bool IsStopExitCode(int code) { return code == 128 + SIGINT || code == 128 + SIGTERM; }

void InstallStopHandlers() {
  // Initialised here, not first inside a signal handler.
  StopFlag();
  StopSignal();
  ReloadRequests();
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    int none = 0;
    StopSignal().compare_exchange_strong(none, sig);
    StopFlag().store(true);
  };
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  struct sigaction hup {};
  hup.sa_handler = [](int) { ReloadRequests().fetch_add(1); };
  sigemptyset(&hup.sa_mask);
  ::sigaction(SIGHUP, &hup, nullptr);
}

}  // namespace huddle::cli
