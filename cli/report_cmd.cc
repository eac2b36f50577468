// `huddle report OUT` and `huddle report --job NAME`: a job's report page (report/report.h),
// rendered here from its output directory, or by the service that runs it (an operator request,
// cli/operator_cmd.cc). Exit codes as every command's: 2 for flags and an OUT that is not there, 1
// for outputs that cannot be read (a malformed file: its name and line) or a page not written.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "common/file_util.h"
#include "common/version.h"
#include "report/report.h"

namespace huddle::cli {
namespace {

constexpr char kCommand[] = "huddle report";

int Usage(const std::string& why) {
  std::fprintf(stderr, "%s: %s\n", kCommand, why.c_str());
  return kExitUsage;
}

}  // namespace

void PrintReportNotes(bool operator_only, const std::vector<std::string>& left_out) {
  if (operator_only) {
    std::fprintf(stderr,
                 "%s: the page holds operator-only values, computed without noise and marked so: "
                 "do not publish it\n",
                 kCommand);
  }
  if (!left_out.empty()) {
    std::string titles;
    for (const std::string& t : left_out) titles += (titles.empty() ? "" : ", ") + t;
    std::fprintf(stderr,
                 "%s: under DP the page leaves out the operator-only plots (%s); --operator draws "
                 "them, marked, for the operator alone\n",
                 kCommand, titles.c_str());
  }
}

int RunReportCommand(const ReportFlags& flags) {
  const OperatorFlags& f = flags.remote;
  if (flags.out_dir.empty() == f.argument.empty()) {
    return Usage(
        "give a job's output directory (huddle report OUT) or a service's job (huddle report "
        "--job NAME --service ... --server-key ... --key ...), not both");
  }
  if (!flags.out_dir.empty() &&
      (!f.service.empty() || !f.server_key.empty() || !f.key.empty() || f.insecure)) {
    return Usage(
        "--service, --server-key, --key and --insecure go with --job NAME (a service's job); an "
        "output directory is read here");
  }
  if (!f.output.empty()) {
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(f.output).parent_path();
    if (std::filesystem::is_directory(f.output, ec)) {
      return Usage("--output " + f.output + " is a directory; give the page's file name");
    }
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
      return Usage("--output " + f.output + ": the directory " + parent.string() +
                   " does not exist");
    }
  }
  if (!f.argument.empty()) return RunOperatorCommand(f);

  report::ReportOptions options;
  options.operator_view = f.operator_view;
  options.build = VersionLine();
  options.generated_at = NowIso8601();
  options.source = flags.out_dir;
  StatusOr<report::Report> page = report::RenderReport(flags.out_dir, options);
  if (!page.ok()) {
    std::fprintf(stderr, "%s: %s\n", kCommand, std::string(page.status().message()).c_str());
    // No such OUT is the caller's to fix; a file that cannot be read is the job's outputs'.
    return absl::IsNotFound(page.status()) || absl::IsInvalidArgument(page.status()) ? kExitUsage
                                                                                     : kExitFailed;
  }
  const std::string path =
      f.output.empty() ? (std::filesystem::path(flags.out_dir) / "report.html").string() : f.output;
  if (Status st = WriteFileAtomic(path, page->html); !st.ok()) {
    std::fprintf(stderr, "%s: %s: %s\n", kCommand, path.c_str(), std::string(st.message()).c_str());
    return kExitFailed;
  }
  PrintReportNotes(page->holds_operator_only, page->left_out);
  std::printf("%s\n", path.c_str());
  return kExitOk;
}

}  // namespace huddle::cli
