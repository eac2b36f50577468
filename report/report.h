// `huddle report`: one self-contained HTML page of a job's outputs, for people to read.
//
// RenderReport reads a job's output directory (report/job_outputs.h: a federated job's OUT, a
// service's STATE/jobs/NAME/out, or a `huddle datacenter` OUT) and returns the page: a header
// (the job, its mode, its state, what ran: secure aggregation, DP, the model; the build and when
// the page was made) and the plots of report/plots.h as inline SVG (report/svg_plot.h).
//
// Self-contained: the page fetches nothing. It holds no script, no external style sheet, font or
// image, and no URL; its Content-Security-Policy (default-src 'none') forbids loading anything even
// if a value slipped through. Every text from the job's files is escaped (report/format.h).
//
// Under DP, the public page holds only DP-protected values and the configuration: the plots of
// operator-only values (computed without noise) are left out, and the page names them and says
// why. With `operator_view` they are drawn, each marked "operator-only (computed without noise;
// do not publish)", and the page says so at its top. Without DP every plot is drawn.
//
// A running job's directory is fine: files not written yet are plots that say "no data yet", a
// row being appended is left out, and the page says the job is running and how far it got.
//
// The page's size is bounded: each series is thinned to at most 2,000 points and every text cut
// at 2,000 bytes, and a page over kMaxReportBytes is refused (ResourceExhausted); the service
// answers with it, so that bound is its reply's too.
//
// Errors: NotFound (the directory does not exist), InvalidArgument (it is not a directory),
// DataLoss naming the file and line of a malformed input, FailedPrecondition for a file over its
// size limit or that is not a regular file. Never aborts.
//
// Thread-safety: stateless; concurrent calls are fine.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "report/job_outputs.h"

namespace huddle::report {

inline constexpr size_t kMaxReportBytes = size_t{16} << 20;
// The label of every operator-only plot and value on an operator's page.
inline constexpr char kOperatorOnlyLabel[] =
    "operator-only (computed without noise; do not publish)";

struct ReportOptions {
  bool operator_view = false;  // draw the operator-only plots and values (labelled)
  std::string build;           // the build that made the page (huddle::VersionLine())
  std::string generated_at;    // when, ISO-8601 UTC (the caller's clock)
  std::string source;          // where the outputs were read, shown in the header ("": not shown)
  std::string job_name;        // overrides the name the files give ("": theirs)
  // The job's state as its service knows it (queued, running, completed, failed, stopped) and
  // why; "" reads it from the files (the service's state.json beside OUT, else summary.json's
  // presence: a job without one is running).
  std::string state;
  std::string state_reason;
  ReadLimits limits;
};

struct Report {
  std::string html;
  bool dp = false;                    // the job ran under DP
  bool holds_operator_only = false;   // operator-only values are on the page (labelled)
  std::vector<std::string> left_out;  // the plots left out of a public page under DP
  std::string state;                  // running, finished, failed, ... as the header says it
};

StatusOr<Report> RenderReport(const std::string& out_dir, const ReportOptions& options);

// The page of outputs already read (RenderReport = ReadJobOutputs + this).
StatusOr<Report> RenderReportPage(const JobOutputs& outputs, const ReportOptions& options);

}  // namespace huddle::report
