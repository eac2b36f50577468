#include "report/plots.h"

#include <cmath>
#include <map>

namespace huddle::report {
namespace {

using nlohmann::json;

constexpr char kBlue[] = "#1f77b4";
constexpr char kOrange[] = "#ff7f0e";
constexpr char kGreen[] = "#2ca02c";
constexpr char kRed[] = "#d62728";
constexpr char kPurple[] = "#9467bd";
constexpr char kBrown[] = "#8c564b";
constexpr char kGrey[] = "#555555";
constexpr size_t kMaxBands = 24;

// x -> value of `key` over `rows` (a later row of the same x replaces an earlier one).
std::map<double, double> ValuesOf(const std::vector<Row>& rows, const std::string& key) {
  std::map<double, double> values;
  for (const Row& r : rows) {
    if (std::optional<double> v = r.Get(key)) values[r.x] = *v;
  }
  return values;
}

Series Line(std::string name, const char* color, const std::map<double, double>& values) {
  Series s;
  s.name = std::move(name);
  s.color = color;
  s.points.assign(values.begin(), values.end());
  return s;
}

Series LineOf(const std::vector<Row>& rows, const std::string& key, std::string name,
              const char* color) {
  return Line(std::move(name), color, ValuesOf(rows, key));
}

// The sum of `keys` per row (rows holding at least one of them).
Series SumOf(const std::vector<Row>& rows, const std::vector<std::string>& keys, std::string name,
             const char* color) {
  std::map<double, double> values;
  for (const Row& r : rows) {
    bool any = false;
    double sum = 0;
    for (const std::string& k : keys) {
      if (std::optional<double> v = r.Get(k)) any = true, sum += *v;
    }
    if (any) values[r.x] = sum;
  }
  return Line(std::move(name), color, values);
}

// What each round (epoch) added to a running total: total(x) - total(x - 1), and total(1) for
// the first; a round whose predecessor has no row is left out.
std::map<double, double> Increments(const std::map<double, double>& totals) {
  std::map<double, double> out;
  for (const auto& [x, total] : totals) {
    if (x == 1) {
      out[x] = total;
    } else if (auto prev = totals.find(x - 1); prev != totals.end()) {
      out[x] = total - prev->second;
    }
  }
  return out;
}

std::optional<double> Number(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::string Short(double v) { return FormatValue(v, ValueFormat::kNumber); }

struct Segment {
  double first = 0, last = 0;
  std::optional<double> z, c, q;
};

std::vector<Band> Bands(std::vector<Segment> segments, const char* unit, bool merge_clip) {
  if (merge_clip) {
    std::vector<Segment> merged;
    for (const Segment& s : segments) {
      if (!merged.empty() && merged.back().z == s.z && merged.back().last + 1 == s.first) {
        merged.back().last = s.last;
        merged.back().c.reset();
      } else {
        merged.push_back(s);
      }
    }
    segments = std::move(merged);
  }
  std::vector<Band> bands;
  for (const Segment& s : segments) {
    Band b;
    b.x0 = s.first;
    b.x1 = s.last;
    b.label = std::string(unit) + " " + Short(s.first) +
              (s.last != s.first ? "\xE2\x80\x93" + Short(s.last) : "") + ":";
    if (s.z) b.label += " z " + Short(*s.z);
    b.label += s.c ? ", C " + Short(*s.c) : merge_clip ? ", C varies" : "";
    if (s.q) b.label += ", q " + Short(*s.q);
    bands.push_back(std::move(b));
  }
  return bands;
}

PlotSpec Spec(const char* id, std::string title, const std::string& unit, std::string y_label,
              ValueFormat format) {
  PlotSpec spec;
  spec.id = id;
  spec.title = std::move(title);
  spec.x_label = unit;
  spec.y_label = std::move(y_label);
  spec.y_format = format;
  return spec;
}

}  // namespace

std::vector<Band> ScheduleBands(const JobOutputs& o) {
  if (!o.privacy) return {};
  const json& p = *o.privacy;
  const char* list = p.contains("noise_schedule") ? "noise_schedule" : "releases";
  auto it = p.find(list);
  if (it == p.end() || !it->is_array()) return {};
  std::vector<Segment> segments;
  for (const json& run : *it) {
    if (!run.is_object()) continue;
    auto rounds = run.find("rounds");
    if (rounds == run.end() || !rounds->is_array() || rounds->size() != 2 ||
        !(*rounds)[0].is_number() || !(*rounds)[1].is_number()) {
      continue;
    }
    Segment s;
    s.first = (*rounds)[0].get<double>();
    s.last = (*rounds)[1].get<double>();
    if (!(s.last >= s.first) || !std::isfinite(s.last)) continue;
    s.z = Number(run, "noise_multiplier");
    s.c = Number(run, "clip_norm");
    if (o.datacenter) s.q = Number(run, "sampling_rate");
    segments.push_back(s);
  }
  const char* unit = o.datacenter ? "epochs" : "rounds";
  if (segments.size() <= kMaxBands) return Bands(segments, unit, false);
  std::vector<Band> merged = Bands(segments, unit, true);  // adaptive clipping: C every round
  if (merged.size() <= kMaxBands) return merged;
  return {};
}

Plots BuildPlots(const JobOutputs& o, bool operator_view) {
  Plots plots;
  const bool show_operator = !o.dp || operator_view;
  const std::string unit = o.unit();
  const std::vector<Row>& pub = o.metrics.rows;
  const std::vector<Row>& op = o.operator_metrics.rows;
  const std::string why =
      o.datacenter
          ? "operator-only under DP-SGD: computed from the training data without noise, not "
            "covered by the guarantee"
          : "operator-only under DP: computed from the clients' data and behaviour without noise, "
            "not covered by the guarantee";
  // A plot's legend names the series that have data (a job without training losses has no such
  // line); a plot without any keeps them all and says it has no data.
  auto drop_empty = [](PlotEntry& e) {
    if (HasData(e.spec))
      std::erase_if(e.spec.series, [](const Series& s) { return s.points.empty(); });
  };
  auto add_public = [&](PlotEntry e) {
    drop_empty(e);
    plots.shown.push_back(std::move(e));
  };
  auto add_operator = [&](PlotEntry e) {
    drop_empty(e);
    if (show_operator) {
      e.operator_only = o.dp;
      plots.shown.push_back(std::move(e));
    } else {
      plots.left_out.push_back({e.spec.title, why});
    }
  };

  // Accuracy and loss of the model, on the coordinator's (rank 0's) test set.
  PlotEntry acc{Spec("accuracy", "Test accuracy", unit, "accuracy", ValueFormat::kPercent)};
  acc.spec.y_from_zero = false;
  acc.spec.y_max_one = true;
  acc.spec.series.push_back(LineOf(pub, "test_accuracy", "test accuracy", kBlue));
  if (o.datacenter && !o.dp) {
    acc.spec.series.push_back(LineOf(pub, "train_accuracy", "training accuracy", kOrange));
  }
  acc.caption = "The model after each " + unit + ", evaluated on the test set (metrics.jsonl).";
  PlotEntry loss{Spec("loss", "Test loss", unit, "loss", ValueFormat::kNumber)};
  loss.spec.series.push_back(LineOf(pub, "test_loss", "test loss", kBlue));
  if (!o.dp) {
    loss.spec.series.push_back(
        LineOf(pub, "train_loss", o.datacenter ? "training loss" : "training loss (clients' mean)",
               kOrange));
  }
  loss.caption = acc.caption;
  if (!pub.empty()) {
    acc.spec.empty_text = loss.spec.empty_text = "no evaluation in the " + unit + "s so far";
  }
  add_public(std::move(acc));
  add_public(std::move(loss));

  if (o.datacenter) {
    if (o.dp) {
      PlotEntry tacc{
          Spec("train_accuracy", "Training accuracy", unit, "accuracy", ValueFormat::kPercent)};
      tacc.spec.y_from_zero = false;
      tacc.spec.y_max_one = true;
      tacc.spec.series.push_back(LineOf(op, "train_accuracy", "training accuracy", kOrange));
      tacc.caption = "The ranks' own accuracy on their batches (operator_metrics.jsonl).";
      add_operator(std::move(tacc));
      PlotEntry tloss{Spec("train_loss", "Training loss", unit, "loss", ValueFormat::kNumber)};
      tloss.spec.series.push_back(LineOf(op, "train_loss", "training loss", kOrange));
      tloss.caption = "The ranks' own loss on their batches (operator_metrics.jsonl).";
      add_operator(std::move(tloss));
    }
    PlotEntry step{Spec("step_time", "Time per step", unit, "seconds", ValueFormat::kSeconds)};
    const std::map<double, double> seconds = ValuesOf(op, "epoch_seconds");
    const std::map<double, double> steps = Increments(ValuesOf(op, "steps"));
    std::map<double, double> per_step;
    for (const auto& [x, s] : seconds) {
      if (auto n = steps.find(x); n != steps.end() && n->second > 0) per_step[x] = s / n->second;
    }
    step.spec.series.push_back(Line("mean step time", kPurple, per_step));
    step.caption = "The epoch's wall time over its steps (" +
                   std::string(o.dp ? "operator_metrics.jsonl" : "metrics.jsonl") + ").";
    add_operator(std::move(step));
  } else {
    const std::string source = o.dp ? "operator_metrics.jsonl" : "metrics.jsonl";
    PlotEntry duration{Spec("duration", "Round duration", unit, "seconds", ValueFormat::kSeconds)};
    duration.spec.series.push_back(LineOf(op, "duration_s", "round duration", kBlue));
    duration.spec.series.push_back(LineOf(op, "upload_s.max", "slowest upload", kOrange));
    duration.caption = "The round's wall time and its slowest upload (" + source + ").";
    add_operator(std::move(duration));

    PlotEntry part{Spec("participation", "Participation", unit, "clients", ValueFormat::kInteger)};
    // The coordinator's counts (metrics rows); participation.jsonl's lists where rows lack them.
    const std::vector<Row>& who = o.participation.rows;
    bool counted = false;
    for (const Row& r : op) counted = counted || r.numbers.count("clients_sampled");
    if (!counted && !who.empty()) {
      part.spec.series = {LineOf(who, "contributed", "contributed", kGreen),
                          LineOf(who, "dropped", "dropped", kOrange),
                          LineOf(who, "declined", "declined", kPurple),
                          LineOf(who, "failed", "failed", kBrown),
                          LineOf(who, "refused", "refused", kRed),
                          LineOf(who, "sampled", "sampled", kBlue)};
      part.caption = "Each round's cohort and what became of its members (participation.jsonl).";
    } else {
      part.spec.series = {LineOf(op, "results", "contributed", kGreen),
                          LineOf(op, "dropped", "dropped", kOrange),
                          LineOf(op, "declined", "declined", kPurple),
                          LineOf(op, "failed", "failed", kBrown),
                          SumOf(op, {"rejected", "stale", "malformed"}, "refused", kRed),
                          LineOf(op, "clients_sampled", "sampled", kBlue)};
      part.caption = "Each round's cohort and what became of its members (" + source + ").";
    }
    part.spec.series.back().dashed = true;  // sampled, over contributed (equal when all answer)
    add_operator(std::move(part));

    PlotEntry traffic{Spec("traffic", "Traffic", unit, "bytes", ValueFormat::kBytes)};
    traffic.spec.series.push_back(LineOf(op, "bytes_in", "bytes in", kBlue));
    traffic.spec.series.push_back(LineOf(op, "bytes_out", "bytes out", kOrange));
    traffic.spec.series.back().dashed = true;  // over bytes in (about equal)
    traffic.caption = "Bytes the coordinator received and sent in each round (" + source + ").";
    add_operator(std::move(traffic));
  }

  if (!o.dp) return plots;
  // Privacy: the spend after each round against the budget, with the schedule's runs shaded.
  const json none = json::object();
  const json& privacy = o.privacy ? *o.privacy : none;
  std::optional<double> budget = Number(privacy, "budget_epsilon");
  for (const Row& r : pub) {
    if (!budget) budget = r.Get("privacy.budget_epsilon");
  }
  std::optional<double> delta = Number(privacy, "delta");
  for (const Row& r : pub) {
    if (!delta) delta = r.Get("delta");
  }
  const std::string y_label = delta ? "epsilon at delta " + Short(*delta) : "epsilon";
  const std::vector<Band> bands = ScheduleBands(o);
  std::string empty = "no data yet";
  if (const auto it = privacy.find("private"); it != privacy.end() && *it == false) {
    empty = "not private: no epsilon is stated (see the header)";
  } else if (privacy.contains("epsilon_kept_by")) {
    empty = "epsilon is kept by each client's own ledger (DP-SGD in the clients)";
  }

  PlotEntry eps{Spec("epsilon", "Privacy: epsilon spent against the budget", unit, y_label,
                     ValueFormat::kNumber)};
  const std::map<double, double> spent = ValuesOf(pub, "epsilon");
  eps.spec.series.push_back(Line("epsilon spent", kBlue, spent));
  if (budget) eps.spec.lines.push_back({*budget, "budget", kRed});
  if (std::optional<double> planned = Number(privacy, "planned_epsilon");
      planned && (!budget || std::fabs(*planned - *budget) > 1e-6 * std::fabs(*budget))) {
    eps.spec.lines.push_back({*planned, "planned", kGrey});
  }
  eps.spec.bands = bands;
  eps.spec.empty_text = empty;
  eps.caption = "The job's epsilon after each " + unit +
                " (metrics.jsonl), the budget and the plan (privacy.json); shaded: the privacy "
                "schedule's runs of " +
                unit + "s with their noise multiplier z and clip norm C.";
  add_public(std::move(eps));

  PlotEntry per{
      Spec("epsilon_step", "Epsilon spent by each " + unit, unit, "epsilon", ValueFormat::kNumber)};
  Series inc = Line("epsilon of the " + unit, kGreen, Increments(spent));
  inc.step = true;
  per.spec.series.push_back(std::move(inc));
  per.spec.bands = bands;
  per.spec.empty_text = empty;
  per.caption = "What each " + unit +
                " added to the spend: its step follows the schedule (metrics.jsonl, privacy.json).";
  add_public(std::move(per));
  return plots;
}

}  // namespace huddle::report
