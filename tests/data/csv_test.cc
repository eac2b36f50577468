// CSV parsing: happy paths (header, spacing, CRLF, scaling) and errors with file:line:column.
#include "data/csv.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/data/test_files.h"

namespace huddle::data {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(std::string_view text, const CsvOptions& options = {}) {
  auto result = ParseCsvDataset(text, "in.csv", options);
  EXPECT_FALSE(result.ok()) << "parsed: " << text;
  return std::string(result.status().message());
}

TEST(CsvTest, ParsesRows) {
  auto d = ParseCsvDataset("1,0.5,2\n0,-1e-3,+4\n9,3,0\n", "in.csv");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 3);
  EXPECT_EQ(d->feature_dim, 2);
  EXPECT_EQ(d->num_classes, 10);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0, 9}));
  EXPECT_EQ(d->features, (std::vector<float>{0.5f, 2, -1e-3f, 4, 3, 0}));
}

TEST(CsvTest, SkipsHeaderBlankLinesAndCarriageReturns) {
  auto d = ParseCsvDataset("label, a, b\r\n\r\n 2 , 1 ,\t2\r\n\n3,4,5", "in.csv");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->labels, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(d->features, (std::vector<float>{1, 2, 4, 5}));
}

TEST(CsvTest, ScalesBy255) {
  CsvOptions options;
  options.scale_255 = true;
  options.num_classes = 3;
  auto d = ParseCsvDataset("2,255,51\n", "in.csv", options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->features, (std::vector<float>{1.0f, 0.2f}));
  EXPECT_EQ(d->num_classes, 3);
}

TEST(CsvTest, ErrorsPointAtLineAndColumn) {
  EXPECT_THAT(ErrorOf("1,2,3\n1,2,x\n"), HasSubstr("in.csv:2:5: feature 'x' is not a number"));
  EXPECT_THAT(ErrorOf("1,2,3\n1,2\n"), HasSubstr("in.csv:2:1: row has 2 fields, expected 3"));
  EXPECT_THAT(ErrorOf("1,2,3\n1.5,2,3\n"), HasSubstr("in.csv:2:1: label '1.5' is not an integer"));
  EXPECT_THAT(ErrorOf("1,2\n10,3\n"), HasSubstr("in.csv:2:1: label 10 is outside [0, 10)"));
  EXPECT_THAT(ErrorOf("1,2\n-1,3\n"), HasSubstr("label -1 is outside"));
  EXPECT_THAT(ErrorOf("1,2,\n"), HasSubstr("in.csv:1:5: empty feature field"));
  EXPECT_THAT(ErrorOf("1,nan\n"), HasSubstr("in.csv:1:3: feature 'nan' is not finite"));
  EXPECT_THAT(ErrorOf("1,1e99\n"), HasSubstr("out of float range"));
  EXPECT_THAT(ErrorOf("1\n"), HasSubstr("in.csv:1:1: a row needs a label and at least one"));
  EXPECT_THAT(ErrorOf("a,b,c\n1,2\n"), HasSubstr("row has 2 fields but the header has 3"));
}

TEST(CsvTest, NoExamplesIsAnError) {
  EXPECT_THAT(ErrorOf(""), HasSubstr("in.csv: no examples"));
  EXPECT_THAT(ErrorOf("label,x\n\n"), HasSubstr("no examples"));
}

TEST(CsvTest, RejectsBadOptions) {
  CsvOptions options;
  options.num_classes = 0;
  EXPECT_FALSE(ParseCsvDataset("0,1\n", "in.csv", options).ok());
}

TEST(CsvFileTest, LoadsFileAndReportsItsPath) {
  test_files::TempDir dir;
  const std::string path = dir.File("train.csv");
  test_files::WriteRaw(path, "y,x0,x1\n1,0.25,0.5\n0,1,2\n");
  auto d = LoadCsvDataset(path);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 2);
  EXPECT_EQ(d->feature_dim, 2);

  test_files::WriteRaw(path, "1,0.25,0.5\n0,1,?\n");
  EXPECT_THAT(LoadCsvDataset(path).status().message(), HasSubstr(path + ":2:5:"));
  EXPECT_EQ(LoadCsvDataset(dir.File("absent.csv")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(LoadCsvDataset(dir.path()).status().message(), HasSubstr("is a directory"));
}

}  // namespace
}  // namespace huddle::data
