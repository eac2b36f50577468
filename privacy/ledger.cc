#include "privacy/ledger.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/digest.h"
#include "common/file_util.h"
#include "common/time_format.h"

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

constexpr char kChainTag[] = "huddle-ledger-chain-v1";
constexpr size_t kHeadHexChars = 64;

std::string GenesisHead() {
  Digest d;
  d.Add(std::string_view(kChainTag));
  return d.Hex();
}

// The chain head after `line` (its exact bytes, without the newline).
std::string NextHead(const std::string& head, std::string_view line) {
  Digest d;
  d.Add(std::string_view(kChainTag)).Add(std::string_view(head)).Add(line);
  return d.Hex();
}

bool IsHead(const std::string& text) {
  return text.size() == kHeadHexChars &&
         text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// The line this version writes: LedgerLine's object with the chain head before it as "prev".
std::string ChainedLine(const LedgerEntry& entry, const std::string& prev) {
  std::string line = LedgerLine(entry);
  line.pop_back();  // the object's closing brace
  absl::StrAppend(&line, ",\"prev\":\"", prev, "\"}");
  return line;
}

struct Mark {
  int64_t entries = 0;
  std::string head;
};

StatusOr<std::optional<Mark>> ReadMark(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::optional<Mark>();
  HUDDLE_ASSIGN_OR_RETURN(std::string text, ReadFile(path, 4096));
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("entries") || !j["entries"].is_number_unsigned() ||
      !j.contains("head") || !j["head"].is_string() || !IsHead(j["head"].get<std::string>())) {
    return absl::DataLossError(absl::StrCat(
        path,
        " is not a privacy ledger's mark ({\"entries\":N,\"head\":\"<64 hex>\"}); it is "
        "replaced only atomically, so it was damaged or edited: restore it with its ledger "
        "from a backup"));
  }
  return std::optional<Mark>(Mark{j["entries"].get<int64_t>(), j["head"].get<std::string>()});
}

Status WriteMark(const std::string& path, size_t entries, const std::string& head) {
  nlohmann::ordered_json j;
  j["entries"] = entries;
  j["head"] = head;
  return WriteFileAtomic(path, j.dump() + "\n");
}

// A ledger file's lines, replayed.
struct Replay {
  std::vector<LedgerEntry> entries;               // every complete line that parses
  std::vector<std::string> heads{GenesisHead()};  // heads[i]: the head after i complete lines
  int64_t lines = 0;                              // complete lines
  int64_t chained = 0;                            // complete lines that carry "prev"
  size_t complete_bytes = 0;                      // where a torn last line starts
  size_t torn_bytes = 0;                          // its length (0: none)
  std::string problem;                            // the first line that breaks it ("": none)
};

StatusOr<LedgerEntry> ParseChainedLine(const std::string& line, std::optional<std::string>* prev);

Replay ReplayLines(const std::string& text) {
  Replay r;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    if (end == std::string::npos) {
      r.torn_bytes = text.size() - pos;
      break;
    }
    const std::string line = text.substr(pos, end - pos);
    ++r.lines;
    std::optional<std::string> prev;
    auto entry = ParseChainedLine(line, &prev);
    if (!entry.ok()) {
      if (r.problem.empty()) {
        r.problem = absl::StrCat("line ", r.lines, ": ", entry.status().message());
      }
    } else {
      if (prev) {
        ++r.chained;
        if (*prev != r.heads.back() && r.problem.empty()) {
          r.problem = absl::StrCat(
              "line ", r.lines,
              " does not follow the lines before it (its \"prev\" is not their chain head: a "
              "line before it was removed, changed or moved)");
        }
      }
      r.entries.push_back(*std::move(entry));
    }
    r.heads.push_back(NextHead(r.heads.back(), line));
    pos = end + 1;
    r.complete_bytes = pos;
  }
  return r;
}

std::string Entries(int64_t n) { return absl::StrCat(n, n == 1 ? " entry" : " entries"); }

// What makes `r` (the file at `path`, existing or not) refused against `mark`, or "".
std::string ContinuityProblem(const std::string& path, bool existed, const Replay& r,
                              const std::optional<Mark>& mark) {
  if (!r.problem.empty()) return r.problem;
  const std::string mark_path = path + kMarkSuffix;
  if (mark) {
    if (mark->entries > r.lines) {
      if (!existed) {
        return absl::StrCat("it is missing, and its mark ", mark_path, " says ",
                            Entries(mark->entries),
                            " were appended to it (each after its fsync returned)");
      }
      return absl::StrCat("it holds ", Entries(r.lines),
                          r.torn_bytes > 0 ? " and a torn last line" : "", ", and its mark ",
                          mark_path, " says ", Entries(mark->entries),
                          " were appended (each after its fsync returned): entries were removed");
    }
    if (r.heads[static_cast<size_t>(mark->entries)] != mark->head) {
      return absl::StrCat("its first ", Entries(mark->entries), " are not those its mark ",
                          mark_path, " sealed (the ledger was replaced or edited)");
    }
    return "";
  }
  if (r.chained > 0) {
    return absl::StrCat(
        "its mark ", mark_path,
        " is missing, yet its lines carry the chain, which is written only after a mark: the mark "
        "was deleted, so whether entries were removed cannot be checked");
  }
  return "";
}

// The first free name for a damaged ledger's bytes.
std::string DamagedPath(const std::string& path) {
  std::string candidate = path + kDamagedSuffix;
  std::error_code ec;
  for (int i = 1; i < 1000 && std::filesystem::exists(candidate, ec); ++i) {
    candidate = absl::StrCat(path, kDamagedSuffix, ".", i);
  }
  return candidate;
}

}  // namespace

std::string LedgerLine(const LedgerEntry& e) {
  nlohmann::ordered_json j;
  j["round"] = e.round;
  if (!e.time.empty()) j["time"] = e.time;
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

namespace {

StatusOr<LedgerEntry> ParseEntry(const nlohmann::json& j) {
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
  // A label, read as written: a time in another form must not make the spend unknown.
  HUDDLE_RETURN_IF_ERROR(optional_text("time", &e.time));
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

StatusOr<LedgerEntry> ParseChainedLine(const std::string& line, std::optional<std::string>* prev) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::DataLossError("not a JSON object");
  if (j.contains("prev")) {
    if (!j["prev"].is_string() || !IsHead(j["prev"].get<std::string>())) {
      return absl::DataLossError("field 'prev' is not a chain head (64 lowercase hex)");
    }
    *prev = j["prev"].get<std::string>();
  }
  return ParseEntry(j);
}

}  // namespace

StatusOr<LedgerEntry> ParseLedgerLine(const std::string& line) {
  std::optional<std::string> prev;
  return ParseChainedLine(line, &prev);
}

StatusOr<PrivacyLedger> PrivacyLedger::Open(const std::string& path,
                                            const LedgerOpenOptions& options) {
  const std::string mark_path = path + kMarkSuffix;
  const Clock* clock = options.clock != nullptr ? options.clock : SteadyClock::Get();
  HUDDLE_ASSIGN_OR_RETURN(const std::optional<Mark> mark, ReadMark(mark_path));
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  std::string text;
  if (existed) {
    HUDDLE_ASSIGN_OR_RETURN(text, ReadFile(path));
  }
  Replay r = ReplayLines(text);
  const std::string problem = ContinuityProblem(path, existed, r, mark);
  if (!problem.empty() && !options.acknowledge_loss) {
    return absl::DataLossError(absl::StrCat(
        "the privacy ledger ", path, " lost entries or cannot be read: ", problem,
        ". The privacy already spent cannot be established, so it is refused (going on would "
        "spend again what was spent, and could noise a release twice). To recover: restore ",
        path, " and ", mark_path, " together from a backup; ", options.how_to_acknowledge));
  }
  if (!problem.empty()) {
    // The operator's explicit word: keep the damaged bytes, rewrite what parses as a fresh chain,
    // and count what was lost as unbounded.
    const int64_t marked = mark ? mark->entries : 0;
    const int64_t lost = std::max<int64_t>(1, marked - static_cast<int64_t>(r.entries.size()));
    if (!text.empty()) HUDDLE_RETURN_IF_ERROR(WriteFileAtomic(DamagedPath(path), text));
    std::string rewritten;
    std::string head = GenesisHead();
    for (const LedgerEntry& e : r.entries) {
      const std::string line = ChainedLine(e, head);
      head = NextHead(head, line);
      absl::StrAppend(&rewritten, line, "\n");
    }
    HUDDLE_RETURN_IF_ERROR(WriteFileAtomic(path, rewritten));
    HUDDLE_RETURN_IF_ERROR(WriteMark(mark_path, r.entries.size(), head));
    const int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
    if (fd < 0) return Errno("cannot open the privacy ledger", path);
    PrivacyLedger ledger(path, fd, std::move(r.entries), head,
                         static_cast<int64_t>(rewritten.size()), clock);
    HUDDLE_RETURN_IF_ERROR(ledger.AppendLost(lost));
    spdlog::error(
        "{}: {}. The loss is acknowledged: {} entries kept, the lost ones counted as an unbounded "
        "spend (epsilon infinite); the damaged file is kept beside it",
        path, problem, ledger.entries_.size() - 2);
    return ledger;
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot open the privacy ledger", path);
  PrivacyLedger ledger(path, fd, std::move(r.entries), r.heads.back(),
                       static_cast<int64_t>(r.complete_bytes), clock);  // owns fd from here on
  if (!existed) HUDDLE_RETURN_IF_ERROR(SyncParentDir(path));
  if (r.torn_bytes > 0) {
    // A torn final write the mark does not count: its fsync never returned, so nothing was
    // released for it.
    spdlog::warn("{}: dropping an incomplete last line ({} bytes) left by a crash mid-write", path,
                 r.torn_bytes);
    if (::ftruncate(fd, static_cast<off_t>(r.complete_bytes)) != 0 || ::fsync(fd) != 0) {
      return Errno("cannot truncate the torn last line of", path);
    }
  }
  if (!mark || mark->entries < r.lines) {
    if (!mark && r.lines > 0) {
      spdlog::info(
          "{}: a ledger written before its continuity chain ({} entries): sealed by a new mark "
          "{}; the chain starts with the next append",
          path, r.lines, mark_path);
    } else if (mark) {
      spdlog::info(
          "{}: {} entries after its mark (appends whose mark update a crash cut off): counted, an "
          "over-count is safe",
          path, r.lines - mark->entries);
    }
    HUDDLE_RETURN_IF_ERROR(WriteMark(mark_path, ledger.entries_.size(), ledger.head_));
  }
  return ledger;
}

PrivacyLedger::PrivacyLedger(std::string path, int fd, std::vector<LedgerEntry> entries,
                             std::string head, int64_t size_bytes, const Clock* clock)
    : path_(std::move(path)),
      fd_(fd),
      clock_(clock),
      entries_(std::move(entries)),
      head_(std::move(head)),
      size_bytes_(size_bytes) {}

PrivacyLedger::PrivacyLedger(PrivacyLedger&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      clock_(other.clock_),
      entries_(std::move(other.entries_)),
      head_(std::move(other.head_)),
      size_bytes_(other.size_bytes_),
      broken_(other.broken_) {}

PrivacyLedger& PrivacyLedger::operator=(PrivacyLedger&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    clock_ = other.clock_;
    entries_ = std::move(other.entries_);
    head_ = std::move(other.head_);
    size_bytes_ = other.size_bytes_;
    broken_ = other.broken_;
  }
  return *this;
}

PrivacyLedger::~PrivacyLedger() {
  if (fd_ >= 0) ::close(fd_);
}

std::string PrivacyLedger::mark_path() const { return path_ + kMarkSuffix; }

Status PrivacyLedger::Append(const LedgerEntry& entry) {
  if (broken_) {
    return absl::FailedPreconditionError(absl::StrCat("an earlier append to the privacy ledger ",
                                                      path_, " failed: reopen it to append again"));
  }
  LedgerEntry recorded = entry;
  recorded.time = Iso8601Utc(clock_->WallMs());
  const std::string line = ChainedLine(recorded, head_);
  const std::string bytes = line + "\n";
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const Status failed = Errno("cannot append to the privacy ledger", path_);
      broken_ = true;
      // Best effort: take a partial line away (else the next open drops it as torn).
      if (::ftruncate(fd_, static_cast<off_t>(size_bytes_)) != 0) {
        spdlog::warn("{}: cannot truncate a failed append: {}", path_, std::strerror(errno));
      }
      return failed;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd_) != 0) {
    broken_ = true;  // the line may be durable or not: a reopen counts it if it is (safe)
    return Errno("cannot fsync the privacy ledger", path_);
  }
  size_bytes_ += static_cast<int64_t>(bytes.size());
  head_ = NextHead(head_, line);
  entries_.push_back(std::move(recorded));
  // Only now, after the line is durable: a mark never counts an entry that was not made.
  return WriteMark(mark_path(), entries_.size(), head_);
}

Status PrivacyLedger::AppendLost(int64_t lost, std::string_view release) {
  for (const char* unit : {kUnitClient, kUnitExample}) {
    LedgerEntry e;
    e.round = 0;
    e.mechanism = kMechanismGaussian;
    e.sampling_rate = 1;
    e.noise_multiplier = 0;  // unbounded: what the lost entries spent is not known
    e.mode = kModeLost;
    e.steps = std::max<int64_t>(1, lost);
    e.noise = "unknown (entries lost)";
    e.unit = unit;
    e.adjacency = kAddRemove;
    if (e.unit == kUnitClient) e.release = std::string(release);
    HUDDLE_RETURN_IF_ERROR(Append(e));
  }
  return absl::OkStatus();
}

namespace {

// The fields every release has; the factories below add what their kind has besides.
LedgerEntry Release(std::string_view mechanism, std::string_view mode, uint64_t round,
                    const DpEvent& event, double clip_norm, std::string noise,
                    std::string_view unit, std::string_view adjacency) {
  LedgerEntry e;
  e.round = round;
  e.mechanism = mechanism;
  e.sampling_rate = event.sampling_rate;
  e.noise_multiplier = event.noise_multiplier;
  e.steps = event.steps;
  e.clip_norm = clip_norm;
  e.mode = mode;
  e.noise = std::move(noise);
  e.unit = unit;
  e.adjacency = adjacency;
  return e;
}

}  // namespace

bool IsPrivateNoise(std::string_view noise) {
  return noise == kNoiseOsCsprng || noise == kNoiseClientSide || noise == kNoiseSecAggShares;
}

bool IsPrivateRelease(double noise_multiplier, std::string_view noise) {
  return noise_multiplier > 0 && IsPrivateNoise(noise);
}

LedgerEntry LedgerEntry::ClientGaussian(std::string_view mode, uint64_t round, double sampling_rate,
                                        double noise_multiplier, double clip_norm,
                                        std::string_view adjacency, std::string noise) {
  return Release(kMechanismGaussian, mode, round, DpEvent{sampling_rate, noise_multiplier, 1},
                 clip_norm, std::move(noise), kUnitClient, adjacency);
}

LedgerEntry LedgerEntry::DistributedSum(uint64_t round, const DpEvent& sum, double clip_norm,
                                        std::string noise) {
  LedgerEntry e =
      Release(kMechanismDistributed, kModeDistributed, round, DpEvent{1, sum.noise_multiplier, 1},
              clip_norm, std::move(noise), kUnitClient, kReplaceOne);
  e.tau = sum.tau;
  e.dimension = sum.dimension;
  return e;
}

LedgerEntry LedgerEntry::DpSgdSteps(uint64_t round, const DpEvent& steps, double clip_norm,
                                    std::string noise) {
  return Release(kMechanismGaussian, kModeDpSgd, round, steps, clip_norm, std::move(noise),
                 kUnitExample, kAddRemove);
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
