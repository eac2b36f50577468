// The privacy ledger: a durable, append-only record of every DP release a job has made.
//
// One line of JSON per event, in a file its writer owns (a coordinator's OUT/privacy_ledger.jsonl,
// a datacenter job's, or a client's own ledger of what it released):
//   {"round":3,"time":"2026-11-28T22:51:03.123Z","mechanism":"poisson_gaussian",
//    "sampling_rate":0.1,"noise_multiplier":1.1,"clip_norm":1.0,"mode":"central","steps":1,
//    "noise":"os-csprng","unit":"client","adjacency":"add_remove"}
// optionally with "job" and "release" (what was released, for a client's ledger). Lines written
// before `unit` and `adjacency` existed read as client-level add/remove events. `time` is when
// Append recorded the release (the ledger clock's WallMs, common/time_format.h); lines written
// before it existed have none and read as they are. It is a label only: the spend, the events and
// FindRelease do not depend on it. It is part of the line, so the chain (below) covers it as it
// covers every byte: an edited time is an edited line, refused like any other. A distributed-DP
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
// fsync(2) has made it durable, and then after the ledger's mark (below) has been updated. The
// coordinator appends a round's event *before* it releases anything computed from that round's
// noised aggregate (the new model, a checkpoint, metrics), so a crash at any point leaves a ledger
// that counts at least every release: never an under-count. (A crash after the append and before
// the release over-counts that round, which is safe.)
//
// Continuity. A ledger that lost entries (truncated, its last line dropped or torn, deleted, a
// line cut out of the middle, by a crash, an operator's mistake or on purpose) must never open as
// if those releases had not been made. Two things make a loss visible:
//   - a hash chain: each line written by this version ends with "prev":"<hex>", the chain head
//     before it, where head_0 = H("huddle-ledger-chain-v1") and head_i = H(tag, head_i-1, line_i)
//     over the line's exact bytes (BLAKE2b-256, common/digest.h); and
//   - the mark, `<ledger>.mark` ({"entries":N,"head":"<hex>"}), replaced atomically (written,
//     fsync'd, renamed, directory fsync'd) after every append is durable, and at Open.
// Open() replays the file and refuses it (DataLoss, with how to recover: restore the ledger and
// its mark together from a backup, or LedgerOpenOptions::how_to_acknowledge) when
//   - a complete line does not parse as an event (the spend cannot be known);
//   - a line's "prev" is not the head of the lines before it (a line removed, changed or moved);
//   - the mark counts more entries than the file holds (truncated, dropped, torn or deleted: the
//     mark is written only after the append's fsync returned, so every entry it counts was made);
//   - the first N lines do not hash to the mark's head (replaced or edited); or
//   - there is no mark and some line carries "prev" (a mark existed: Open writes it before any
//     append, so the mark was deleted and the ledger's length cannot be checked).
// Accepted: a file that *extends* its mark (the lines after the mark's N are appends whose mark
// update a crash cut off: an over-count, safe; the mark is brought up to date), and a final line
// without its newline that the mark does not count: a write torn by a crash, whose fsync never
// returned, so nothing was released for it; it is logged, dropped and truncated away. A torn final
// line the mark does count was durable and is a loss (refused). A ledger written before the chain
// existed (no "prev", no mark) opens as it is: Open seals it with a mark and the chain starts at
// the next append (its lines are in the chain's hash, so it is checked from then on; what was lost
// from it before cannot be known). A deleted ledger whose mark remains is refused without creating
// one.
//
// What the chain is not: a secret. Whoever can write the directory can rewrite the ledger and its
// mark consistently (or delete both); this detects crashes and mistakes and the simple reset, not
// a determined operator of the machine (the client's kept release, client/privacy_guard.h, is a
// third witness).
//
// With LedgerOpenOptions::acknowledge_loss, an operator's explicit word, a ledger that would be
// refused opens instead: its damaged bytes are kept in `<ledger>.damaged`, the entries that still
// parse are rewritten as a fresh chain, and a "lost" entry per unit is appended (kModeLost,
// noise_multiplier 0: the accountants count it as an unbounded spend, epsilon infinite), since what
// the lost entries spent cannot be known. Never an under-count.
//
// Thread-safety: none; one writer per ledger file (one process, one thread: the coordinator, the
// datacenter job or the client agent).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "privacy/accountant.h"

namespace huddle::privacy {

inline constexpr char kUnitClient[] = "client";    // client-level DP (a client's whole data)
inline constexpr char kUnitExample[] = "example";  // example-level DP (DP-SGD)
inline constexpr char kMechanismGaussian[] = "poisson_gaussian";
inline constexpr char kMechanismDistributed[] = "distributed_discrete_gaussian";
inline constexpr char kAddRemove[] = "add_remove";
inline constexpr char kReplaceOne[] = "replace_one";
// LedgerEntry::mode: how the release was made (PrivacyModeName's names for the federated modes).
inline constexpr char kModeCentral[] = "central";          // the coordinator's noise on the sum
inline constexpr char kModeLocal[] = "local";              // each client's noise on its update
inline constexpr char kModeDistributed[] = "distributed";  // the clients' shares in a secure sum
inline constexpr char kModeDpSgd[] = "dp_sgd";             // DP-SGD over one party's examples
// LedgerEntry::noise: the OS-keyed source's NoiseSource::Describe(); a release whose noise the
// clients added (the coordinator's record); a release with no noise (noise_multiplier 0).
inline constexpr char kNoiseOsCsprng[] = "os-csprng";
inline constexpr char kNoiseClientSide[] = "client-side";
inline constexpr char kNoiseSecAggShares[] = "client-side (secure aggregation shares)";
inline constexpr char kNoNoise[] = "none (NOT PRIVATE)";

// Whether a release labelled `noise` counts as having private noise: keyed from the OS CSPRNG, or
// added by the clients (whose sources the coordinator cannot see; the report states that
// assumption). Any other label (a seeded source, kNoNoise) is not private.
bool IsPrivateNoise(std::string_view noise);
// Whether a release had private noise: noise_multiplier > 0 and IsPrivateNoise(noise).
bool IsPrivateRelease(double noise_multiplier, std::string_view noise);

struct LedgerEntry {
  uint64_t round = 0;  // the round (federated) or epoch (datacenter) the release belongs to
  // When the release was recorded, ISO-8601 UTC ("2026-11-28T22:51:03.123Z"): set by
  // PrivacyLedger::Append; "" before (then LedgerLine writes no "time") and in older lines.
  std::string time;
  std::string mechanism = kMechanismGaussian;  // or kMechanismDistributed
  double sampling_rate = 1.0;                  // q
  double noise_multiplier = 0;  // z: noise std / C (effective, after any split between queries)
  double clip_norm = 0;         // C (for the record; epsilon does not depend on it)
  std::string mode;             // kModeCentral | kModeLocal | kModeDistributed | kModeDpSgd
  int64_t steps = 1;
  std::string noise;                   // the noise source: "os-csprng" or "seeded (NOT PRIVATE)"
  std::string unit = kUnitClient;      // whose privacy the event spends: kUnitClient / kUnitExample
  std::string adjacency = kAddRemove;  // kAddRemove / kReplaceOne (then sampling_rate is 1)
  std::string job;                     // optional: the job the release was made for
  std::string release;                 // optional: an id of the released value (client ledgers)
  double tau = 0;                      // kMechanismDistributed only (accountant.h)
  int64_t dimension = 0;               // kMechanismDistributed only: d >= 1

  // One entry per kind of release; `job` and `release` are left for the caller to add.
  //
  // A client-level Gaussian release of `mode` (kModeCentral: the coordinator's noised sum, q the
  // cohort's rate, add/remove; kModeLocal: one client's noised update, q = 1, its adjacency).
  static LedgerEntry ClientGaussian(std::string_view mode, uint64_t round, double sampling_rate,
                                    double noise_multiplier, double clip_norm,
                                    std::string_view adjacency, std::string noise);
  // A distributed-DP round: the sum of secure aggregation's discrete Gaussian shares whose event
  // is `sum` (DistributedDiscreteGaussianEvent: its z, tau and dimension); q = 1, client-level,
  // replace-one. privacy/distributed.h's DistributedRelease computes it from the shares.
  static LedgerEntry DistributedSum(uint64_t round, const DpEvent& sum, double clip_norm,
                                    std::string noise);
  // `steps` DP-SGD steps (q, z, steps) over one party's examples: example-level, add/remove.
  static LedgerEntry DpSgdSteps(uint64_t round, const DpEvent& steps, double clip_norm,
                                std::string noise);

  // The accountant's event: z as given under add/remove, z / 2 under replace-one (the mechanism,
  // tau and dimension carried over).
  DpEvent event() const;
};

inline constexpr char kLedgerFile[] = "privacy_ledger.jsonl";
inline constexpr char kMarkSuffix[] = ".mark";        // the mark: <ledger>.mark
inline constexpr char kDamagedSuffix[] = ".damaged";  // a recovered ledger's old bytes
inline constexpr char kModeLost[] = "lost";           // the mode of an acknowledged loss's entries

struct LedgerOpenOptions {
  // Open a ledger that lost entries anyway, counting the loss as unbounded (see above). Only on an
  // operator's explicit word.
  bool acknowledge_loss = false;
  // The refusal's last recovery step, after "restore the ledger and its mark from a backup"; e.g.
  // how this caller's operator sets acknowledge_loss.
  std::string how_to_acknowledge =
      "or start afresh with a new ledger (for a job: a new output directory)";
  // Its WallMs stamps each appended entry's `time`. Not owned; must outlive the ledger.
  const Clock* clock = SteadyClock::Get();
};

// Entries as accountant events, identical consecutive (q, z) merged into one event (composition
// is the same); with a `unit`, only that unit's entries.
std::vector<DpEvent> EventsOf(std::span<const LedgerEntry> entries, std::string_view unit = {});

class PrivacyLedger {
 public:
  // Opens (creating if absent, with its directory entry fsync'd) and replays `path`, checking its
  // continuity against its mark (above).
  static StatusOr<PrivacyLedger> Open(const std::string& path,
                                      const LedgerOpenOptions& options = {});

  PrivacyLedger(PrivacyLedger&& other) noexcept;
  PrivacyLedger& operator=(PrivacyLedger&& other) noexcept;
  ~PrivacyLedger();

  // Durably appends `entry`, its `time` set to the clock's wall time now (see above). On error
  // nothing may have been released: the caller must not release the round's result.
  // After a failed append the ledger refuses further appends (reopen it).
  Status Append(const LedgerEntry& entry);
  // Appends an acknowledged loss of `lost` entries (at least 1): one kModeLost entry per unit,
  // the client-level one carrying `release` (a release known to have been made: FindRelease
  // then finds it). Only on an operator's explicit word (LedgerOpenOptions::acknowledge_loss).
  Status AppendLost(int64_t lost, std::string_view release = {});

  const std::vector<LedgerEntry>& entries() const { return entries_; }
  // The entries as accountant events (identical consecutive (q, z) merged into one event); with a
  // `unit`, only that unit's entries.
  std::vector<DpEvent> Events(std::string_view unit = {}) const;
  // The entry whose `release` is `release` (non-empty), or nullptr.
  const LedgerEntry* FindRelease(std::string_view release) const;
  const std::string& path() const { return path_; }
  // The mark's path: path() + kMarkSuffix.
  std::string mark_path() const;

 private:
  PrivacyLedger(std::string path, int fd, std::vector<LedgerEntry> entries, std::string head,
                int64_t size_bytes, const Clock* clock);

  std::string path_;
  int fd_ = -1;
  const Clock* clock_;  // not owned
  std::vector<LedgerEntry> entries_;
  std::string head_;        // the chain head after the last line
  int64_t size_bytes_ = 0;  // the file's length (its complete lines)
  bool broken_ = false;     // an append failed: its line may be half written
};

// The JSON line of an entry (without the newline), and its inverse. ParseLedgerLine's errors name
// the missing or invalid field.
std::string LedgerLine(const LedgerEntry& entry);
StatusOr<LedgerEntry> ParseLedgerLine(const std::string& line);

}  // namespace huddle::privacy
