#include "coordinator/checkpoint.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <span>
#include <string_view>

#include "common/digest.h"
#include "common/file_util.h"
#include "common/tensor_io.h"

namespace huddle::coordinator {
namespace {

// C2 added clip_norm after bytes_out, C3 privacy_mode after clip_norm, C4 the evaluation record
// after privacy_mode and a trailing digest; C1-C3 files are still read.
constexpr char kMagic[] = "HUDDLEC4";
constexpr char kMagicV3[] = "HUDDLEC3";
constexpr char kMagicV2[] = "HUDDLEC2";
constexpr char kMagicV1[] = "HUDDLEC1";

constexpr size_t kDigestChars = 64;  // Digest::Hex()

std::string DigestOf(std::string_view bytes) {
  return Digest().Add(std::as_bytes(std::span(bytes.data(), bytes.size()))).Hex();
}

// Values a checkpoint may hold; the rest is corruption (or a file from elsewhere).
Status CheckRanges(const std::string& path, const Checkpoint& c) {
  if (c.completed_round > kMaxCheckpointRound) {
    return absl::DataLossError(absl::StrCat(path, ": completed_round ", c.completed_round,
                                            " is out of range [0, ", kMaxCheckpointRound, "]"));
  }
  if (c.model_version > c.completed_round) {
    return absl::DataLossError(absl::StrCat(path, ": model_version ", c.model_version,
                                            " exceeds completed_round ", c.completed_round));
  }
  if (c.best_round > c.completed_round) {
    return absl::DataLossError(absl::StrCat(path, ": best_round ", c.best_round,
                                            " exceeds completed_round ", c.completed_round));
  }
  if (!(c.elapsed_s >= 0) || !std::isfinite(c.elapsed_s)) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt elapsed time"));
  }
  for (double v : {c.final_test_accuracy, c.final_test_loss, c.best_test_accuracy}) {
    if (std::isinf(v))
      return absl::DataLossError(absl::StrCat(path, ": corrupt evaluation record"));
  }
  if (Status st = CheckFinite(c.model, "model"); !st.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", st.message()));
  }
  if (Status st = CheckFinite(c.optimizer_state, "optimizer state"); !st.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace

Status WriteCheckpoint(const std::string& path, const Checkpoint& c) {
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

StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  const std::string magic = bytes.substr(0, std::min<size_t>(8, bytes.size()));
  const bool v1 = magic == kMagicV1;
  const bool v2 = magic == kMagicV2;
  const bool v3 = magic == kMagicV3;
  const bool v4 = magic == kMagic;
  if (!v1 && !v2 && !v3 && !v4) {
    return absl::DataLossError(absl::StrCat(path, ": not a Huddle checkpoint (bad magic)"));
  }
  if (v4) {
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
  if (!v1) {
    HUDDLE_ASSIGN_OR_RETURN(uint64_t clip_bits, r.U64());
    c.clip_norm = std::bit_cast<double>(clip_bits);
    if (!(c.clip_norm >= 0) || !std::isfinite(c.clip_norm)) {
      return absl::DataLossError(absl::StrCat(path, ": corrupt clip norm"));
    }
  }
  if (!v1 && !v2) {
    HUDDLE_ASSIGN_OR_RETURN(const uint64_t mode, r.U64());
    if (mode > 3) return absl::DataLossError(absl::StrCat(path, ": corrupt privacy mode"));
    c.privacy_mode = static_cast<int64_t>(mode);
  }
  if (v4) {
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
  HUDDLE_RETURN_IF_ERROR(CheckRanges(path, c));
  return c;
}

}  // namespace huddle::coordinator
