// The `huddle` subcommands. Each returns the process exit code; errors are printed to stderr as
// "huddle <command>: <message>".
#pragma once

#include <atomic>
#include <string>

#include "cli/job_config.h"

namespace huddle::cli {

// Set by SIGINT/SIGTERM; long-running commands stop cleanly when it turns true.
std::atomic<bool>& StopFlag();
void InstallStopHandlers();

struct CoordinatorFlags {
  std::string config;
  std::string out_dir;  // overrides output.dir
  std::string bind;     // overrides coordinator.bind
  bool resume = false;
};
int RunCoordinatorCommand(const CoordinatorFlags& flags);

struct ClientFlags {
  std::string config;
  std::string coordinator;
  std::string client_id;
  std::string data;
  std::string format;
  std::string partition;
  int64_t num_shards = 0;
  int64_t shard = -1;
  double alpha = 0;
  int64_t partition_seed = -1;
  double give_up_after_s = -1;
  std::string log_level;
};
int RunClientCommand(const ClientFlags& flags);

struct RunFlags {
  std::string config;
  std::string out_dir;
};
// `huddle run`: the whole federation on this machine (processes, or in-process simulation).
int RunLocalCommand(const RunFlags& flags, const std::string& self_exe);

// Shared by the coordinator and simulation paths: loads the evaluation set and runs the job.
int RunCoordinatorWith(JobConfig job, class transport::ServerTransport* transport);

}  // namespace huddle::cli
