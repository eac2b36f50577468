#include "tests/integration/report_check.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

constexpr char kCsp[] =
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src "
    "'unsafe-inline'\">";

// Measures each plot once the page is laid out, and writes the result into the DOM.
constexpr char kHarnessScript[] = R"(<script>
(function () {
  const out = [];
  for (const figure of document.querySelectorAll('figure.plot')) {
    const svg = figure.querySelector('svg.plot-svg');
    const box = svg ? svg.getBoundingClientRect() : {left: 0, right: 0, top: 0, bottom: 0,
                                                        width: 0, height: 0};
    const groups = svg ? svg.querySelectorAll('g.series') : [];
    let drawn = 0;
    for (const g of groups) {
      const r = g.getBoundingClientRect();
      const inside = r.right > box.left && r.left < box.right && r.bottom > box.top &&
                     r.top < box.bottom;
      if ((r.width > 0 || r.height > 0) && inside) drawn++;
    }
    out.push({id: figure.dataset.plot, series: groups.length, drawn: drawn,
              empty: !!svg && svg.classList.contains('empty'), width: box.width,
              height: box.height});
  }
  const pre = document.createElement('pre');
  pre.id = 'huddle-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>)";

std::string Unescape(std::string text) {
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"&quot;", "\""},
                                 {"&lt;", "<"},
                                 {"&gt;", ">"},
                                 {"&amp;", "&"}}) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + 1)) {
      text.replace(at, from.size(), to);
    }
  }
  return text;
}

Finished RunChromium(const std::vector<std::string>& args, const std::string& work_dir,
                     const std::string& log) {
  std::vector<std::string> argv = {
      ChromiumPath(),  "--headless",        "--no-sandbox",
      "--disable-gpu", "--hide-scrollbars", "--user-data-dir=" + work_dir + "/chromium-profile"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::filesystem::remove(log);
  return RunToEnd(argv, log, seconds(90));
}

}  // namespace

std::string ChromiumPath() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    for (const char* name : {"chromium", "chromium-browser"}) {
      const std::filesystem::path candidate = std::filesystem::path(dir) / name;
      std::error_code ec;
      if (std::filesystem::is_regular_file(candidate, ec)) return candidate.string();
    }
  }
  return "";
}

std::vector<PlotDrawn> DrawnPlots(const std::string& page, const std::string& work_dir,
                                  std::string* error) {
  std::string html = ReadAll(page);
  const size_t csp = html.find(kCsp);
  const size_t body = html.rfind("</body>");
  if (csp == std::string::npos || body == std::string::npos) {
    *error = page + " is not a report page (no Content-Security-Policy or </body>)";
    return {};
  }
  html.insert(body, kHarnessScript);
  html.erase(csp, std::string(kCsp).size());
  const std::string harness = work_dir + "/harness.html";
  WriteText(harness, html);
  const Finished f =
      RunChromium({"--dump-dom", "file://" + harness}, work_dir, work_dir + "/chromium-dom.log");
  const std::string open = "<pre id=\"huddle-check\">";
  const size_t at = f.log.find(open);
  if (f.exit_code != 0 || at == std::string::npos) {
    *error = "chromium --dump-dom exited " + std::to_string(f.exit_code) +
             " without the harness's result:\n" + f.log.substr(0, 4000);
    return {};
  }
  const size_t start = at + open.size();
  const nlohmann::json result = nlohmann::json::parse(
      Unescape(f.log.substr(start, f.log.find("</pre>", start) - start)), nullptr, false);
  if (!result.is_array()) {
    *error = "the harness's result is not a JSON array";
    return {};
  }
  std::vector<PlotDrawn> plots;
  for (const nlohmann::json& p : result) {
    plots.push_back({p.value("id", ""), p.value("series", 0), p.value("drawn", 0),
                     p.value("empty", false), p.value("width", 0.0), p.value("height", 0.0)});
  }
  return plots;
}

std::vector<std::string> PlotsNotDrawn(const std::vector<PlotDrawn>& plots,
                                       const ExpectedPlots& expected) {
  std::vector<std::string> ids;
  for (const auto& [id, series] : expected) {
    auto p =
        std::find_if(plots.begin(), plots.end(), [&](const PlotDrawn& d) { return d.id == id; });
    if (p == plots.end() || p->empty || p->series != series || p->drawn != p->series ||
        p->width <= 0 || p->height <= 0) {
      ids.push_back(id);
    }
  }
  for (const PlotDrawn& p : plots) {
    if (std::none_of(expected.begin(), expected.end(),
                     [&](const auto& e) { return e.first == p.id; })) {
      ids.push_back(p.id);
    }
  }
  return ids;
}

bool Screenshot(const std::string& page, const std::string& png, int height,
                const std::string& work_dir, std::string* error) {
  std::filesystem::remove(png);
  const Finished f = RunChromium(
      {"--screenshot=" + png, "--window-size=1200," + std::to_string(height), "file://" + page},
      work_dir, work_dir + "/chromium-shot.log");
  std::error_code ec;
  if (f.exit_code != 0 || std::filesystem::file_size(png, ec) < 1000) {
    *error = "chromium --screenshot exited " + std::to_string(f.exit_code) + ":\n" +
             f.log.substr(0, 4000);
    return false;
  }
  return ReadAll(png).rfind("\x89PNG\r\n\x1a\n", 0) == 0;
}

}  // namespace huddle::testing
