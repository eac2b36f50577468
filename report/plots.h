// The report's plots of one job (report/report.h), built from its outputs (report/job_outputs.h).
//
// Federated jobs, per round: test accuracy, test loss, round duration, participation, traffic
// and, under DP, the epsilon spent against the budget and the epsilon each round spent, with the
// privacy schedule's runs of rounds shaded. Datacenter jobs, per epoch: test accuracy and loss,
// training accuracy and loss, time per step and, under DP-SGD, the same two privacy plots.
//
// The DP rule: under DP a plot drawn from operator-only values (operator_metrics.jsonl,
// participation.jsonl where the rows count no cohort) is built only for the operator's view and is
// marked operator_only; in the public view it is listed in `left_out` with the reason instead. A
// public plot reads only the public file (metrics.jsonl), so no operator-only value can reach it.
//
// Thread-safety: stateless functions.
#pragma once

#include <string>
#include <vector>

#include "report/job_outputs.h"
#include "report/svg_plot.h"

namespace huddle::report {

struct PlotEntry {
  PlotSpec spec;
  bool operator_only = false;  // under DP: computed without noise, shown to the operator only
  std::string caption;         // what the plot shows and where its values come from
};

struct LeftOutPlot {
  std::string title;
  std::string why;
};

struct Plots {
  std::vector<PlotEntry> shown;
  std::vector<LeftOutPlot> left_out;
};

Plots BuildPlots(const JobOutputs& outputs, bool operator_view);

// The privacy schedule's runs of rounds (or epochs) from privacy.json: `noise_schedule` (the
// plan) where present, else `releases` (what the ledger recorded). Labels such as
// "rounds 5-8: z 1.784, C 0.5".
std::vector<Band> ScheduleBands(const JobOutputs& outputs);

}  // namespace huddle::report
