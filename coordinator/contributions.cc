#include "coordinator/contributions.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/file_util.h"

namespace huddle::coordinator {

StatusOr<Contributions> Contributions::Open(const std::string& out_dir, bool resume,
                                            int64_t max_participations, int64_t min_separation,
                                            int64_t ledger_releases) {
  Contributions c((std::filesystem::path(out_dir) / kContributionsFile).string(),
                  max_participations, min_separation);
  if (!resume) {
    // A fresh start: the job's ledger is empty (JobLedger refuses one with entries), so nothing
    // recorded here was released.
    std::error_code ec;
    std::filesystem::remove(c.path_, ec);
    return c;
  }
  HUDDLE_RETURN_IF_ERROR(c.Load(ledger_releases));
  return c;
}

Status Contributions::Load(int64_t ledger_releases) {
  std::string text;
  if (auto read = ReadFile(path_); read.ok()) {
    text = std::move(*read);
  } else if (!absl::IsNotFound(read.status())) {
    return read.status();
  }
  int64_t lines = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) {
      // Torn by a crash: its release was never appended. Cut it, so the next line starts clean.
      std::error_code ec;
      std::filesystem::resize_file(path_, begin, ec);
      if (ec)
        return absl::InternalError(absl::StrCat(path_, ": cannot cut a torn line: ", ec.message()));
      break;
    }
    const std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    ++lines;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    bool ok = j.is_object() && j.contains("step") && j["step"].is_number_unsigned() &&
              j.contains("clients") && j["clients"].is_array();
    if (ok) {
      for (const nlohmann::json& id : j["clients"]) ok = ok && id.is_string();
    }
    if (!ok) {
      return absl::DataLossError(absl::StrCat(
          path_, ":", lines,
          ": not a line this coordinator wrote ({\"step\":N,\"clients\":[...]}); the clients' "
          "contributions, which privacy.max_participations bounds, cannot be counted: restore "
          "the file from a backup"));
    }
    for (const nlohmann::json& id : j["clients"]) {
      Contributed(id.get<std::string>(), j["step"].get<uint64_t>());
    }
  }
  if (lines < ledger_releases) {
    return absl::DataLossError(absl::StrCat(
        path_, " records ", lines, " server steps but the privacy ledger holds ", ledger_releases,
        " releases: lines were lost (each is written before its release), so the clients' "
        "contributions, which privacy.max_participations bounds, cannot be counted; restore the "
        "file from a backup"));
  }
  return absl::OkStatus();
}

bool Contributions::MaySend(const std::string& id, uint64_t open_step) const {
  auto it = clients_.find(id);
  if (it == clients_.end()) return true;
  const Client& c = it->second;
  return c.count < max_participations_ &&
         open_step >= c.last_step + static_cast<uint64_t>(min_separation_);
}

void Contributions::Contributed(const std::string& id, uint64_t step) {
  Client& c = clients_[id];
  ++c.count;
  c.last_step = std::max(c.last_step, step);
  most_ = std::max(most_, c.count);
  if (c.count == max_participations_) ++exhausted_;
}

Status Contributions::Record(uint64_t step, const std::vector<std::string>& clients) {
  return AppendLine(path_, nlohmann::json{{"step", step}, {"clients", clients}}.dump());
}

}  // namespace huddle::coordinator
