#include "report/report.h"

#include <filesystem>
#include <set>

#include "report/format.h"
#include "report/plots.h"

namespace huddle::report {
namespace {

using nlohmann::json;

constexpr char kStyle[] = R"(
body { font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; margin: 20px;
       color: #222; background: #fafafa; }
h1 { font-size: 22px; margin: 0 0 12px 0; }
table.facts { border-collapse: collapse; margin-bottom: 12px; font-size: 14px; }
table.facts th { text-align: left; padding: 3px 14px 3px 0; vertical-align: top; white-space: nowrap; }
table.facts td { padding: 3px 0; }
tr.operator-only td, tr.operator-only th { color: #a00018; }
.note { max-width: 1150px; padding: 8px 12px; margin: 8px 0; border-left: 4px solid #888;
        background: #fff; font-size: 14px; }
.note.running { border-color: #1f77b4; }
.note.left-out { border-color: #c78a00; }
.banner { max-width: 1150px; padding: 10px 14px; margin: 8px 0; font-weight: bold;
          color: #fff; background: #a00018; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; margin-top: 16px; }
figure { margin: 0; padding: 8px; background: #fff; border: 1px solid #d0d0d0; width: 540px; }
figure.operator-only { border: 2px solid #a00018; }
.op-label { color: #a00018; font-weight: bold; font-size: 13px; margin-bottom: 4px; }
figcaption { font-size: 12px; color: #555; margin-top: 4px; }
svg text { font-family: inherit; }
svg text.title { font-size: 14px; font-weight: bold; fill: #222; }
svg text.tick, svg text.legend { font-size: 11px; fill: #333; }
svg text.axis-label { font-size: 12px; fill: #333; }
svg text.band-label { font-size: 10px; fill: #555; }
svg text.ref-label { font-size: 11px; }
svg text.empty-text { font-size: 14px; fill: #777; }
footer { margin-top: 20px; font-size: 12px; color: #777; }
)";

struct Fact {
  std::string label;
  std::string text;
  bool operator_only = false;
};

std::string Str(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

std::optional<double> Num(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// object[key] when it is an object, else an empty object (never inserts, never throws).
const json& Sub(const json& object, const char* key) {
  static const json kEmpty = json::object();
  auto it = object.find(key);
  return it != object.end() && it->is_object() ? *it : kEmpty;
}

std::string Value(double v, ValueFormat f = ValueFormat::kNumber) { return FormatValue(v, f); }

std::string JobName(const JobOutputs& o, const ReportOptions& options) {
  if (!options.job_name.empty()) return options.job_name;
  for (const auto* file : {&o.summary, &o.privacy, &o.record}) {
    if (*file) {
      const std::string key = file == &o.record ? "name" : "job";
      if (std::string name = Str(**file, key.c_str()); !name.empty()) return name;
    }
  }
  std::filesystem::path dir = std::filesystem::path(o.dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  return dir.filename().string();
}

// The job's state as the header says it, and whether it is running.
std::pair<std::string, bool> State(const JobOutputs& o, const ReportOptions& options,
                                   const std::string& progress) {
  const json none = json::object();
  const json& summary = o.summary ? *o.summary : none;
  std::string state = options.state;
  std::string reason = options.state_reason;
  if (state.empty() && o.record) {
    state = Str(*o.record, "state");
    reason = Str(*o.record, "reason");
  }
  // Under DP whether a job failed (no update accepted in the run) is a count of results, for the
  // operator only: the public page says "finished" either way, and does not even look.
  const bool public_dp = o.dp && !options.operator_view;
  if (state.empty()) {
    const bool failed =
        summary.contains("failed") || (!public_dp && Sub(summary, "operator").contains("failed"));
    state = !o.summary ? "running" : failed ? "failed" : "completed";
    if (failed) {
      reason = o.dp ? Str(Sub(summary, "operator"), "failed") : Str(summary, "failed");
    }
  }
  if (state == "running") return {"running: " + progress + " so far", true};
  if (state == "queued") return {"queued (not started yet)", false};
  if (state == "completed" || (state == "failed" && public_dp)) {
    std::string s = "finished: " + progress;
    if (std::string early = Str(summary, "stopped_early"); !early.empty()) {
      s += " (stopped early: " + early + ")";
    }
    return {s, false};
  }
  return {state + ": " + progress + (reason.empty() ? "" : " (" + reason + ")"), false};
}

std::string PrivacyText(const JobOutputs& o) {
  if (!o.dp) return "none";
  const json none = json::object();
  const json& p = o.privacy ? *o.privacy : none;
  std::string mode;
  for (const Row& r : o.metrics.rows) {
    if (auto it = r.strings.find("privacy.mode"); it != r.strings.end()) mode = it->second;
  }
  std::string text;
  if (o.datacenter) {
    text = "example-level DP-SGD across the ranks";
  } else if (p.contains("epsilon_kept_by")) {
    text = "example-level DP-SGD in the clients (each client keeps its own epsilon)";
  } else if (!mode.empty()) {
    text = "client-level DP-FedAvg, " + mode + " noise";
  } else {
    text = "differential privacy (" + Str(p, "unit_of_privacy") + " level)";
  }
  if (std::string a = Str(p, "accountant"); !a.empty()) text += "; accountant " + a;
  if (auto d = Num(p, "delta")) text += "; delta " + Value(*d);
  if (auto b = Num(p, "budget_epsilon")) text += "; budget epsilon " + Value(*b);
  if (auto e = Num(p, "epsilon")) text += "; spent " + Value(*e);
  if (auto planned = Num(p, "planned_epsilon"))
    text += " (all planned rounds: " + Value(*planned) + ")";
  if (const auto it = p.find("private"); it != p.end() && *it == false) {
    text += "; NOT PRIVATE";
    if (auto why = p.find("not_private_because"); why != p.end() && why->is_array()) {
      for (const json& w : *why) {
        if (w.is_string()) text += ": " + w.get<std::string>();
      }
    }
  }
  return text;
}

std::vector<Fact> Facts(const JobOutputs& o, const ReportOptions& options, const std::string& name,
                        const std::string& state) {
  const json none = json::object();
  const json& summary = o.summary ? *o.summary : none;
  std::vector<Fact> facts;
  facts.push_back({"Job", name});
  const json& training = Sub(summary, "training");
  const bool async = o.async;
  const bool virtual_clock = o.virtual_clock;
  std::string mode = o.datacenter ? "datacenter (per epoch)"
                     : async      ? "federated, buffered asynchronous (per server step)"
                                  : "federated (per round)";
  if (async) {
    if (auto c = Num(training, "concurrency")) mode += ": concurrency " + Value(*c);
    if (auto k = Num(training, "buffer")) mode += ", buffer " + Value(*k);
  }
  if (virtual_clock) mode += "; simulated on a virtual clock";
  if (auto w = Num(summary, "world_size")) {
    mode = "datacenter: " + Value(*w) + " ranks" +
           (Str(summary, "backend").empty() ? "" : " (" + Str(summary, "backend") + ")");
  }
  facts.push_back({"Mode", mode});
  facts.push_back({"State", state});
  if (!o.datacenter) {
    std::string secagg = o.metrics.rows.empty() && !o.summary ? "not known yet" : "off";
    for (const Row& r : o.metrics.rows) {
      if (r.Get("secure_aggregation.enabled").value_or(0) > 0) {
        secagg = "on";
        if (auto m = r.Get("secure_aggregation.members")) secagg += ": " + Value(*m) + " members";
        if (auto t = r.Get("secure_aggregation.threshold")) secagg += ", threshold " + Value(*t);
      }
    }
    if (summary.contains("secure_aggregation") && secagg == "off") secagg = "on";
    facts.push_back({"Secure aggregation", secagg});
  }
  facts.push_back({"Differential privacy", PrivacyText(o)});
  std::string model = o.model_config;
  if (o.model) {
    model += std::string(model.empty() ? "" : "; ") +
             "model.bin: " + Value(static_cast<double>(o.model->tensors), ValueFormat::kInteger) +
             " tensors, " + Value(static_cast<double>(o.model->parameters), ValueFormat::kInteger) +
             " parameters";
  }
  facts.push_back(
      {"Model", model.empty() ? "not known yet (model.bin is written at the end)" : model});
  if (auto acc = Num(summary, "final_test_accuracy")) {
    std::string text = Value(*acc, ValueFormat::kPercent);
    if (auto best = Num(summary, "best_test_accuracy")) {
      text += " (best " + Value(*best, ValueFormat::kPercent);
      if (auto r = Num(summary, "best_round")) {
        text += std::string(async ? " at step " : " at round ") + Value(*r);
      }
      text += ")";
    }
    facts.push_back({"Final test accuracy", text});
  }
  // Totals: public without DP; under DP in summary.json's `operator` object.
  const bool dp = o.dp;
  if (!dp || options.operator_view) {
    const json& totals = dp ? Sub(summary, "operator") : summary;
    std::string text;
    for (const char* key : {"elapsed_s", "seconds_this_session"}) {
      if (auto s = Num(totals, key)) {
        text += Value(*s, ValueFormat::kSeconds) +
                (virtual_clock ? " of virtual time (simulated)" : " of wall time");
      }
    }
    if (auto in = Num(totals, "bytes_in")) text += "; " + Value(*in, ValueFormat::kBytes) + " in";
    if (auto out = Num(totals, "bytes_out")) {
      text += ", " + Value(*out, ValueFormat::kBytes) + " out";
    }
    if (auto r = Num(totals, "bytes_reduced")) {
      text += "; " + Value(*r, ValueFormat::kBytes) + " all-reduced";
    }
    if (!text.empty()) {
      facts.push_back({"Totals", dp ? std::string(kOperatorOnlyLabel) + ": " + text : text, dp});
    }
  }
  facts.push_back({"Build", "huddle " + options.build});
  facts.push_back({"Report made", options.generated_at});
  if (!options.source.empty()) facts.push_back({"Outputs read", options.source});
  return facts;
}

std::string Progress(const JobOutputs& o) {
  std::set<double> xs;
  for (const Row& r : o.metrics.rows) xs.insert(r.x);
  const std::string unit = o.unit();
  std::string text = std::to_string(xs.size()) + " " + unit + (xs.size() == 1 ? "" : "s");
  std::optional<double> planned;
  if (o.privacy) planned = Num(Sub(*o.privacy, "rounds"), "planned");
  if (!planned && o.summary && !o.datacenter) planned = Num(*o.summary, "rounds");
  if (planned) text += " of " + Value(*planned) + " planned";
  return text;
}

}  // namespace

StatusOr<Report> RenderReportPage(const JobOutputs& o, const ReportOptions& options) {
  Report report;
  report.dp = o.dp;
  const std::string name = JobName(o, options);
  const auto [state, running] = State(o, options, Progress(o));
  report.state = state;
  const Plots plots = BuildPlots(o, options.operator_view);

  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'\">\n<title>Huddle report: " +
      EscapeText(name, 200) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  html += "<h1>Huddle report: " + EscapeText(name, 200) + "</h1>\n";
  for (const PlotEntry& p : plots.shown) report.holds_operator_only |= p.operator_only;
  const std::vector<Fact> facts = Facts(o, options, name, state);
  for (const Fact& f : facts) report.holds_operator_only |= f.operator_only;
  if (report.holds_operator_only) {
    html += "<div class=\"banner\">This page holds operator-only values: each is marked " +
            std::string(kOperatorOnlyLabel) +
            ". They are computed from the private data without noise and are not covered by "
            "the job's DP guarantee.</div>\n";
  }
  html += "<table class=\"facts\">\n";
  for (const Fact& f : facts) {
    html += std::string(f.operator_only ? "<tr class=\"operator-only\">" : "<tr>") + "<th>" +
            EscapeText(f.label) + "</th><td>" + EscapeText(f.text) + "</td></tr>\n";
  }
  html += "</table>\n";
  if (running) {
    std::string partial;
    for (const auto& [file, rows] : {std::pair{"metrics.jsonl", &o.metrics},
                                     std::pair{"operator_metrics.jsonl", &o.operator_metrics},
                                     std::pair{"participation.jsonl", &o.participation}}) {
      if (rows->partial_last_line) partial += std::string(partial.empty() ? "" : ", ") + file;
    }
    html +=
        "<p class=\"note running\">This job is running: the page shows it as its files "
        "stood when the page was made. Plots without data yet say so.";
    if (!partial.empty()) {
      html += " A row being written (the last line of " + EscapeText(partial) + ") is left out.";
    }
    html += " Make the report again for newer " + std::string(o.datacenter ? "epochs" : "rounds") +
            ".</p>\n";
  }
  if (o.dp && !plots.left_out.empty()) {
    html += "<div class=\"note left-out\"><strong>Left out of this page:</strong><ul>\n";
    for (const LeftOutPlot& l : plots.left_out) {
      html += "<li>" + EscapeText(l.title) + ": " + EscapeText(l.why) + ".</li>\n";
      report.left_out.push_back(l.title);
    }
    html +=
        "</ul>Every value on this page is DP-protected or fixed by the job's configuration. "
        "<code>huddle report --operator</code> draws the plots left out, each marked " +
        std::string(kOperatorOnlyLabel) + ", for the operator's own use.</div>\n";
  }
  html += "<div class=\"plots\">\n";
  for (const PlotEntry& p : plots.shown) {
    html += "<figure class=\"plot" + std::string(p.operator_only ? " operator-only" : "") +
            "\" data-plot=\"" + EscapeText(p.spec.id, 40) + "\">\n";
    if (p.operator_only) {
      html += "<div class=\"op-label\">" + std::string(kOperatorOnlyLabel) + "</div>\n";
    }
    html += RenderSvgPlot(p.spec) + "\n<figcaption>" + EscapeText(p.caption) +
            "</figcaption>\n</figure>\n";
  }
  html += "</div>\n<footer>Made by <code>huddle report</code> (" + EscapeText(options.build) +
          "). A self-contained page: no scripts, and nothing loaded from elsewhere.</footer>\n"
          "</body>\n</html>\n";
  if (html.size() > kMaxReportBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the report of ", o.dir, " would be ",
                                                     html.size(), " bytes, past the bound of ",
                                                     kMaxReportBytes));
  }
  report.html = std::move(html);
  return report;
}

StatusOr<Report> RenderReport(const std::string& out_dir, const ReportOptions& options) {
  // Every read is checked before use; this is the boundary that keeps a value the checks missed
  // (a JSON type error, memory) from ending the caller: the service renders on its own thread.
  try {
    HUDDLE_ASSIGN_OR_RETURN(const JobOutputs outputs,
                            ReadJobOutputs(out_dir, options.operator_view, options.limits));
    return RenderReportPage(outputs, options);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("the report of ", out_dir, ": ", e.what()));
  }
}

}  // namespace huddle::report
