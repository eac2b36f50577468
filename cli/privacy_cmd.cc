// `huddle privacy epsilon|rdp|noise`: the privacy accountants from the command line.
//
// Flags arrive as strings and are parsed here, so that every bad value (missing, not a number,
// out of range) exits with code 2 and "huddle privacy <cmd>: <message naming the flag>".
// --json prints one JSON object on stdout; numbers are printed in their shortest round-trip form,
// and an unbounded epsilon (e.g. zero noise) as null.
//
// Exit codes: 0 with an answer; 2 for bad input (a flag out of range, or a target the calibration
// cannot meet); 1 for a computation the library refuses (a PLD past its 2^24-point grid, an RDP
// past its work limits); 130 when SIGINT or SIGTERM arrives mid-computation (the library checks
// StopFlag() in its long loops). Every computation is bounded, so without a signal each call ends
// on its own: within a few seconds, up to ~a minute for PLD calibrations near the grid limit.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "cli/commands.h"
#include "privacy/accountant.h"

namespace huddle::cli {
namespace {

Status Usage(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

std::string JsonNumber(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

// The flag's value as a double: InvalidArgument if missing or not entirely a number.
StatusOr<double> ParseDouble(const std::string& flag, const std::string& text) {
  if (text.empty()) return Usage(fmt::format("{} is required", flag));
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || std::isnan(v)) {
    return Usage(fmt::format("{} must be a number, got '{}'", flag, text));
  }
  return v;
}

StatusOr<int64_t> ParseSteps(const std::string& text) {
  if (text.empty()) return Usage("--steps is required");
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v < 0) {
    return Usage(fmt::format("--steps must be an integer >= 0, got '{}'", text));
  }
  return v;
}

StatusOr<double> ParseSamplingRate(const std::string& text) {
  HUDDLE_ASSIGN_OR_RETURN(const double q, ParseDouble("--sampling-rate", text));
  if (!(q >= 0 && q <= 1)) {
    return Usage(fmt::format("--sampling-rate must be in [0, 1], got {}", q));
  }
  return q;
}

StatusOr<double> ParseNoise(const std::string& text) {
  HUDDLE_ASSIGN_OR_RETURN(const double z, ParseDouble("--noise-multiplier", text));
  if (!(z >= 0)) return Usage(fmt::format("--noise-multiplier must be >= 0, got {}", z));
  return z;
}

StatusOr<double> ParseDelta(const std::string& text) {
  HUDDLE_ASSIGN_OR_RETURN(const double d, ParseDouble("--delta", text));
  if (!(d > 0 && d < 1)) return Usage(fmt::format("--delta must be in (0, 1), got {}", d));
  return d;
}

StatusOr<privacy::AccountantKind> ParseKind(const std::string& text) {
  auto kind = privacy::ParseAccountant(text.empty() ? "rdp" : text);
  if (!kind.ok()) return Usage(fmt::format("--accountant: {}", kind.status().message()));
  return *kind;
}

Status Epsilon(const PrivacyFlags& f) {
  privacy::DpEvent event;
  HUDDLE_ASSIGN_OR_RETURN(event.sampling_rate, ParseSamplingRate(f.sampling_rate));
  HUDDLE_ASSIGN_OR_RETURN(event.noise_multiplier, ParseNoise(f.noise_multiplier));
  HUDDLE_ASSIGN_OR_RETURN(event.steps, ParseSteps(f.steps));
  HUDDLE_ASSIGN_OR_RETURN(const double delta, ParseDelta(f.delta));
  HUDDLE_ASSIGN_OR_RETURN(const privacy::AccountantKind kind, ParseKind(f.accountant));
  HUDDLE_ASSIGN_OR_RETURN(
      const privacy::Spend spend,
      privacy::ComputeEpsilon(std::span(&event, 1), delta, kind, {}, &StopFlag()));
  const char* name = privacy::AccountantName(kind);
  if (f.json) {
    std::string out = fmt::format(R"({{"epsilon": {}, "delta": {}, "accountant": "{}")",
                                  JsonNumber(spend.epsilon), JsonNumber(delta), name);
    if (spend.order) out += fmt::format(R"(, "order": {})", JsonNumber(*spend.order));
    fmt::print("{}}}\n", out);
  } else {
    fmt::print("epsilon = {} at delta = {} ({} accountant{})\n", spend.epsilon, delta, name,
               spend.order ? fmt::format(", Renyi order {}", *spend.order) : "");
  }
  return absl::OkStatus();
}

Status Rdp(const PrivacyFlags& f) {
  HUDDLE_ASSIGN_OR_RETURN(const double q, ParseSamplingRate(f.sampling_rate));
  HUDDLE_ASSIGN_OR_RETURN(const double z, ParseNoise(f.noise_multiplier));
  HUDDLE_ASSIGN_OR_RETURN(const double order, ParseDouble("--order", f.order));
  if (!(order > 1) || (order > privacy::kMaxRdpOrder && !std::isinf(order))) {
    return Usage(fmt::format("--order must be > 1 and at most {} (or inf), got {}",
                             privacy::kMaxRdpOrder, order));
  }
  HUDDLE_ASSIGN_OR_RETURN(const double rdp, privacy::SubsampledGaussianRdp(q, z, order));
  if (f.json) {
    fmt::print("{{\"rdp\": {}}}\n", JsonNumber(rdp));
  } else {
    fmt::print("rdp = {} at order {} (one step)\n", rdp, order);
  }
  return absl::OkStatus();
}

Status Noise(const PrivacyFlags& f) {
  HUDDLE_ASSIGN_OR_RETURN(const double target, ParseDouble("--target-epsilon", f.target_epsilon));
  if (!(target > 0) || std::isinf(target)) {
    return Usage(fmt::format("--target-epsilon must be positive and finite, got {}", target));
  }
  HUDDLE_ASSIGN_OR_RETURN(const double delta, ParseDelta(f.delta));
  HUDDLE_ASSIGN_OR_RETURN(const double q, ParseSamplingRate(f.sampling_rate));
  HUDDLE_ASSIGN_OR_RETURN(const int64_t steps, ParseSteps(f.steps));
  HUDDLE_ASSIGN_OR_RETURN(const privacy::AccountantKind kind, ParseKind(f.accountant));
  auto z = privacy::CalibrateNoiseMultiplier(target, delta, q, steps, kind, {}, &StopFlag());
  if (absl::IsInvalidArgument(z.status())) {  // the flags are valid: the target is out of reach
    return Usage(fmt::format("--target-epsilon: {}", z.status().message()));
  }
  if (!z.ok()) return z.status();
  if (f.json) {
    fmt::print("{{\"noise_multiplier\": {}}}\n", JsonNumber(*z));
  } else {
    fmt::print("noise multiplier = {} ({} accountant)\n", *z, privacy::AccountantName(kind));
  }
  return absl::OkStatus();
}

}  // namespace

int RunPrivacyCommand(const PrivacyFlags& flags) {
  Status status = Usage(fmt::format("unknown command '{}' (epsilon, rdp, noise)", flags.command));
  if (flags.command == "epsilon") status = Epsilon(flags);
  if (flags.command == "rdp") status = Rdp(flags);
  if (flags.command == "noise") status = Noise(flags);
  if (status.ok()) return 0;
  if (absl::IsCancelled(status)) {
    std::fprintf(stderr, "huddle privacy %s: stopped by %s\n", flags.command.c_str(),
                 StopSignalName());
    return StopExitCode();
  }
  std::fprintf(stderr, "huddle privacy %s: %s\n", flags.command.c_str(),
               std::string(status.message()).c_str());
  // Bad input (ours or the library's) is a usage error; anything else (e.g. a PLD too large).
  return absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status) ? 2 : 1;
}

}  // namespace huddle::cli
