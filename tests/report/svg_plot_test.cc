// The plot's pieces: nice ticks, tick labels in each axis' unit, escaping, thinning, and the
// markup the page's structure promises (report/svg_plot.h).
#include "report/svg_plot.h"

#include <gtest/gtest.h>

namespace huddle::report {
namespace {

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(SvgPlotTest, TicksFallOnNiceNumbers) {
  Ticks t = NiceTicks(0, 0.87, 5);
  EXPECT_DOUBLE_EQ(t.step, 0.2);
  EXPECT_EQ(t.values, (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0}));
  t = NiceTicks(1, 30, 7, 1);
  EXPECT_DOUBLE_EQ(t.step, 5);
  EXPECT_DOUBLE_EQ(NiceTicks(1, 12, 5).step, 2.5);
  EXPECT_DOUBLE_EQ(NiceTicks(1, 12, 5, 1).step, 5) << "an integer axis never steps by 2.5";
  t = NiceTicks(0, 19549104, 5);
  EXPECT_DOUBLE_EQ(t.step, 5e6);
  t = NiceTicks(3, 3, 5);  // one value: widened
  EXPECT_GT(t.values.size(), 1u);
  t = NiceTicks(0, 0, 5);
  EXPECT_EQ(t.values.front(), 0);
  EXPECT_EQ(t.values.back(), 1);
}

TEST(SvgPlotTest, NumbersAreWrittenInTheirUnits) {
  EXPECT_EQ(FormatValue(987654321, ValueFormat::kBytes), "941.9 MiB");
  EXPECT_EQ(FormatValue(512, ValueFormat::kBytes), "512 B");
  EXPECT_EQ(FormatValue(0.8523, ValueFormat::kPercent), "85.23%");
  EXPECT_EQ(FormatValue(0.25, ValueFormat::kSeconds), "250 ms");
  EXPECT_EQ(FormatValue(5432.1, ValueFormat::kSeconds), "5,432 s");
  EXPECT_EQ(FormatValue(4321, ValueFormat::kInteger), "4,321");
  EXPECT_EQ(FormatValue(1.560868, ValueFormat::kNumber), "1.561");
  EXPECT_EQ(FormatValue(123456, ValueFormat::kNumber), "123.5k");
  EXPECT_EQ(FormatTick(0.85, 0.05, 1, ValueFormat::kPercent), "85%");
  EXPECT_EQ(FormatTick(0.25, 0.25, 1.5, ValueFormat::kNumber), "0.25");
  EXPECT_EQ(FormatTick(15 << 20, 5 << 20, 20 << 20, ValueFormat::kBytes), "15 MiB");
  EXPECT_EQ(FormatTick(0.05, 0.05, 0.2, ValueFormat::kSeconds), "50 ms");
  EXPECT_EQ(FormatTick(-1e-17, 0.2, 1, ValueFormat::kNumber), "0.0") << "never -0";
  EXPECT_EQ(FormatTick(200000, 100000, 400000, ValueFormat::kNumber), "200k");
}

TEST(SvgPlotTest, TextIsEscapedAndBounded) {
  EXPECT_EQ(EscapeText("<a href='x'>&\"</a>"),
            "&lt;a href&#61;&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
  EXPECT_EQ(EscapeText("url(x) @import"), "url&#40;x&#41; &#64;import");
  EXPECT_EQ(EscapeText("bad\x01\xff"), "bad\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(EscapeText("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD") << "an overlong '/'";
  EXPECT_EQ(EscapeText("caf\xC3\xA9 \xE2\x80\x93"), "caf\xC3\xA9 \xE2\x80\x93");
  EXPECT_EQ(EscapeText(std::string(5000, 'a'), 10), std::string(10, 'a') + "\xE2\x80\xA6");
}

TEST(SvgPlotTest, APlotHasItsTitleLegendSeriesAndMarkers) {
  PlotSpec plot;
  plot.id = "p";
  plot.title = "Traffic <in>";
  plot.x_label = "round";
  plot.y_format = ValueFormat::kBytes;
  plot.series.push_back({"bytes in", "#1f77b4", {{1, 100}, {2, 2000}, {3, 3000}}});
  plot.series.push_back({"bytes out", "#ff7f0e", {{1, 50}, {2, NAN}, {3, 70}}});
  plot.lines.push_back({2500, "budget", "#d62728"});
  plot.bands.push_back({1, 2, "rounds 1-2"});
  const std::string svg = RenderSvgPlot(plot);
  EXPECT_EQ(svg.rfind("<svg class=\"plot-svg\"", 0), 0u) << svg;
  EXPECT_NE(svg.find("Traffic &lt;in&gt;"), std::string::npos);
  EXPECT_EQ(Count(svg, "<g class=\"series\""), 2u);
  EXPECT_EQ(Count(svg, "<circle class=\"marker\""), 5u) << "the NaN is not drawn";
  EXPECT_NE(svg.find("bytes in, round 2: 1.953 KiB"), std::string::npos);
  EXPECT_NE(svg.find("budget 2.441 KiB"), std::string::npos);
  EXPECT_EQ(Count(svg, "<rect class=\"band\""), 1u);
  EXPECT_EQ(svg.find("NaN"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST(SvgPlotTest, APlotWithoutDataSaysSo) {
  PlotSpec plot;
  plot.title = "Test accuracy";
  plot.series.push_back({"test accuracy", "#1f77b4", {{1, NAN}}});
  plot.empty_text = "no data <yet>";
  const std::string svg = RenderSvgPlot(plot);
  EXPECT_FALSE(HasData(plot));
  EXPECT_NE(svg.find("class=\"plot-svg empty\""), std::string::npos);
  EXPECT_NE(svg.find("no data &lt;yet&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<g class=\"series\""), std::string::npos);
}

TEST(SvgPlotTest, ALongSeriesIsThinnedKeepingItsLastPoint) {
  PlotSpec plot;
  plot.max_points = 100;
  Series s{"loss", "#1f77b4", {}};
  for (int i = 1; i <= 10000; ++i) s.points.push_back({double(i), 1.0 / i});
  plot.series.push_back(s);
  const std::string svg = RenderSvgPlot(plot);
  const size_t d = svg.find(" d=\"");
  const std::string path = svg.substr(d, svg.find('"', d + 4) - d);
  EXPECT_LE(Count(path, "L") + 1, 101u);
  EXPECT_GE(Count(path, "L") + 1, 90u);
  EXPECT_EQ(Count(svg, "<circle"), 0u);
  // The last point (round 10000) is the right end of the axis.
  PlotSpec last = plot;
  last.series[0].points.resize(9999);
  EXPECT_NE(RenderSvgPlot(last), svg);
}

}  // namespace
}  // namespace huddle::report
