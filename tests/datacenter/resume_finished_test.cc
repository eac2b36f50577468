// `huddle datacenter --resume` of a job that already ran all its epochs: it says the job is
// complete and exits 0, and leaves every output byte for byte as it was (summary.json kept its
// test accuracy: a resume that trained nothing used to rewrite it with a null one).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/integration/datacenter_job.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

TEST(DatacenterResume, ResumingAFinishedJobLeavesItsOutputsAsTheyWere) {
  const std::string dir = MakeTempDir("dc_resume_finished");
  DcJob job;
  job.epochs = 1;
  job.evaluate = FashionMnistInstalled();  // a test accuracy in summary.json, where there is data
  const std::string config = WriteJob(dir, "finished", job);
  const std::string out = dir + "/out";
  Process first(Launcher(config, out, 2), dir + "/first.log");
  ASSERT_EQ(first.Wait(seconds(120)), 0) << ReadAll(dir + "/first.log");

  const char* kOutputs[] = {"summary.json", "metrics.jsonl", "model.bin", "checkpoint.bin"};
  std::map<std::string, std::string> before;
  for (const char* name : kOutputs) before[name] = ReadAll(out + "/" + name);
  ASSERT_FALSE(before["summary.json"].empty()) << ReadAll(dir + "/first.log");
  if (job.evaluate) {
    ASSERT_TRUE(JsonFile(out + "/summary.json")["final_test_accuracy"].is_number())
        << before["summary.json"];
  }

  std::vector<std::string> argv = Launcher(config, out, 2);
  argv.push_back("--resume");
  Process resumed(argv, dir + "/resumed.log");
  ASSERT_EQ(resumed.Wait(seconds(120)), 0) << ReadAll(dir + "/resumed.log");
  EXPECT_NE(ReadAll(dir + "/resumed.log").find("already complete"), std::string::npos)
      << ReadAll(dir + "/resumed.log");
  for (const char* name : kOutputs) {
    EXPECT_EQ(ReadAll(out + "/" + name), before[name]) << name << " changed";
  }
}

}  // namespace
}  // namespace huddle::testing
