// The participation bound of buffered asynchronous training under client-level DP
// (privacy.max_participations and privacy.min_separation; privacy/budget.h, docs/privacy.md,
// "Asynchronous training"): which clients contributed to which server step, durably, and whether a
// client may be sent another task.
//
// Asynchronous arrival is not Poisson sampling, so a client's epsilon is the composition of the
// releases it contributed to, and the job's epsilon is bounded by the max_participations most
// expensive releases only if no client ever contributes to more. The coordinator enforces it:
//   - a client is sent a task only while it has contributed fewer than m times and the open step
//     is at least g steps after its last contribution (a task's result lands in the step open
//     when it was sent or a later one; a client has one task at a time, and a result kept for the
//     next step still holds its task);
//   - every accepted result counts at once (a step abandoned by a stop counts too: safe);
//   - before a step's release is appended to the privacy ledger, its contributors are appended to
//     OUT/contributions.jsonl ({"step":N,"clients":[...]}, fsync'd): so a resume recounts every
//     contribution that was released. A step whose line was written and whose release never
//     happened is counted all the same (an over-count, safe).
// Open on a resume refuses (DataLoss) a file with a complete line that does not parse, and a file
// with fewer lines than the ledger has releases (lines were lost: some clients' contributions can
// no longer be counted). A final line without its newline is a write a crash cut: its ledger entry
// was never appended, so it is dropped.
//
// The file names clients: operator-only, like participation.jsonl.
//
// Thread-safety: none; the round loop's thread only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace huddle::coordinator {

inline constexpr char kContributionsFile[] = "contributions.jsonl";

class Contributions {
 public:
  // `out_dir`/contributions.jsonl for a job whose clients contribute at most `max_participations`
  // times, `min_separation` steps apart. A fresh start removes the file; a resume reads it and
  // checks that it holds a line for each of the ledger's `ledger_releases` entries.
  static StatusOr<Contributions> Open(const std::string& out_dir, bool resume,
                                      int64_t max_participations, int64_t min_separation,
                                      int64_t ledger_releases);

  // Whether `id` may be sent a task while step `open_step` is open.
  bool MaySend(const std::string& id, uint64_t open_step) const;
  // `id`'s result was accepted into step `step`.
  void Contributed(const std::string& id, uint64_t step);
  // Durably appends step `step`'s contributors (before its release is in the ledger).
  Status Record(uint64_t step, const std::vector<std::string>& clients);

  int64_t max_participations() const { return max_participations_; }
  int64_t min_separation() const { return min_separation_; }
  // The most contributions any client has made (at most max_participations).
  int64_t most() const { return most_; }
  // Clients that have contributed max_participations times.
  int64_t exhausted() const { return exhausted_; }

 private:
  struct Client {
    int64_t count = 0;
    uint64_t last_step = 0;
  };
  Contributions(std::string path, int64_t max_participations, int64_t min_separation)
      : path_(std::move(path)),
        max_participations_(max_participations),
        min_separation_(min_separation) {}
  Status Load(int64_t ledger_releases);

  std::string path_;
  int64_t max_participations_ = 1;
  int64_t min_separation_ = 1;
  std::map<std::string, Client> clients_;
  int64_t most_ = 0;
  int64_t exhausted_ = 0;
};

}  // namespace huddle::coordinator
