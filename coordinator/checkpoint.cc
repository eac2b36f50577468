#include "coordinator/checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <span>
#include <string_view>
#include <utility>

#include "common/digest.h"
#include "common/file_util.h"
#include "common/tensor_io.h"
#include "models/model.h"

namespace huddle::coordinator {
namespace {

// C2 added clip_norm after bytes_out, C3 privacy_mode after clip_norm, C4 the evaluation record
// after privacy_mode and a trailing digest; C1-C3 files are read only when asked for.
constexpr char kMagic[] = "HUDDLEC4";
constexpr const char* kMagics[] = {"HUDDLEC1", "HUDDLEC2", "HUDDLEC3", kMagic};
static_assert(std::size(kMagics) == kCheckpointFormat);

constexpr size_t kDigestChars = 64;  // Digest::Hex()

std::string DigestOf(std::string_view bytes) {
  return Digest().Add(std::as_bytes(std::span(bytes.data(), bytes.size()))).Hex();
}

}  // namespace

Status CheckCheckpointValues(const Checkpoint& c, int format) {
  auto impossible = [](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat(what...));
  };
  if (c.completed_round > kMaxCheckpointRound) {
    return impossible("completed_round ", c.completed_round, " is out of range [0, ",
                      kMaxCheckpointRound, "]");
  }
  if (c.model_version > c.completed_round) {
    return impossible("model_version ", c.model_version, " exceeds completed_round ",
                      c.completed_round);
  }
  if (c.best_round > c.completed_round) {
    return impossible("best_round ", c.best_round, " exceeds completed_round ", c.completed_round);
  }
  if (!(c.elapsed_s >= 0) || !std::isfinite(c.elapsed_s)) {
    return impossible("elapsed time ", c.elapsed_s, " is not a finite value >= 0");
  }
  if (!(c.clip_norm >= 0) || !std::isfinite(c.clip_norm)) {
    return impossible("clip norm ", c.clip_norm, " is not a finite value >= 0");
  }
  // C1-C2 did not record the privacy mode (-1); from C3 on it is one of the four modes.
  const bool mode_ok =
      format < 3 ? c.privacy_mode == -1 : c.privacy_mode >= 0 && c.privacy_mode <= 3;
  if (!mode_ok) return impossible("privacy mode ", c.privacy_mode, " is not a known mode");
  // The evaluation record: NaN where there is none yet.
  for (const auto& [name, v] : {std::pair{"final_test_accuracy", c.final_test_accuracy},
                                std::pair{"best_test_accuracy", c.best_test_accuracy}}) {
    if (!std::isnan(v) && !(v >= 0 && v <= 1)) {
      return impossible("evaluation record: ", name, " ", v, " is outside [0, 1]");
    }
  }
  if (std::isinf(c.final_test_loss)) {
    return impossible("evaluation record: final_test_loss ", c.final_test_loss, " is not finite");
  }
  HUDDLE_RETURN_IF_ERROR(CheckFinite(c.model, "model"));
  HUDDLE_RETURN_IF_ERROR(CheckFinite(c.optimizer_state, "optimizer state"));
  return absl::OkStatus();
}

Status WriteCheckpoint(const std::string& path, const Checkpoint& c) {
  // What the reader would refuse is never written: a job whose checkpoint cannot be read back
  // could not be resumed.
  if (Status st = CheckCheckpointValues(c, kCheckpointFormat); !st.ok()) {
    return absl::InternalError(absl::StrCat(path, ": checkpoint not written: ", st.message()));
  }
  std::string out(kMagic, 8);
  AppendU64(c.completed_round, &out);
  AppendU64(c.model_version, &out);
  AppendU64(c.seed, &out);
  for (uint64_t s : c.rng_state) AppendU64(s, &out);
  AppendU64(std::bit_cast<uint64_t>(c.elapsed_s), &out);
  AppendU64(c.bytes_in, &out);
  AppendU64(c.bytes_out, &out);
  AppendU64(std::bit_cast<uint64_t>(c.clip_norm), &out);
  AppendU64(static_cast<uint64_t>(c.privacy_mode), &out);
  AppendU64(std::bit_cast<uint64_t>(c.final_test_accuracy), &out);
  AppendU64(std::bit_cast<uint64_t>(c.final_test_loss), &out);
  AppendU64(std::bit_cast<uint64_t>(c.best_test_accuracy), &out);
  AppendU64(c.best_round, &out);
  AppendTensorList(c.model, &out);
  AppendTensorList(c.optimizer_state, &out);
  out += DigestOf(out);
  return WriteFileAtomic(path, out);
}

StatusOr<Checkpoint> ReadCheckpoint(const std::string& path, const CheckpointReadOptions& options) {
  HUDDLE_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  const std::string magic = bytes.substr(0, std::min<size_t>(8, bytes.size()));
  int format = 0;
  for (int f : {1, 2, 3, 4}) {
    if (magic == std::string_view(kMagics[f - 1], 8)) format = f;
  }
  if (format == 0) {
    return absl::DataLossError(absl::StrCat(path, ": not a Huddle checkpoint (bad magic)"));
  }
  if (format < kCheckpointFormat && !options.allow_legacy_format) {
    // Without a digest nothing tells a damaged or edited file from a good one: renaming a
    // current file's magic would otherwise skip its checksum.
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": a ", magic, " checkpoint, a format before ", kMagic,
        " that carries no checksum (damage or editing would go unnoticed); if the file is "
        "known to be intact, resume with --allow-legacy-checkpoint (coordinator option "
        "allow_legacy_checkpoint) to read it once (the next checkpoint is written as ",
        kMagic, ")"));
  }
  if (format == kCheckpointFormat) {
    // Checked first: nothing of a damaged file is interpreted.
    if (bytes.size() < 8 + kDigestChars ||
        bytes.compare(bytes.size() - kDigestChars, kDigestChars,
                      DigestOf(std::string_view(bytes.data(), bytes.size() - kDigestChars))) != 0) {
      return absl::DataLossError(absl::StrCat(
          path,
          ": checksum mismatch (the file is damaged or was modified); restore it from a "
          "backup, or start the job afresh"));
    }
    bytes.resize(bytes.size() - kDigestChars);
  }
  ByteReader r(bytes, path);
  HUDDLE_RETURN_IF_ERROR(r.Bytes(8).status());
  Checkpoint c;
  HUDDLE_ASSIGN_OR_RETURN(c.completed_round, r.U64());
  HUDDLE_ASSIGN_OR_RETURN(c.model_version, r.U64());
  HUDDLE_ASSIGN_OR_RETURN(c.seed, r.U64());
  for (uint64_t& s : c.rng_state) {
    HUDDLE_ASSIGN_OR_RETURN(s, r.U64());
  }
  HUDDLE_ASSIGN_OR_RETURN(uint64_t elapsed_bits, r.U64());
  c.elapsed_s = std::bit_cast<double>(elapsed_bits);
  HUDDLE_ASSIGN_OR_RETURN(c.bytes_in, r.U64());
  HUDDLE_ASSIGN_OR_RETURN(c.bytes_out, r.U64());
  if (format >= 2) {
    HUDDLE_ASSIGN_OR_RETURN(uint64_t clip_bits, r.U64());
    c.clip_norm = std::bit_cast<double>(clip_bits);
  }
  if (format >= 3) {
    HUDDLE_ASSIGN_OR_RETURN(const uint64_t mode, r.U64());
    c.privacy_mode = static_cast<int64_t>(mode);
  }
  if (format >= 4) {
    for (double* v : {&c.final_test_accuracy, &c.final_test_loss, &c.best_test_accuracy}) {
      HUDDLE_ASSIGN_OR_RETURN(const uint64_t bits, r.U64());
      *v = std::bit_cast<double>(bits);
    }
    HUDDLE_ASSIGN_OR_RETURN(c.best_round, r.U64());
  }
  HUDDLE_ASSIGN_OR_RETURN(c.model, r.TensorListValue());
  HUDDLE_ASSIGN_OR_RETURN(c.optimizer_state, r.TensorListValue());
  if (r.remaining() != 0) {
    return absl::DataLossError(absl::StrCat(path, ": ", r.remaining(), " trailing bytes"));
  }
  if (Status st = CheckCheckpointValues(c, format); !st.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", st.message()));
  }
  if (format < kCheckpointFormat) {
    spdlog::warn("{}: read a {} checkpoint, which carries no checksum (--allow-legacy-checkpoint)",
                 path, magic);
  }
  return c;
}

StatusOr<std::optional<Checkpoint>> ReadResumeCheckpoint(const CoordinatorOptions& options) {
  const std::string path = (std::filesystem::path(options.out_dir) / kCheckpointFile).string();
  if (!options.resume) return std::nullopt;
  if (!std::filesystem::exists(path)) {
    // Killed before its first checkpoint: nothing to continue but the privacy ledger, if any.
    spdlog::warn("--resume: no checkpoint at {}; starting from round 1", path);
    return std::nullopt;
  }
  CheckpointReadOptions read;
  read.allow_legacy_format = options.allow_legacy_checkpoint;
  HUDDLE_ASSIGN_OR_RETURN(Checkpoint ckpt, ReadCheckpoint(path, read));
  if (ckpt.seed != options.seed) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " was written by a job with seed ", ckpt.seed, "; this job has seed ", options.seed));
  }
  const auto mode = static_cast<int64_t>(options.privacy.mode);
  if (ckpt.privacy_mode >= 0 && ckpt.privacy_mode != mode) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " was written by a job with privacy.mode ",
        privacy::PrivacyModeName(static_cast<privacy::PrivacyMode>(ckpt.privacy_mode)),
        "; this job has privacy.mode ", privacy::PrivacyModeName(options.privacy.mode)));
  }
  HUDDLE_RETURN_IF_ERROR(models::CheckParams(options.model, ckpt.model));
  return ckpt;
}

}  // namespace huddle::coordinator
