#include "privacy/ledger.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace huddle::privacy {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// fsync of the directory holding `path`, so that a newly created file's entry is durable.
Status SyncParentDir(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = std::filesystem::current_path();
  const std::string dir = parent.string();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("cannot fsync directory", dir);
}

}  // namespace

std::string LedgerLine(const LedgerEntry& e) {
  nlohmann::ordered_json j;
  j["round"] = e.round;
  j["mechanism"] = e.mechanism;
  j["sampling_rate"] = e.sampling_rate;
  j["noise_multiplier"] = e.noise_multiplier;
  j["clip_norm"] = e.clip_norm;
  j["mode"] = e.mode;
  j["steps"] = e.steps;
  j["noise"] = e.noise;
  j["unit"] = e.unit;
  j["adjacency"] = e.adjacency;
  if (e.mechanism == kMechanismDistributed) {
    j["tau"] = e.tau;
    j["dimension"] = e.dimension;
  }
  if (!e.job.empty()) j["job"] = e.job;
  if (!e.release.empty()) j["release"] = e.release;
  return j.dump();
}

StatusOr<LedgerEntry> ParseLedgerLine(const std::string& line) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::DataLossError("not a JSON object");
  auto number = [&](const char* key, double lo, double hi) -> StatusOr<double> {
    if (!j.contains(key) || !j[key].is_number()) {
      return absl::DataLossError(absl::StrCat("field '", key, "' is missing or not a number"));
    }
    const double v = j[key].get<double>();
    if (!(v >= lo && v <= hi)) {
      return absl::DataLossError(absl::StrCat("field '", key, "' = ", v, " is out of range"));
    }
    return v;
  };
  auto text = [&](const char* key) -> StatusOr<std::string> {
    if (!j.contains(key) || !j[key].is_string()) {
      return absl::DataLossError(absl::StrCat("field '", key, "' is missing or not a string"));
    }
    return j[key].get<std::string>();
  };
  LedgerEntry e;
  if (!j.contains("round") || !j["round"].is_number_unsigned()) {
    return absl::DataLossError("field 'round' is missing or not an unsigned integer");
  }
  e.round = j["round"].get<uint64_t>();
  HUDDLE_ASSIGN_OR_RETURN(e.mechanism, text("mechanism"));
  if (e.mechanism != kMechanismGaussian && e.mechanism != kMechanismDistributed) {
    return absl::DataLossError(absl::StrCat("unknown mechanism '", e.mechanism, "'"));
  }
  HUDDLE_ASSIGN_OR_RETURN(e.sampling_rate, number("sampling_rate", 0, 1));
  HUDDLE_ASSIGN_OR_RETURN(e.noise_multiplier, number("noise_multiplier", 0, HUGE_VAL));
  HUDDLE_ASSIGN_OR_RETURN(e.clip_norm, number("clip_norm", 0, HUGE_VAL));
  HUDDLE_ASSIGN_OR_RETURN(e.mode, text("mode"));
  if (!j.contains("steps") || !j["steps"].is_number_integer() || j["steps"].get<int64_t>() < 0) {
    return absl::DataLossError("field 'steps' is missing or not a non-negative integer");
  }
  e.steps = j["steps"].get<int64_t>();
  HUDDLE_ASSIGN_OR_RETURN(e.noise, text("noise"));
  if (e.mechanism == kMechanismDistributed) {
    HUDDLE_ASSIGN_OR_RETURN(e.tau, number("tau", 0, HUGE_VAL));
    if (std::isinf(e.tau)) return absl::DataLossError("field 'tau' is infinite");
    if (!j.contains("dimension") || !j["dimension"].is_number_integer() ||
        j["dimension"].get<int64_t>() < 1) {
      return absl::DataLossError("field 'dimension' is missing or not a positive integer");
    }
    e.dimension = j["dimension"].get<int64_t>();
    if (e.sampling_rate != 1) {
      return absl::DataLossError(
          absl::StrCat("a distributed discrete Gaussian release with sampling_rate ",
                       e.sampling_rate, " (they are accounted unsampled)"));
    }
  }
  // Fields added later: absent in older ledgers, whose events were all client-level add/remove.
  auto optional_text = [&](const char* key, std::string* out) -> Status {
    if (!j.contains(key)) return absl::OkStatus();
    HUDDLE_ASSIGN_OR_RETURN(*out, text(key));
    return absl::OkStatus();
  };
  HUDDLE_RETURN_IF_ERROR(optional_text("unit", &e.unit));
  HUDDLE_RETURN_IF_ERROR(optional_text("adjacency", &e.adjacency));
  HUDDLE_RETURN_IF_ERROR(optional_text("job", &e.job));
  HUDDLE_RETURN_IF_ERROR(optional_text("release", &e.release));
  if (e.unit != kUnitClient && e.unit != kUnitExample) {
    return absl::DataLossError(absl::StrCat("unknown unit '", e.unit, "'"));
  }
  if (e.adjacency != kAddRemove && e.adjacency != kReplaceOne) {
    return absl::DataLossError(absl::StrCat("unknown adjacency '", e.adjacency, "'"));
  }
  if (e.adjacency == kReplaceOne && e.sampling_rate != 1) {
    return absl::DataLossError(
        absl::StrCat("adjacency replace_one with sampling_rate ", e.sampling_rate,
                     " (only unsampled releases are accounted under replace-one)"));
  }
  return e;
}

StatusOr<PrivacyLedger> PrivacyLedger::Open(const std::string& path) {
  const bool existed = std::filesystem::exists(path);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot open the privacy ledger", path);
  PrivacyLedger ledger(path, fd, {});  // owns fd from here on
  if (!existed) HUDDLE_RETURN_IF_ERROR(SyncParentDir(path));
  HUDDLE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  size_t pos = 0;
  int64_t line_number = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    ++line_number;
    if (end == std::string::npos) {
      // A torn final write: its fsync never returned, so nothing was released for it.
      spdlog::warn("{}: dropping an incomplete last line ({} bytes) left by a crash mid-write",
                   path, text.size() - pos);
      if (::ftruncate(fd, static_cast<off_t>(pos)) != 0 || ::fsync(fd) != 0) {
        return Errno("cannot truncate the torn last line of", path);
      }
      break;
    }
    auto entry = ParseLedgerLine(text.substr(pos, end - pos));
    if (!entry.ok()) {
      return absl::DataLossError(absl::StrCat(
          path, " line ", line_number, ": ", entry.status().message(),
          "; the privacy spend cannot be established, so the job cannot continue (restore the "
          "ledger from a backup, or start the job afresh with a new output directory)"));
    }
    ledger.entries_.push_back(*std::move(entry));
    pos = end + 1;
  }
  return ledger;
}

PrivacyLedger::PrivacyLedger(std::string path, int fd, std::vector<LedgerEntry> entries)
    : path_(std::move(path)), fd_(fd), entries_(std::move(entries)) {}

PrivacyLedger::PrivacyLedger(PrivacyLedger&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      entries_(std::move(other.entries_)) {}

PrivacyLedger& PrivacyLedger::operator=(PrivacyLedger&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    entries_ = std::move(other.entries_);
  }
  return *this;
}

PrivacyLedger::~PrivacyLedger() {
  if (fd_ >= 0) ::close(fd_);
}

Status PrivacyLedger::Append(const LedgerEntry& entry) {
  const std::string line = LedgerLine(entry) + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("cannot append to the privacy ledger", path_);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd_) != 0) return Errno("cannot fsync the privacy ledger", path_);
  entries_.push_back(entry);
  return absl::OkStatus();
}

DpEvent LedgerEntry::event() const {
  const double z = adjacency == kReplaceOne ? noise_multiplier / 2 : noise_multiplier;
  DpEvent event{sampling_rate, z, steps};
  if (mechanism == kMechanismDistributed) {
    event.mechanism = Mechanism::kDistributedDiscreteGaussian;
    event.tau = tau;
    event.dimension = dimension;
  }
  return event;
}

std::vector<DpEvent> PrivacyLedger::Events(std::string_view unit) const {
  return EventsOf(entries_, unit);
}

std::vector<DpEvent> EventsOf(std::span<const LedgerEntry> entries, std::string_view unit) {
  std::vector<DpEvent> events;
  for (const LedgerEntry& e : entries) {
    if (!unit.empty() && e.unit != unit) continue;
    const DpEvent event = e.event();
    if (!events.empty() && events.back().sampling_rate == event.sampling_rate &&
        events.back().noise_multiplier == event.noise_multiplier &&
        events.back().mechanism == event.mechanism && events.back().tau == event.tau &&
        events.back().dimension == event.dimension) {
      events.back().steps += event.steps;
    } else {
      events.push_back(event);
    }
  }
  return events;
}

const LedgerEntry* PrivacyLedger::FindRelease(std::string_view release) const {
  if (release.empty()) return nullptr;
  for (const LedgerEntry& e : entries_) {
    if (e.release == release) return &e;
  }
  return nullptr;
}

}  // namespace huddle::privacy
