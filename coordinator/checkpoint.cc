#include "coordinator/checkpoint.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "common/file_util.h"
#include "common/tensor_io.h"

namespace huddle::coordinator {
namespace {

// C2 added clip_norm after bytes_out, C3 privacy_mode after clip_norm; C1 and C2 files are still
// read.
constexpr char kMagic[] = "HUDDLEC3";
constexpr char kMagicV2[] = "HUDDLEC2";
constexpr char kMagicV1[] = "HUDDLEC1";

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
  AppendTensorList(c.model, &out);
  AppendTensorList(c.optimizer_state, &out);
  return WriteFileAtomic(path, out);
}

StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  ByteReader r(bytes, path);
  HUDDLE_ASSIGN_OR_RETURN(std::string magic, r.Bytes(8));
  const bool v1 = magic == std::string(kMagicV1, 8);
  const bool v2 = magic == std::string(kMagicV2, 8);
  if (!v1 && !v2 && magic != std::string(kMagic, 8)) {
    return absl::DataLossError(absl::StrCat(path, ": not a Huddle checkpoint (bad magic)"));
  }
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
    if (mode > 2) return absl::DataLossError(absl::StrCat(path, ": corrupt privacy mode"));
    c.privacy_mode = static_cast<int64_t>(mode);
  }
  HUDDLE_ASSIGN_OR_RETURN(c.model, r.TensorListValue());
  HUDDLE_ASSIGN_OR_RETURN(c.optimizer_state, r.TensorListValue());
  if (r.remaining() != 0) {
    return absl::DataLossError(absl::StrCat(path, ": ", r.remaining(), " trailing bytes"));
  }
  return c;
}

}  // namespace huddle::coordinator
