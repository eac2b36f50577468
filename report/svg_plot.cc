#include "report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace huddle::report {
namespace {

constexpr int kLeft = 72;  // room for the y tick labels and the y label
constexpr int kRight = 18;
constexpr int kBottom = 46;  // x tick labels and the x label
constexpr int kLegendRow = 16;
constexpr double kCharWidth = 6.6;  // of the 11 px legend font, for laying the legend out

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// The finite points of a series, thinned to at most `max_points` (every k-th, the last kept).
std::vector<std::pair<double, double>> Drawn(const Series& s, size_t max_points) {
  std::vector<std::pair<double, double>> finite;
  for (const auto& p : s.points) {
    if (std::isfinite(p.first) && std::isfinite(p.second)) finite.push_back(p);
  }
  max_points = std::max<size_t>(max_points, 2);
  if (finite.size() <= max_points) return finite;
  const size_t stride = (finite.size() + max_points - 2) / (max_points - 1);
  std::vector<std::pair<double, double>> thinned;
  for (size_t i = 0; i < finite.size(); i += stride) thinned.push_back(finite[i]);
  if (thinned.back() != finite.back()) thinned.push_back(finite.back());
  return thinned;
}

struct LegendItem {
  std::string name;
  std::string color;
  bool dashed = false;
  double x = 0;
  int row = 0;
};

// Lays the legend out in rows that fit `width`; returns the number of rows.
int LayOutLegend(std::vector<LegendItem>& items, int width) {
  double x = 8;
  int row = 0;
  for (LegendItem& item : items) {
    const double w = 30 + kCharWidth * static_cast<double>(std::min<size_t>(item.name.size(), 60));
    if (x + w > width - 8 && x > 8) {
      ++row;
      x = 8;
    }
    item.x = x;
    item.row = row;
    x += w + 10;
  }
  return items.empty() ? 0 : row + 1;
}

}  // namespace

Ticks NiceTicks(double lo, double hi, int target, double min_step) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  if (hi - lo <= std::fabs(hi) * 1e-12) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo = lo == 0 ? 0 : lo - pad;
    hi = hi + pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double frac = raw / mag;
  double nice = frac <= 1 ? 1 : frac <= 2 ? 2 : frac <= 2.5 ? 2.5 : frac <= 5 ? 5 : 10;
  // An integer axis (rounds, epochs) never gets a step of 2.5.
  if (min_step >= 1 && nice == 2.5 && mag < 10) nice = 5;
  Ticks t;
  t.step = std::max(nice * mag, min_step);
  const double first = std::floor(lo / t.step + 1e-9) * t.step;
  const double last = std::ceil(hi / t.step - 1e-9) * t.step;
  for (int i = 0; i <= 200; ++i) {
    const double v = first + i * t.step;
    t.values.push_back(v);
    if (v >= last - t.step * 1e-9) break;
  }
  return t;
}

bool HasData(const PlotSpec& plot) {
  for (const Series& s : plot.series) {
    for (const auto& p : s.points) {
      if (std::isfinite(p.first) && std::isfinite(p.second)) return true;
    }
  }
  return false;
}

std::string RenderSvgPlot(const PlotSpec& plot) {
  const int w = plot.width;
  const int h = plot.height;
  std::vector<LegendItem> legend;
  for (const Series& s : plot.series) legend.push_back({s.name, s.color, s.dashed});
  for (const ReferenceLine& l : plot.lines) legend.push_back({l.label, l.color, true});
  const bool has_data = HasData(plot);
  const int legend_rows = has_data ? LayOutLegend(legend, w) : 0;
  const int top = 30 + legend_rows * kLegendRow + 8;
  const int bottom = h - kBottom;
  const int left = kLeft;
  const int right = w - kRight;

  std::string svg = "<svg class=\"plot-svg" + std::string(has_data ? "" : " empty") +
                    "\" width=\"" + std::to_string(w) + "\" height=\"" + std::to_string(h) +
                    "\" viewBox=\"0 0 " + std::to_string(w) + " " + std::to_string(h) +
                    "\" role=\"img\">\n";
  svg += "<title>" + EscapeText(plot.title) + "</title>\n";
  svg += "<rect x=\"0\" y=\"0\" width=\"" + std::to_string(w) + "\" height=\"" + std::to_string(h) +
         "\" fill=\"#ffffff\"/>\n";
  svg += "<text x=\"8\" y=\"19\" class=\"title\">" + EscapeText(plot.title, 200) + "</text>\n";
  const std::string frame = "<rect x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(top) +
                            "\" width=\"" + std::to_string(right - left) + "\" height=\"" +
                            std::to_string(bottom - top) +
                            "\" fill=\"none\" stroke=\"#9a9a9a\"/>\n";
  if (!has_data) {
    svg += frame;
    svg += "<text x=\"" + Num((left + right) / 2.0) + "\" y=\"" + Num((top + bottom) / 2.0) +
           "\" text-anchor=\"middle\" class=\"empty-text\">" + EscapeText(plot.empty_text, 300) +
           "</text>\n</svg>";
    return svg;
  }

  // The ranges: every drawn point, reference line and band.
  std::vector<std::vector<std::pair<double, double>>> drawn;
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  bool any_step = false;
  for (const Series& s : plot.series) {
    drawn.push_back(Drawn(s, plot.max_points));
    any_step = any_step || s.step;
    for (const auto& [x, y] : drawn.back()) {
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
  }
  for (const ReferenceLine& l : plot.lines) {
    if (std::isfinite(l.y)) y_lo = std::min(y_lo, l.y), y_hi = std::max(y_hi, l.y);
  }
  for (const Band& b : plot.bands) {
    if (std::isfinite(b.x0) && std::isfinite(b.x1)) {
      x_lo = std::min(x_lo, b.x0), x_hi = std::max(x_hi, b.x1);
    }
  }
  if (any_step || !plot.bands.empty()) x_lo -= 0.5, x_hi += 0.5;
  if (plot.y_from_zero) {
    y_lo = std::min(y_lo, 0.0);
  } else {
    const double pad = (y_hi - y_lo) * 0.05;
    y_lo -= pad;
    y_hi += pad;
  }
  if (plot.y_max_one) y_hi = std::min(y_hi, 1.0), y_lo = std::min(y_lo, y_hi);
  // The x axis spans the rounds drawn (ticks at nice rounds inside it); the y axis ends at ticks.
  if (x_hi - x_lo < 1) x_lo -= 0.5, x_hi += 0.5;
  const double x0 = x_lo, x1 = x_hi;
  Ticks xt = NiceTicks(x_lo, x_hi, 7, 1);
  std::erase_if(xt.values, [&](double v) { return v < x0 - 1e-9 || v > x1 + 1e-9; });
  // Bytes tick at nice numbers of their unit (5 MiB, not 5,000,000 B); the unit is the data's.
  const double y_scale = std::max(std::fabs(y_lo), std::fabs(y_hi));
  const double unit = plot.y_format == ValueFormat::kBytes ? ByteUnitFor(y_scale).size : 1;
  Ticks yt = NiceTicks(y_lo / unit, y_hi / unit, 5);
  yt.step *= unit;
  for (double& v : yt.values) v *= unit;
  const double y0 = yt.values.front(), y1 = yt.values.back();
  const auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * (right - left); };
  const auto Y = [&](double y) { return bottom - (y - y0) / (y1 - y0) * (bottom - top); };
  const double x_scale = std::max(std::fabs(x0), std::fabs(x1));

  // Legend: a swatch and the name of every series and reference line.
  for (const LegendItem& item : legend) {
    const double ly = 36 + item.row * kLegendRow;
    svg += "<line x1=\"" + Num(item.x) + "\" y1=\"" + Num(ly - 4) + "\" x2=\"" + Num(item.x + 22) +
           "\" y2=\"" + Num(ly - 4) + "\" stroke=\"" + item.color + "\" stroke-width=\"3\"" +
           (item.dashed ? " stroke-dasharray=\"6 3\"" : "") + "/>";
    svg += "<text x=\"" + Num(item.x + 28) + "\" y=\"" + Num(ly) + "\" class=\"legend\">" +
           EscapeText(item.name, 60) + "</text>\n";
  }
  // Bands (a privacy schedule's runs), under everything else.
  for (size_t i = 0; i < plot.bands.size(); ++i) {
    const Band& b = plot.bands[i];
    const double bx0 = std::max<double>(left, X(b.x0 - 0.5));
    const double bx1 = std::min<double>(right, X(b.x1 + 0.5));
    if (!(bx1 > bx0)) continue;
    svg += "<rect class=\"band\" x=\"" + Num(bx0) + "\" y=\"" + std::to_string(top) +
           "\" width=\"" + Num(bx1 - bx0) + "\" height=\"" + std::to_string(bottom - top) +
           "\" fill=\"" + (i % 2 == 0 ? "#e8f0fb" : "#fbf1df") + "\"/>";
    if (i > 0) {
      svg += "<line x1=\"" + Num(bx0) + "\" y1=\"" + std::to_string(top) + "\" x2=\"" + Num(bx0) +
             "\" y2=\"" + std::to_string(bottom) +
             "\" stroke=\"#7a7a7a\" stroke-dasharray=\"2 3\"/>";
    }
    const size_t fits = static_cast<size_t>(std::max(0.0, (bx1 - bx0 - 6) / 5.6));
    if (fits >= 4) {
      svg += "<text x=\"" + Num(bx0 + 3) + "\" y=\"" + std::to_string(top + 11) +
             "\" class=\"band-label\">" + EscapeText(b.label, fits) + "</text>";
    }
    svg += "\n";
  }
  // Grid and ticks.
  for (double v : yt.values) {
    svg += "<line x1=\"" + std::to_string(left) + "\" y1=\"" + Num(Y(v)) + "\" x2=\"" +
           std::to_string(right) + "\" y2=\"" + Num(Y(v)) + "\" stroke=\"#e4e4e4\"/>";
    svg += "<text x=\"" + std::to_string(left - 6) + "\" y=\"" + Num(Y(v) + 4) +
           "\" text-anchor=\"end\" class=\"tick\">" +
           FormatTick(v, yt.step, y_scale, plot.y_format) + "</text>\n";
  }
  for (double v : xt.values) {
    svg += "<line x1=\"" + Num(X(v)) + "\" y1=\"" + std::to_string(bottom) + "\" x2=\"" +
           Num(X(v)) + "\" y2=\"" + std::to_string(bottom + 4) + "\" stroke=\"#555555\"/>";
    svg += "<text x=\"" + Num(X(v)) + "\" y=\"" + std::to_string(bottom + 16) +
           "\" text-anchor=\"middle\" class=\"tick\">" +
           FormatTick(v, xt.step, x_scale, ValueFormat::kNumber) + "</text>\n";
  }
  svg += frame;
  svg += "<text x=\"" + Num((left + right) / 2.0) + "\" y=\"" + std::to_string(h - 8) +
         "\" text-anchor=\"middle\" class=\"axis-label\">" + EscapeText(plot.x_label, 80) +
         "</text>\n";
  svg += "<text transform=\"translate(14 " + Num((top + bottom) / 2.0) +
         ") rotate(-90)\" text-anchor=\"middle\" class=\"axis-label\">" +
         EscapeText(plot.y_label, 80) + "</text>\n";
  // Reference lines (a budget), labelled at their right end.
  for (const ReferenceLine& l : plot.lines) {
    if (!std::isfinite(l.y)) continue;
    svg += "<line class=\"ref\" x1=\"" + std::to_string(left) + "\" y1=\"" + Num(Y(l.y)) +
           "\" x2=\"" + std::to_string(right) + "\" y2=\"" + Num(Y(l.y)) + "\" stroke=\"" +
           l.color + "\" stroke-width=\"1.5\" stroke-dasharray=\"6 3\"/>";
    svg += "<text x=\"" + std::to_string(right - 4) + "\" y=\"" + Num(Y(l.y) - 4) +
           "\" text-anchor=\"end\" class=\"ref-label\" fill=\"" + l.color + "\">" +
           EscapeText(l.label, 60) + " " + FormatValue(l.y, plot.y_format) + "</text>\n";
  }
  // The series.
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const Series& s = plot.series[i];
    const auto& points = drawn[i];
    if (points.empty()) continue;
    std::string d;
    d.reserve(points.size() * 14);
    for (size_t k = 0; k < points.size(); ++k) {
      const auto& [x, y] = points[k];
      if (s.step) {
        d += (k == 0 ? "M" + Num(X(x - 0.5)) + " " + Num(Y(y)) : "V" + Num(Y(y))) + "H" +
             Num(X(x + 0.5));
      } else {
        d += (k == 0 ? "M" : "L") + Num(X(x)) + " " + Num(Y(y));
      }
    }
    // Earlier series are drawn wider, so that one a later series covers (equal counts) still
    // shows at its edges.
    const double wider = plot.series.size() > 1 ? static_cast<double>(plot.series.size() - 1 - i) /
                                                      static_cast<double>(plot.series.size() - 1)
                                                : 0;
    svg += "<g class=\"series\" data-series=\"" + EscapeText(s.name, 60) + "\">";
    svg += "<path d=\"" + d + "\" fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"" +
           Num(2 + 3 * wider) + "\" stroke-linejoin=\"round\"" +
           (s.dashed ? " stroke-dasharray=\"6 3\"" : "") + "/>";
    if (points.size() <= kMarkerLimit) {
      for (const auto& [x, y] : points) {
        svg += "<circle class=\"marker\" cx=\"" + Num(X(x)) + "\" cy=\"" + Num(Y(y)) + "\" r=\"" +
               Num(3.2 + 2.5 * wider) + "\" fill=\"" + s.color + "\"><title>" +
               EscapeText(s.name, 60) + ", " + EscapeText(plot.x_label, 40) + " " +
               FormatValue(x, ValueFormat::kNumber) + ": " + FormatValue(y, plot.y_format) +
               "</title></circle>";
      }
    }
    svg += "</g>\n";
  }
  svg += "</svg>";
  return svg;
}

}  // namespace huddle::report
