// Test helper: a report page (`huddle report`, report/report.h) as headless Chromium renders it.
//
// DrawnPlots loads the page in a harness, a copy of it with a script appended (and its
// Content-Security-Policy, which forbids scripts, taken out), that measures every plot as laid
// out: for each <figure class="plot"> the series its <svg> declares and how many of them have a
// non-empty rendered bounding box inside that <svg>; --dump-dom prints what the script wrote.
// Screenshot renders the page itself, as a reader's browser would.
//
// Debian's `chromium` package; ChromiumPath() is "" without it (tests skip, naming the package).
#pragma once

#include <string>
#include <vector>

namespace huddle::testing {

std::string ChromiumPath();

struct PlotDrawn {
  std::string id;      // the figure's data-plot
  int series = 0;      // <g class="series"> in its <svg>
  int drawn = 0;       // of them, with a non-empty box inside the <svg>
  bool empty = false;  // the plot said it has no data
  double width = 0;    // the <svg> as laid out
  double height = 0;
};

// The plots of `page` as rendered; `error` says why there are none (Chromium failed, no result).
std::vector<PlotDrawn> DrawnPlots(const std::string& page, const std::string& work_dir,
                                  std::string* error);

// What a page should show: each plot's id and its number of series, in order.
using ExpectedPlots = std::vector<std::pair<std::string, int>>;
// The ids of the plots that are not as `expected`: missing, unexpected, with another number of
// series, or that did not draw each of them (or said they have no data). Empty: all drew.
std::vector<std::string> PlotsNotDrawn(const std::vector<PlotDrawn>& plots,
                                       const ExpectedPlots& expected);

// A PNG of `page` at 1200 x `height` pixels; false (and `error`) when Chromium made none.
bool Screenshot(const std::string& page, const std::string& png, int height,
                const std::string& work_dir, std::string* error);

}  // namespace huddle::testing
