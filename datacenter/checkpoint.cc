#include "datacenter/checkpoint.h"

#include <sodium.h>

#include <bit>
#include <cmath>

#include "common/file_util.h"
#include "common/tensor_io.h"

namespace huddle::datacenter {
namespace {

constexpr char kMagic[] = "HUDDLED2";
constexpr char kMagicV1[] = "HUDDLED1";                    // no epoch_ fields
constexpr size_t kDigestBytes = crypto_generichash_BYTES;  // 32

std::string DigestOf(std::string_view bytes) {
  std::string digest(kDigestBytes, '\0');
  crypto_generichash(reinterpret_cast<unsigned char*>(digest.data()), digest.size(),
                     reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), nullptr,
                     0);
  return digest;
}

}  // namespace

Status WriteTrainingState(const std::string& path, const TrainingState& s) {
  std::string out(kMagic, 8);
  AppendU64(static_cast<uint64_t>(s.epochs_done), &out);
  AppendU64(static_cast<uint64_t>(s.steps), &out);
  AppendU64(s.seed, &out);
  AppendU64(static_cast<uint64_t>(s.world_size), &out);
  AppendU64(static_cast<uint64_t>(s.batch_size), &out);
  AppendU64(std::bit_cast<uint64_t>(s.seconds), &out);
  AppendU64(s.dp_sgd ? 1 : 0, &out);
  AppendU64(static_cast<uint64_t>(s.epoch_rows), &out);
  AppendU64(std::bit_cast<uint64_t>(s.epoch_loss_sum), &out);
  AppendU64(std::bit_cast<uint64_t>(s.epoch_correct), &out);
  AppendTensorList(s.params, &out);
  AppendTensorList(s.velocity, &out);
  out += DigestOf(out);
  return WriteFileAtomic(path, out);
}

StatusOr<TrainingState> ReadTrainingState(const std::string& path) {
  HUDDLE_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  const bool v1 = bytes.size() >= 8 + kDigestBytes && bytes.compare(0, 8, kMagicV1, 8) == 0;
  if (bytes.size() < 8 + kDigestBytes || (!v1 && bytes.compare(0, 8, kMagic, 8) != 0)) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a Huddle datacenter checkpoint (bad magic or too short)"));
  }
  const std::string_view body(bytes.data(), bytes.size() - kDigestBytes);
  if (DigestOf(body) != std::string_view(bytes).substr(body.size())) {
    return absl::DataLossError(
        absl::StrCat(path, ": the checkpoint is damaged (its digest does not match its contents)"));
  }
  ByteReader r(body.substr(8), path);
  TrainingState s;
  auto next = [&](int64_t* v) -> Status {
    HUDDLE_ASSIGN_OR_RETURN(uint64_t u, r.U64());
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return absl::DataLossError(absl::StrCat(path, ": a count is out of range"));
    }
    *v = static_cast<int64_t>(u);
    return absl::OkStatus();
  };
  HUDDLE_RETURN_IF_ERROR(next(&s.epochs_done));
  HUDDLE_RETURN_IF_ERROR(next(&s.steps));
  HUDDLE_ASSIGN_OR_RETURN(s.seed, r.U64());
  HUDDLE_RETURN_IF_ERROR(next(&s.world_size));
  HUDDLE_RETURN_IF_ERROR(next(&s.batch_size));
  HUDDLE_ASSIGN_OR_RETURN(uint64_t seconds_bits, r.U64());
  s.seconds = std::bit_cast<double>(seconds_bits);
  if (!std::isfinite(s.seconds) || s.seconds < 0) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt training time"));
  }
  HUDDLE_ASSIGN_OR_RETURN(uint64_t flags, r.U64());
  if (flags > 1) return absl::DataLossError(absl::StrCat(path, ": unknown flags ", flags));
  s.dp_sgd = flags == 1;
  if (!v1) {
    HUDDLE_RETURN_IF_ERROR(next(&s.epoch_rows));
    HUDDLE_ASSIGN_OR_RETURN(uint64_t loss_bits, r.U64());
    HUDDLE_ASSIGN_OR_RETURN(uint64_t correct_bits, r.U64());
    s.epoch_loss_sum = std::bit_cast<double>(loss_bits);
    s.epoch_correct = std::bit_cast<double>(correct_bits);
    if (!std::isfinite(s.epoch_loss_sum) || s.epoch_loss_sum < 0 ||
        !std::isfinite(s.epoch_correct) || s.epoch_correct < 0) {
      return absl::DataLossError(absl::StrCat(path, ": corrupt epoch totals"));
    }
  }
  HUDDLE_ASSIGN_OR_RETURN(s.params, r.TensorListValue());
  HUDDLE_ASSIGN_OR_RETURN(s.velocity, r.TensorListValue());
  if (r.remaining() != 0) {
    return absl::DataLossError(absl::StrCat(path, ": ", r.remaining(), " trailing bytes"));
  }
  return s;
}

}  // namespace huddle::datacenter
