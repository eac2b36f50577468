// The privacy ledger: a durable, append-only record of every DP release a job has made.
//
// One line of JSON per event, in a file its writer owns (a coordinator's OUT/privacy_ledger.jsonl,
// a datacenter job's, or a client's own ledger of what it released):
//   {"round":3,"mechanism":"poisson_gaussian","sampling_rate":0.1,"noise_multiplier":1.1,
//    "clip_norm":1.0,"mode":"central","steps":1,"noise":"os-csprng","unit":"client",
//    "adjacency":"add_remove"}
// optionally with "job" and "release" (what was released, for a client's ledger). Lines written
// before `unit` and `adjacency` existed read as client-level add/remove events. A distributed-DP
// round (secure aggregation with the clients' discrete Gaussian shares) is
//   {"round":3,"mechanism":"distributed_discrete_gaussian","sampling_rate":1,
//    "noise_multiplier":8.1,...,"adjacency":"replace_one","tau":0,"dimension":50890}
// whose noise_multiplier is the sum's: sqrt(n s) / Delta for the fewest honest members n whose
// shares the sum is guaranteed, each of variance s, Delta the clipped update's L2 bound on the
// grid (accountant.h: tau and dimension enter its RDP bound).
//
// Adjacency decides what noise_multiplier means to the accountant. Add/remove: one record is
// present or absent, the sensitivity is C, and the event is the Gaussian of multiplier z.
// Replace-one: one record is swapped for any other, the sensitivity is 2C, and the event is the
// Gaussian of multiplier z / 2; only unsampled releases (q = 1, local DP) may be replace-one.
// Append() writes the whole line with one write(2) on an O_APPEND descriptor and returns only after
// fsync(2) has made it durable. The coordinator appends a round's event *before* it releases
// anything computed from that round's noised aggregate (the new model, a checkpoint, metrics), so
// a crash at any point leaves a ledger that counts at least every release: never an under-count.
// (A crash after the append and before the release over-counts that round, which is safe.)
//
// Open() replays the file: every complete line must parse as an event (anything else is DataLoss:
// the spend cannot be known, so the job must not continue); a final line without its newline is a
// write torn by a crash. Its fsync never returned, so nothing was released for it: it is logged,
// dropped, and truncated away before the next append.
//
// Thread-safety: none; one writer (the coordinator thread).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "privacy/accountant.h"

namespace huddle::privacy {

inline constexpr char kUnitClient[] = "client";    // client-level DP (a client's whole data)
inline constexpr char kUnitExample[] = "example";  // example-level DP (DP-SGD)
inline constexpr char kMechanismGaussian[] = "poisson_gaussian";
inline constexpr char kMechanismDistributed[] = "distributed_discrete_gaussian";
inline constexpr char kAddRemove[] = "add_remove";
inline constexpr char kReplaceOne[] = "replace_one";

struct LedgerEntry {
  uint64_t round = 0;  // the round (federated) or epoch (datacenter) the release belongs to
  std::string mechanism = kMechanismGaussian;  // or kMechanismDistributed
  double sampling_rate = 1.0;                  // q
  double noise_multiplier = 0;  // z: noise std / C (effective, after any split between queries)
  double clip_norm = 0;         // C (for the record; epsilon does not depend on it)
  std::string mode;             // "central" | "local" | "dp_sgd"
  int64_t steps = 1;
  std::string noise;                   // the noise source: "os-csprng" or "seeded (NOT PRIVATE)"
  std::string unit = kUnitClient;      // whose privacy the event spends: kUnitClient / kUnitExample
  std::string adjacency = kAddRemove;  // kAddRemove / kReplaceOne (then sampling_rate is 1)
  std::string job;                     // optional: the job the release was made for
  std::string release;                 // optional: an id of the released value (client ledgers)
  double tau = 0;                      // kMechanismDistributed only (accountant.h)
  int64_t dimension = 0;               // kMechanismDistributed only: d >= 1

  // The accountant's event: z as given under add/remove, z / 2 under replace-one (the mechanism,
  // tau and dimension carried over).
  DpEvent event() const;
};

inline constexpr char kLedgerFile[] = "privacy_ledger.jsonl";

// Entries as accountant events, identical consecutive (q, z) merged into one event (composition
// is the same); with a `unit`, only that unit's entries.
std::vector<DpEvent> EventsOf(std::span<const LedgerEntry> entries, std::string_view unit = {});

class PrivacyLedger {
 public:
  // Opens (creating if absent, with its directory entry fsync'd) and replays `path`.
  static StatusOr<PrivacyLedger> Open(const std::string& path);

  PrivacyLedger(PrivacyLedger&& other) noexcept;
  PrivacyLedger& operator=(PrivacyLedger&& other) noexcept;
  ~PrivacyLedger();

  // Durably appends `entry` (see above). On error nothing may have been released: the caller must
  // not release the round's result.
  Status Append(const LedgerEntry& entry);

  const std::vector<LedgerEntry>& entries() const { return entries_; }
  // The entries as accountant events (identical consecutive (q, z) merged into one event); with a
  // `unit`, only that unit's entries.
  std::vector<DpEvent> Events(std::string_view unit = {}) const;
  // The entry whose `release` is `release` (non-empty), or nullptr.
  const LedgerEntry* FindRelease(std::string_view release) const;
  const std::string& path() const { return path_; }

 private:
  PrivacyLedger(std::string path, int fd, std::vector<LedgerEntry> entries);

  std::string path_;
  int fd_ = -1;
  std::vector<LedgerEntry> entries_;
};

// The JSON line of an entry (without the newline), and its inverse. ParseLedgerLine's errors name
// the missing or invalid field.
std::string LedgerLine(const LedgerEntry& entry);
StatusOr<LedgerEntry> ParseLedgerLine(const std::string& line);

}  // namespace huddle::privacy
