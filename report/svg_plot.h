// One line plot as an inline SVG element, for the report page (report/report.h).
//
// A plot is a title, a legend, axes with tick labels at "nice" numbers (1, 2, 2.5 or 5 times a
// power of ten, in the axis' format: percent, seconds, bytes in binary units), its series (lines,
// or steps, each in its own colour, with a marker and a tooltip for every point when a series has
// at most kMarkerLimit points), horizontal reference lines (a budget) and shaded x ranges (the
// runs of a privacy schedule), each labelled. A series longer than PlotSpec::max_points is thinned
// to at most that many points (its last point always kept), so a plot's size is bounded whatever
// the job's length. Every text is escaped (report/format.h); the SVG references nothing outside
// itself.
//
// The page's structure is a contract its tests read: the <svg> has class "plot-svg", each series
// is a <g class="series" data-series="NAME"> holding its <path> (and markers), and a plot without
// any point draws its frame and `empty_text` instead (class "plot-svg empty", no series group).
//
// Thread-safety: stateless functions.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "report/format.h"

namespace huddle::report {

inline constexpr size_t kMarkerLimit = 40;

struct Series {
  std::string name;   // the legend's text
  std::string color;  // a CSS colour: one of the page's own constants, never a file's text
  std::vector<std::pair<double, double>> points;  // (x, y) in increasing x; non-finite skipped
  bool step = false;    // drawn as steps centred on each x (a value that holds for its round)
  bool dashed = false;  // a dashed line
};

struct ReferenceLine {
  double y = 0;
  std::string label;
  std::string color;
};

struct Band {
  double x0 = 0;  // first and last x of the range, inclusive (rounds 5 to 8: 5, 8)
  double x1 = 0;
  std::string label;
};

struct PlotSpec {
  std::string id;     // data-plot of the figure: [a-z0-9_-] only (the page's own names)
  std::string title;  // text, escaped when drawn
  std::string x_label;
  std::string y_label;
  ValueFormat y_format = ValueFormat::kNumber;
  bool y_from_zero = true;  // the y axis starts at 0 (counts, bytes, times); else fits the data
  bool y_max_one = false;   // the y axis ends at most at 1 (fractions: accuracy)
  std::vector<Series> series;
  std::vector<ReferenceLine> lines;
  std::vector<Band> bands;
  std::string empty_text = "no data yet";
  size_t max_points = 2000;  // per series
  int width = 540;
  int height = 300;
};

// The <svg> element of `plot` (one line of markup per element; no XML declaration).
std::string RenderSvgPlot(const PlotSpec& plot);

// Whether any series of `plot` has a finite point.
bool HasData(const PlotSpec& plot);

// Ticks for an axis over [lo, hi]: about `target` ticks `step` apart at nice numbers (1, 2, 2.5,
// 5 x 10^k; at least `min_step`), from the largest multiple of step <= lo to the smallest >= hi.
// lo == hi is widened first. The axis' limits are the first and last tick.
struct Ticks {
  double step = 1;
  std::vector<double> values;
};
Ticks NiceTicks(double lo, double hi, int target, double min_step = 0);

}  // namespace huddle::report
