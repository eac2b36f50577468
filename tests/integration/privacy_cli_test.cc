// `huddle privacy` on hostile input, as a real process: every call ends on its own with an
// answer (exit 0) or an error naming the flag (2: bad input) or the limit (1: a computation the
// library refuses) — never an abort, an uncaught exception or a hang — and SIGTERM / SIGINT
// stop a long computation promptly (exit 130). Waits are generous bounds, not timings.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

struct Outcome {
  int code = -1;
  std::string output;  // stdout and stderr
};

Outcome RunPrivacy(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), {HuddleBin(), "privacy"});
  const std::string log = dir + "/privacy.log";
  std::filesystem::remove(log);
  Process p(args, log);
  Outcome out;
  out.code = p.Wait(seconds(120));  // -1 if it hangs; the destructor then kills it
  out.output = ReadAll(log);
  return out;
}

struct Case {
  std::vector<std::string> args;
  int code;
  std::string message;  // a substring of the output
};

std::string Join(const std::vector<std::string>& args) {
  std::string s;
  for (const std::string& a : args) s += a + " ";
  return s;
}

void ExpectAll(const std::vector<Case>& cases) {
  const std::string dir = MakeTempDir("privacy_cli");
  for (const Case& c : cases) {
    const Outcome out = RunPrivacy(dir, c.args);
    EXPECT_EQ(out.code, c.code) << Join(c.args) << "\n" << out.output;
    EXPECT_NE(out.output.find(c.message), std::string::npos)
        << Join(c.args) << "\nexpected: " << c.message << "\ngot: " << out.output;
    for (const char* crash : {"terminate called", "bad_alloc", "length_error", "= nan", "= -nan"}) {
      EXPECT_EQ(out.output.find(crash), std::string::npos) << Join(c.args) << "\n" << out.output;
    }
  }
}

const std::string kHugeSteps = "4611686018427387904";  // 2^62

// The failures of issue 17, item 10: aborts on huge orders and tiny noise.
TEST(PrivacyCli, RdpOnHugeOrdersAndTinyNoise) {
  ExpectAll({
      {{"rdp", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--order", "1e300"},
       2,
       "huddle privacy rdp: --order must be > 1 and at most 1000000 (or inf), got 1e+300"},
      {{"rdp", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--order", "1e6"},
       0,
       "rdp = 499997.69741260"},
      {{"rdp", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--order", "inf"},
       0,
       "rdp = inf"},
      {{"rdp", "--sampling-rate", "0.1", "--noise-multiplier", "1e-10", "--order", "2.5"},
       0,
       "rdp = 1.25e+20 at order 2.5"},
      {{"rdp", "--sampling-rate", "0.1", "--noise-multiplier", "1e-300", "--order", "2"},
       0,
       "rdp = inf at order 2"},
      {{"rdp", "--sampling-rate", "0.1", "--noise-multiplier", "1e-300", "--order", "2.5",
        "--json"},
       0,
       R"({"rdp": null})"},
      {{"rdp", "--sampling-rate", "0.1", "--noise-multiplier", "1e-5", "--order", "1.000000001"},
       1,
       "huddle privacy rdp: the RDP at order 1.000000001 with noise multiplier 1e-05"},
      {{"rdp", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--order", "nan"},
       2,
       "--order must be a number, got 'nan'"},
      {{"rdp", "--sampling-rate", "1e-300", "--noise-multiplier", "-1", "--order", "2"},
       2,
       "--noise-multiplier must be >= 0, got -1"},
  });
}

TEST(PrivacyCli, EpsilonOnHostileInput) {
  ExpectAll({
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1e-10", "--steps", "100",
        "--delta", "1e-5"},
       0,
       "epsilon = 5.50000000"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1e-300", "--steps", "100",
        "--delta", "1e-5", "--json"},
       0,
       R"("epsilon": null)"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", kHugeSteps,
        "--delta", "1e-5"},
       0,
       "epsilon = 3.73480549"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1e-300", "--steps", "100",
        "--delta", "1e-5", "--accountant", "pld"},
       1,
       "huddle privacy epsilon: the privacy loss distribution needs an unbounded grid (more "
       "than 16777216)"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1e-10", "--steps", "100",
        "--delta", "1e-5", "--accountant", "pld"},
       1,
       "grid points (more than 16777216)"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", kHugeSteps,
        "--delta", "1e-5", "--accountant", "pld"},
       1,
       "grid points (more than 16777216)"},
      {{"epsilon", "--sampling-rate", "1", "--noise-multiplier", "1e-300", "--steps", kHugeSteps,
        "--delta", "1e-300", "--accountant", "analytic"},
       0,
       "epsilon = inf at delta = 1e-300 (analytic accountant)"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps",
        "9223372036854775808", "--delta", "1e-5"},
       2,
       "--steps must be an integer >= 0, got '9223372036854775808'"},
      {{"epsilon", "--sampling-rate", "inf", "--noise-multiplier", "1", "--steps", "1", "--delta",
        "1e-5"},
       2,
       "--sampling-rate must be in [0, 1], got inf"},
      {{"epsilon", "--sampling-rate", "0.1", "--noise-multiplier", "1", "--steps", "1", "--delta",
        "0"},
       2,
       "--delta must be in (0, 1), got 0"},
  });
}

// `noise --target-epsilon 1e300` searched forever; the other extremes end with an error too.
TEST(PrivacyCli, NoiseOnTargetsOutOfReach) {
  const std::string too_large =
      "huddle privacy noise: --target-epsilon: target epsilon 1e+300 is too large to calibrate";
  ExpectAll({
      {{"noise", "--target-epsilon", "1e300", "--delta", "1e-5", "--sampling-rate", "0.1",
        "--steps", "100"},
       2,
       too_large},
      {{"noise", "--target-epsilon", "1e300", "--delta", "1e-5", "--sampling-rate", "0.1",
        "--steps", "100", "--accountant", "pld"},
       2,
       too_large},
      {{"noise", "--target-epsilon", "1e300", "--delta", "1e-5", "--sampling-rate", "1", "--steps",
        "100", "--accountant", "analytic"},
       2,
       too_large},
      {{"noise", "--target-epsilon", "1e-300", "--delta", "1e-300", "--sampling-rate", "1",
        "--steps", kHugeSteps},
       2,
       "--target-epsilon: no noise multiplier up to 1e+12 reaches epsilon 1e-300"},
      {{"noise", "--target-epsilon", "1e6", "--delta", "1e-5", "--sampling-rate", "0.1", "--steps",
        "100", "--accountant", "pld"},
       1,
       "grid points (more than 16777216)"},
      // Epsilon is 0 for every z the PLD can represent: the search halves z to the grid limit.
      {{"noise", "--target-epsilon", "1", "--delta", "0.999999", "--sampling-rate", "0.1",
        "--steps", "100", "--accountant", "pld"},
       1,
       "grid points (more than 16777216)"},
      {{"noise", "--target-epsilon", "1e6", "--delta", "1e-5", "--sampling-rate", "0.1", "--steps",
        "100", "--json"},
       0,
       R"({"noise_multiplier": 0.0074072401)"},
      {{"noise", "--target-epsilon", "inf", "--delta", "1e-5", "--sampling-rate", "0.1", "--steps",
        "100"},
       2,
       "--target-epsilon must be positive and finite, got inf"},
  });
}

// Whether /proc says `pid` runs `huddle privacy ...` and catches `signal` (the binary installs
// its SIGINT/SIGTERM handlers just before it runs the command, so the computation has started).
bool CatchesSignal(pid_t pid, int signal) {
  const std::string cmdline = ReadAll("/proc/" + std::to_string(pid) + "/cmdline");
  if (cmdline.find(std::string("privacy\0noise", 13)) == std::string::npos) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigCgt:", 0) == 0) {
      const uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
      return ((mask >> (signal - 1)) & 1) != 0;
    }
  }
  return false;
}

// A PLD calibration whose answer (z ~ 0.037) lies near the 2^24-point grid: ~10 evaluations of
// seconds each, so it is still running when the signal arrives.
void ExpectSignalStopsCalibration(int signal) {
  const std::string dir = MakeTempDir("privacy_cli_signal");
  const std::string log = dir + "/privacy.log";
  Process p({HuddleBin(), "privacy", "noise", "--target-epsilon", "500", "--delta", "1e-5",
             "--sampling-rate", "1", "--steps", "1", "--accountant", "pld"},
            log);
  ASSERT_TRUE(WaitFor([&] { return !p.running() || CatchesSignal(p.pid(), signal); }, seconds(30)));
  ASSERT_TRUE(p.running()) << "the calibration ended before the signal:\n" << ReadAll(log);
  p.Kill(signal);
  EXPECT_EQ(p.Wait(seconds(10)), 128 + signal) << ReadAll(log);
  EXPECT_NE(ReadAll(log).find(std::string("huddle privacy noise: stopped by ") +
                              (signal == SIGINT ? "SIGINT" : "SIGTERM")),
            std::string::npos)
      << ReadAll(log);
}

TEST(PrivacyCli, SigtermStopsALongCalibration) { ExpectSignalStopsCalibration(SIGTERM); }
TEST(PrivacyCli, SigintStopsALongCalibration) { ExpectSignalStopsCalibration(SIGINT); }

}  // namespace
}  // namespace huddle::testing
