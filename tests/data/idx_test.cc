// ReadIdxUbyte: raw and gzipped files, row selection while streaming, and every corruption.
#include "data/idx.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "tests/data/test_files.h"

namespace huddle::data {
namespace {

using test_files::IdxHeader;
using test_files::TempDir;
using test_files::ToBytes;
using test_files::WriteGzip;
using test_files::WriteRaw;
using ::testing::HasSubstr;

// n items of item_size bytes; item i's bytes are (i * 7 + j) mod 256.
std::vector<uint8_t> Payload(int64_t n, int64_t item_size) {
  std::vector<uint8_t> values(static_cast<size_t>(n * item_size));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < item_size; ++j) values[i * item_size + j] = (i * 7 + j) % 256;
  }
  return values;
}

class IdxTest : public ::testing::TestWithParam<bool> {
 protected:
  // Writes `bytes` gzipped or raw depending on the test parameter; returns the path.
  std::string Write(const std::string& bytes) {
    const std::string path = dir_.File(GetParam() ? "file.gz" : "file.idx");
    if (GetParam()) {
      WriteGzip(path, bytes);
    } else {
      WriteRaw(path, bytes);
    }
    return path;
  }
  TempDir dir_;
};

TEST_P(IdxTest, ReadsAllItems) {
  const auto payload = Payload(5, 6);
  const std::string path = Write(IdxHeader({5, 2, 3}) + ToBytes(payload));
  auto array = ReadIdxUbyte(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int64_t>{5, 2, 3}));
  EXPECT_EQ(array->item_size, 6);
  EXPECT_EQ(array->num_kept(), 5);
  EXPECT_EQ(array->values, payload);
}

TEST_P(IdxTest, ReadsRankOneLabels) {
  const std::vector<uint8_t> labels = {3, 1, 4, 1, 5, 9, 2, 6};
  auto array = ReadIdxUbyte(Write(IdxHeader({8}) + ToBytes(labels)));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->item_size, 1);
  EXPECT_EQ(array->values, labels);
}

TEST_P(IdxTest, KeepsOnlySelectedRowsAcrossChunks) {
  // 3000 items of 784 bytes span several 1 MiB read chunks.
  const int64_t n = 3000, item = 784;
  const auto payload = Payload(n, item);
  const std::string path = Write(IdxHeader({3000, 28, 28}) + ToBytes(payload));
  const std::vector<int64_t> rows = {0, 1, 1336, 1337, 1338, 2674, 2999};
  auto array = ReadIdxUbyte(path, &rows);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims[0], n);  // the file's count, not the kept count
  ASSERT_EQ(array->num_kept(), static_cast<int64_t>(rows.size()));
  for (size_t k = 0; k < rows.size(); ++k) {
    const std::vector<uint8_t> got(array->values.begin() + k * item,
                                   array->values.begin() + (k + 1) * item);
    const std::vector<uint8_t> want(payload.begin() + rows[k] * item,
                                    payload.begin() + (rows[k] + 1) * item);
    EXPECT_EQ(got, want) << "row " << rows[k];
  }
  const std::vector<int64_t> none;
  auto empty = ReadIdxUbyte(path, &none);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->num_kept(), 0);
}

TEST_P(IdxTest, RejectsBadRowSelections) {
  const std::string path = Write(IdxHeader({4, 2}) + ToBytes(Payload(4, 2)));
  const std::vector<int64_t> out_of_range = {1, 4};
  EXPECT_THAT(ReadIdxUbyte(path, &out_of_range).status().message(), HasSubstr("row 4 is outside"));
  const std::vector<int64_t> negative = {-1};
  EXPECT_FALSE(ReadIdxUbyte(path, &negative).ok());
  const std::vector<int64_t> unsorted = {2, 1};
  EXPECT_THAT(ReadIdxUbyte(path, &unsorted).status().message(), HasSubstr("strictly increasing"));
  const std::vector<int64_t> duplicate = {1, 1};
  EXPECT_FALSE(ReadIdxUbyte(path, &duplicate).ok());
}

TEST_P(IdxTest, RejectsBadMagic) {
  std::string bytes = IdxHeader({2}) + "ab";
  bytes[0] = 0x1f;
  auto result = ReadIdxUbyte(Write(bytes));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("not an IDX file"));
  EXPECT_THAT(result.status().message(), HasSubstr("file."));  // names the file
}

TEST_P(IdxTest, RejectsUnsupportedType) {
  auto result = ReadIdxUbyte(Write(IdxHeader({2}, 0x0D) + std::string(8, '\0')));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("0x0d (float32) is not supported"));
}

TEST_P(IdxTest, RejectsBadRank) {
  EXPECT_THAT(ReadIdxUbyte(Write(IdxHeader({}))).status().message(), HasSubstr("rank 0"));
  EXPECT_THAT(ReadIdxUbyte(Write(IdxHeader({1, 1, 1, 1, 1}) + "x")).status().message(),
              HasSubstr("rank 5"));
}

TEST_P(IdxTest, RejectsZeroDimension) {
  EXPECT_THAT(ReadIdxUbyte(Write(IdxHeader({3, 0}))).status().message(),
              HasSubstr("dimension 1 is 0"));
}

TEST_P(IdxTest, RejectsHugeDimensionsWithoutAllocating) {
  auto result = ReadIdxUbyte(Write(IdxHeader({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}) + "abc"));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("exceed the limit"));
  // Within the limit but far beyond the data: a truncation error, not a giant allocation.
  auto truncated = ReadIdxUbyte(Write(IdxHeader({1000000, 1000}) + "abc"));
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(truncated.status().message(), HasSubstr("ends inside item 0"));
}

TEST_P(IdxTest, RejectsTruncatedHeader) {
  EXPECT_EQ(ReadIdxUbyte(Write("")).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadIdxUbyte(Write(std::string(3, '\0'))).status().code(), absl::StatusCode::kDataLoss);
  const std::string header = IdxHeader({5, 2, 3});
  auto result = ReadIdxUbyte(Write(header.substr(0, header.size() - 2)));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(result.status().message(), HasSubstr("header ends inside its 3 dimensions"));
}

TEST_P(IdxTest, RejectsTruncatedData) {
  const std::string full = IdxHeader({5, 6}) + ToBytes(Payload(5, 6));
  auto result = ReadIdxUbyte(Write(full.substr(0, full.size() - 7)));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(result.status().message(), HasSubstr("promises 5 items of 6 bytes"));
  EXPECT_THAT(result.status().message(), HasSubstr("inside item 3"));
}

TEST_P(IdxTest, RejectsTrailingGarbage) {
  auto result = ReadIdxUbyte(Write(IdxHeader({2, 2}) + ToBytes(Payload(2, 2)) + "!"));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(result.status().message(), HasSubstr("trailing data"));
}

INSTANTIATE_TEST_SUITE_P(RawAndGzip, IdxTest, ::testing::Bool(),
                         [](const auto& param_info) { return param_info.param ? "Gzip" : "Raw"; });

TEST(IdxGzipTest, RejectsTruncatedCompressedStream) {
  TempDir dir;
  const std::string path = dir.File("cut.gz");
  WriteGzip(path, IdxHeader({1000, 100}) + ToBytes(Payload(1000, 100)));
  const std::string compressed = test_files::ReadRaw(path);
  WriteRaw(path, compressed.substr(0, compressed.size() / 2));
  auto result = ReadIdxUbyte(path);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
}

TEST(IdxGzipTest, RejectsCorruptCompressedStream) {
  TempDir dir;
  const std::string path = dir.File("corrupt.gz");
  WriteGzip(path, IdxHeader({1000, 100}) + ToBytes(Payload(1000, 100)));
  std::string compressed = test_files::ReadRaw(path);
  for (size_t i = 20; i < compressed.size() - 8; i += 3)
    compressed[i] = static_cast<char>(~compressed[i]);
  WriteRaw(path, compressed);
  auto result = ReadIdxUbyte(path);
  EXPECT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("corrupt.gz"));
}

TEST(IdxGzipTest, MissingFileIsNotFound) {
  TempDir dir;
  auto result = ReadIdxUbyte(dir.File("absent.gz"));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(result.status().message(), HasSubstr("absent.gz"));
}

}  // namespace
}  // namespace huddle::data
