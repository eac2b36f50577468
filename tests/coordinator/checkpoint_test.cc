// Checkpoints (coordinator/checkpoint.h): what is written reads back; what could not be read back
// is never written (one validation for the writer and the reader, tried with extreme values); a
// well-sealed file holding impossible values is refused; a legacy format (no checksum) is read
// only when asked for, so renaming a current file's magic does not skip its checksum.
#include "coordinator/checkpoint.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/digest.h"
#include "common/file_util.h"
#include "coordinator/coordinator.h"
#include "tests/coordinator/fake_federation.h"
#include "tests/coordinator/run_job.h"
#include "tests/testing/temp_dir.h"

namespace huddle::coordinator {
namespace {

constexpr double kMax = std::numeric_limits<double>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::nan("");

// C4's layout: magic, 3 counters, the 4 words of the sampling RNG, elapsed, bytes in and out,
// clip norm (C2), privacy mode (C3), then the evaluation record (C4: 3 doubles and best_round),
// the tensors, and a 64-character digest.
constexpr size_t kClipOffset = 8 + 8 * (3 + 4 + 3);
constexpr size_t kModeOffset = kClipOffset + 8;
constexpr size_t kRecordOffset = kModeOffset + 8;
constexpr size_t kRecordBytes = 4 * 8;
constexpr size_t kDigestChars = 64;
constexpr float kMarker = 12345.678f;  // model element 2: found in the bytes to corrupt it

Checkpoint Good() {
  Checkpoint c;
  c.completed_round = 3;
  c.model_version = 3;
  c.seed = 7;
  c.rng_state = {1, 2, 3, 4};
  c.elapsed_s = 12.5;
  c.bytes_in = 1000;
  c.bytes_out = 2000;
  c.clip_norm = 0.5;
  c.privacy_mode = 1;
  c.final_test_accuracy = 0.75;
  c.final_test_loss = 0.6;
  c.best_test_accuracy = 0.8;
  c.best_round = 2;
  Tensor w("w", {2, 3});
  w.data = {0.25f, -1.5f, kMarker, 3, 4, 5};
  c.model = {w};
  return c;
}

// A fresh, empty directory, removed when the test binary exits.
std::string TempDir(const std::string& name) {
  static testing::TempDirs dirs;
  return dirs.Make("ckpt_" + name);
}

// The bytes of `path`, less their digest.
std::string Body(const std::string& path) {
  auto bytes = ReadFile(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes->substr(0, bytes->size() - kDigestChars);
}

// A C4 file of `body` with its digest recomputed: consistent, as a bug or a tamperer could write.
std::string Sealed(const std::string& body) {
  return body + Digest().Add(std::as_bytes(std::span(body.data(), body.size()))).Hex();
}

void PutU64(std::string* bytes, size_t at, uint64_t v) { std::memcpy(bytes->data() + at, &v, 8); }

bool SameBits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

TEST(CheckpointTest, WhatIsWrittenReadsBack) {
  const std::string path = TempDir("roundtrip") + "/checkpoint.bin";
  ASSERT_TRUE(WriteCheckpoint(path, Good()).ok());
  auto c = ReadCheckpoint(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->completed_round, 3u);
  EXPECT_EQ(c->rng_state, Good().rng_state);
  EXPECT_EQ(c->privacy_mode, 1);
  EXPECT_DOUBLE_EQ(c->clip_norm, 0.5);
  EXPECT_DOUBLE_EQ(c->final_test_loss, 0.6);
  EXPECT_EQ(c->best_round, 2u);
  EXPECT_EQ(c->model[0].data, Good().model[0].data);
}

// Issue 32: one evaluation answer of DBL_MAX made the record inf; it was written, and the
// coordinator then refused its own checkpoint on --resume. Now each extreme value is either
// written and read back bit for bit, or not written at all (the previous file stays whole).
TEST(CheckpointTest, ExtremeValuesAreReadBackOrNotWritten) {
  const std::string path = TempDir("extreme") + "/checkpoint.bin";
  using Field = std::pair<const char*, double Checkpoint::*>;
  const Field fields[] = {{"final_test_accuracy", &Checkpoint::final_test_accuracy},
                          {"final_test_loss", &Checkpoint::final_test_loss},
                          {"best_test_accuracy", &Checkpoint::best_test_accuracy},
                          {"elapsed", &Checkpoint::elapsed_s},
                          {"clip norm", &Checkpoint::clip_norm}};
  int written = 0, refused = 0;
  for (const auto& [name, field] : fields) {
    for (double v : {kMax, -kMax, kInf, -kInf, kNaN, 1e300, -1e-300, 1.0000001, 0.0, 1.0}) {
      ASSERT_TRUE(WriteCheckpoint(path, Good()).ok());
      Checkpoint c = Good();
      c.*field = v;
      const Status st = WriteCheckpoint(path, c);
      auto back = ReadCheckpoint(path);
      ASSERT_TRUE(back.ok()) << name << " = " << v
                             << ": written but refused on reading: " << back.status();
      if (st.ok()) {
        ++written;
        EXPECT_TRUE(SameBits((*back).*field, v)) << name << " = " << v;
      } else {
        ++refused;
        EXPECT_NE(st.message().find(name), absl::string_view::npos) << st;
        EXPECT_TRUE(SameBits((*back).*field, Good().*field)) << "the previous file stays whole";
      }
    }
  }
  EXPECT_GT(written, 0);
  EXPECT_GT(refused, 0);
  // The ones that matter: a finite loss however large is kept; inf is not written.
  Checkpoint c = Good();
  c.final_test_loss = kMax;
  EXPECT_TRUE(WriteCheckpoint(path, c).ok());
  c.final_test_loss = kInf;
  EXPECT_FALSE(WriteCheckpoint(path, c).ok());
}

TEST(CheckpointTest, ImpossibleCountersAndModesAreNotWritten) {
  const std::string path = TempDir("counters") + "/checkpoint.bin";
  const std::vector<std::pair<std::string, std::function<void(Checkpoint&)>>> cases = {
      {"completed_round", [](Checkpoint& c) { c.completed_round = UINT64_MAX; }},
      {"completed_round", [](Checkpoint& c) { c.completed_round = kMaxCheckpointRound + 1; }},
      {"model_version", [](Checkpoint& c) { c.model_version = 4; }},
      {"best_round", [](Checkpoint& c) { c.best_round = UINT64_MAX; }},
      {"privacy mode", [](Checkpoint& c) { c.privacy_mode = -1; }},
      {"privacy mode", [](Checkpoint& c) { c.privacy_mode = 4; }},
      {"element 2", [](Checkpoint& c) { c.model[0].data[2] = std::nanf(""); }},
      {"optimizer state",
       [](Checkpoint& c) {
         Tensor v("v", {1});
         v.data[0] = kInf;
         c.optimizer_state = {v};
       }},
  };
  for (const auto& [what, edit] : cases) {
    Checkpoint c = Good();
    edit(c);
    const Status st = WriteCheckpoint(path, c);
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find(what), absl::string_view::npos) << st;
  }
}

// The reader's side of the same rule: a file sealed with a valid digest but holding an
// impossible value is refused, naming it.
TEST(CheckpointTest, AWellSealedFileWithImpossibleValuesIsRefused) {
  const std::string path = TempDir("sealed") + "/checkpoint.bin";
  ASSERT_TRUE(WriteCheckpoint(path, Good()).ok());
  const std::string body = Body(path);
  auto refused = [&](const std::string& edited, const std::string& what) {
    ASSERT_TRUE(WriteFileAtomic(path, Sealed(edited)).ok());
    auto c = ReadCheckpoint(path);
    EXPECT_TRUE(absl::IsDataLoss(c.status())) << what << ": " << c.status();
    EXPECT_NE(c.status().message().find(what), absl::string_view::npos) << c.status();
  };
  std::string b = body;
  PutU64(&b, 8, UINT64_MAX);
  refused(b, "completed_round");
  b = body;
  PutU64(&b, kRecordOffset + 8, std::bit_cast<uint64_t>(kInf));
  refused(b, "final_test_loss");
  b = body;
  PutU64(&b, kRecordOffset, std::bit_cast<uint64_t>(7.0));
  refused(b, "final_test_accuracy");
  b = body;
  PutU64(&b, kModeOffset, 9);
  refused(b, "privacy mode");
  b = body;
  const size_t at = b.find(std::string(reinterpret_cast<const char*>(&kMarker), 4));
  ASSERT_NE(at, std::string::npos);
  const float nan = std::nanf("");
  std::memcpy(b.data() + at, &nan, 4);
  refused(b, "element 2");
}

// A legacy file of `format` (1-3) holding Good(): C4's fields less those added since, no digest.
std::string Legacy(const std::string& c4_body, int format) {
  std::string b = c4_body;
  b.erase(kRecordOffset, kRecordBytes);
  if (format < 3) b.erase(kModeOffset, 8);
  if (format < 2) b.erase(kClipOffset, 8);
  b.replace(0, 8, "HUDDLEC" + std::to_string(format));
  return b;
}

// Issue 32: renaming a C4 file's magic to C1-C3 skipped its checksum. A legacy magic is now
// refused unless the operator asks for it, naming the flag that does.
TEST(CheckpointTest, ALegacyMagicIsRefusedWithoutTheFlag) {
  const std::string path = TempDir("legacy") + "/checkpoint.bin";
  ASSERT_TRUE(WriteCheckpoint(path, Good()).ok());
  auto c4 = ReadFile(path);
  ASSERT_TRUE(c4.ok());
  const std::string body = c4->substr(0, c4->size() - kDigestChars);
  CheckpointReadOptions legacy;
  legacy.allow_legacy_format = true;
  for (int format : {1, 2, 3}) {
    SCOPED_TRACE(format);
    // A current file renamed (and damaged: one bit of the model flipped).
    std::string renamed = *c4;
    renamed.replace(0, 8, "HUDDLEC" + std::to_string(format));
    renamed[renamed.size() - kDigestChars - 3] ^= 0x10;
    ASSERT_TRUE(WriteFileAtomic(path, renamed).ok());
    auto c = ReadCheckpoint(path);
    EXPECT_TRUE(absl::IsFailedPrecondition(c.status())) << c.status();
    EXPECT_NE(c.status().message().find("--allow-legacy-checkpoint"), absl::string_view::npos)
        << c.status();
    EXPECT_NE(c.status().message().find("no checksum"), absl::string_view::npos) << c.status();
    // Even with the flag it is not a legacy file: its digest is 64 trailing bytes.
    EXPECT_TRUE(absl::IsDataLoss(ReadCheckpoint(path, legacy).status()));

    // A genuine legacy file: refused by default, read with the flag.
    ASSERT_TRUE(WriteFileAtomic(path, Legacy(body, format)).ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(ReadCheckpoint(path).status()));
    auto old = ReadCheckpoint(path, legacy);
    ASSERT_TRUE(old.ok()) << old.status();
    EXPECT_EQ(old->completed_round, 3u);
    EXPECT_EQ(old->model[0].data, Good().model[0].data);
    EXPECT_EQ(old->privacy_mode, format >= 3 ? 1 : -1);
    EXPECT_DOUBLE_EQ(old->clip_norm, format >= 2 ? 0.5 : 0.0);
    EXPECT_TRUE(std::isnan(old->final_test_loss));
  }
}

CoordinatorOptions JobOptions(const std::string& name) {
  CoordinatorOptions o;
  o.job_name = name;
  o.seed = 7;
  o.rounds = 1;
  o.model = models::MlpSpec{6, {5}, 3};
  o.cohort.size = 2;
  o.min_clients = 2;
  o.client_timeout_ms = 0;
  o.eval_every = 0;
  o.out_dir = TempDir(name);
  return o;
}

// Runs `o` with two honest clients.
Status RunJob(const CoordinatorOptions& o, Evaluator evaluator = {}) {
  return testing::RunJob(o, {.clients = {{"c0"}, {"c1"}}, .evaluator = std::move(evaluator)})
      .status;
}

// A diverged model's test loss (inf) is recorded as unknown in the checkpoint, which the job then
// resumes from (before: written as inf, then refused as a corrupt evaluation record).
TEST(CheckpointTest, AnInfiniteTestLossDoesNotStopTheResume) {
  CoordinatorOptions o = JobOptions("inf_loss");
  o.eval_every = 1;
  auto diverged = [](const TensorList&) -> StatusOr<models::EvalStats> {
    return models::EvalStats{std::numeric_limits<double>::infinity(), 0.1, 100};
  };
  ASSERT_TRUE(RunJob(o, diverged).ok());
  auto c = ReadCheckpoint(o.out_dir + "/" + kCheckpointFile);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(std::isnan(c->final_test_loss));
  EXPECT_DOUBLE_EQ(c->final_test_accuracy, 0.1);
  CoordinatorOptions resumed = o;
  resumed.rounds = 2;
  resumed.resume = true;
  const Status st = RunJob(resumed, diverged);
  EXPECT_TRUE(st.ok()) << st;
}

// The coordinator's --resume: a legacy checkpoint stops it unless allow_legacy_checkpoint (the
// CLI's --allow-legacy-checkpoint); with it, the job continues and writes C4 again.
TEST(CheckpointTest, ResumeFromALegacyCheckpointNeedsTheOption) {
  const CoordinatorOptions o = JobOptions("legacy_resume");
  ASSERT_TRUE(RunJob(o).ok());
  const std::string path = o.out_dir + "/" + kCheckpointFile;
  ASSERT_TRUE(WriteFileAtomic(path, Legacy(Body(path), 3)).ok());
  CoordinatorOptions resumed = o;
  resumed.rounds = 2;
  resumed.resume = true;
  const Status refused = RunJob(resumed);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(refused.message().find("--allow-legacy-checkpoint"), absl::string_view::npos);
  resumed.allow_legacy_checkpoint = true;
  ASSERT_TRUE(RunJob(resumed).ok());
  auto now = ReadCheckpoint(path);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->completed_round, 2u);
}

}  // namespace
}  // namespace huddle::coordinator
