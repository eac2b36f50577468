// Coordinator checkpoints: everything needed to continue a job exactly where it stopped.
// Written atomically after every round (temp file + fsync + rename + directory fsync), so a
// coordinator killed at any moment resumes from the last completed round and, given the same
// clients, ends with the same model as an uninterrupted run.
#pragma once

#include <limits>
#include <optional>
#include <string>

#include "common/rng.h"
#include "common/status.h"
#include "common/tensor.h"
#include "coordinator/options.h"

namespace huddle::coordinator {

struct Checkpoint {
  uint64_t completed_round = 0;  // rounds 1..completed_round are done
  uint64_t model_version = 0;
  uint64_t seed = 0;       // the job's seed (a resume with another seed is refused)
  Rng::State rng_state{};  // cohort sampling stream
  TensorList model;
  TensorList optimizer_state;  // server optimizer (velocity); may be empty
  double elapsed_s = 0;        // wall time of the job so far
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  double clip_norm = 0;  // adaptive clipping: C for the next round (0: not in use)
  // The privacy mode of the job that wrote it (privacy::PrivacyMode as 0 none, 1 central, 2
  // local, 3 distributed), so that a DP job is not resumed without DP or the reverse; -1 in files
  // written before it was recorded.
  int64_t privacy_mode = -1;
  // The job summary's evaluation record so far (C4), so that a resumed job's summary.json stays
  // whole: NaN / 0 where there is none yet.
  double final_test_accuracy = std::numeric_limits<double>::quiet_NaN();
  double final_test_loss = std::numeric_limits<double>::quiet_NaN();
  double best_test_accuracy = std::numeric_limits<double>::quiet_NaN();
  uint64_t best_round = 0;
};
// A checkpoint is operator-only: it holds the global model, the server optimizer state and the
// seeded cohort stream of non-DP jobs. DP jobs draw their cohorts from the OS CSPRNG and store no
// sampling key, so the checkpoint reveals nothing about who was sampled.

inline constexpr char kCheckpointFile[] = "checkpoint.bin";

// The newest format (C4, kCheckpointFormat) ends with a BLAKE2b-256 digest of everything before
// it. Reading refuses, with DataLoss naming the file and what is wrong: a digest mismatch (a
// flipped bit, a truncated or spliced file), a corrupt field, or a value CheckCheckpointValues
// refuses. C1-C3 files carry no digest, so nothing tells a damaged or edited one from a good one
// (and renaming a C4 file's magic would skip its checksum): they are read, with the same checks,
// only with CheckpointReadOptions::allow_legacy_format, and refused with FailedPrecondition
// naming `--allow-legacy-checkpoint` otherwise.
inline constexpr int kCheckpointFormat = 4;
inline constexpr uint64_t kMaxCheckpointRound = 1'000'000;  // the largest `rounds` a job may have

// The values a checkpoint of `format` (1-4) may hold, one rule for the writer and the reader, so
// that nothing is written that could not be read back: OK, or InvalidArgument naming the first
// field out of range: completed_round > kMaxCheckpointRound, model_version or best_round past
// it, an elapsed time or clip norm not finite and >= 0, a privacy mode that is not one of the
// four (-1, not recorded, before C3), a final or best accuracy outside [0, 1] or an infinite
// final loss (NaN: none yet), non-finite model or optimizer values.
Status CheckCheckpointValues(const Checkpoint& ckpt, int format);

// Refuses (Internal, naming the field) a checkpoint CheckCheckpointValues refuses; writes
// atomically otherwise.
Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt);

struct CheckpointReadOptions {
  // Read C1-C3 files (no digest): the CLI's `--allow-legacy-checkpoint`.
  bool allow_legacy_format = false;
};
StatusOr<Checkpoint> ReadCheckpoint(const std::string& path,
                                    const CheckpointReadOptions& options = {});

// The checkpoint a resumed job continues from (options.resume): out_dir's, checked against the job
// (its seed, its privacy mode: a DP job continued without DP, or the reverse, would release models
// whose guarantee no ledger describes; the model's tensors). nullopt when the job starts afresh:
// not resuming, or resuming a job killed before its first checkpoint (warned).
StatusOr<std::optional<Checkpoint>> ReadResumeCheckpoint(const CoordinatorOptions& options);

}  // namespace huddle::coordinator
