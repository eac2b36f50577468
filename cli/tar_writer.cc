#include "cli/tar_writer.h"

#include <zlib.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

namespace huddle::cli {
namespace {

constexpr size_t kBlock = 512;
constexpr size_t kNameBytes = 100;
constexpr size_t kPrefixBytes = 155;
constexpr uint64_t kMaxOctal11 = (uint64_t{1} << 33) - 1;  // 11 octal digits

// The ustar header's fields: offset and width in the 512-byte block.
struct Field {
  size_t offset;
  size_t width;
};
constexpr Field kName{0, 100}, kMode{100, 8}, kUid{108, 8}, kGid{116, 8}, kSize{124, 12},
    kMtime{136, 12}, kChecksum{148, 8}, kType{156, 1}, kMagic{257, 6}, kVersion{263, 2},
    kUname{265, 32}, kGname{297, 32}, kDevMajor{329, 8}, kDevMinor{337, 8}, kPrefix{345, 155};

void Put(std::array<char, kBlock>& block, Field f, std::string_view text) {
  std::memcpy(block.data() + f.offset, text.data(), std::min(text.size(), f.width));
}

// `value` as width-1 zero-padded octal digits and a NUL, as every numeric ustar field is.
void PutOctal(std::array<char, kBlock>& block, Field f, uint64_t value) {
  std::string digits(f.width - 1, '0');
  for (size_t i = digits.size(); i-- > 0 && value != 0; value >>= 3) {
    digits[i] = static_cast<char>('0' + (value & 7));
  }
  Put(block, f, digits);  // the last byte stays NUL
}

// Relative, '/'-separated, no ".", ".." or empty component: it extracts where it is meant to.
Status CheckPath(std::string_view path) {
  bool ok = !path.empty() && path.size() <= kNameBytes + kPrefixBytes + 1;
  size_t start = 0;
  while (ok && start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(start, end - start);
    ok = !part.empty() && part != "." && part != ".." && part.find('\0') == std::string_view::npos;
    start = end + 1;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tar: '", std::string(path.substr(0, 300)),
        "' is not a relative path of 1-256 bytes without '.', '..' or empty components"));
  }
  return absl::OkStatus();
}

// ustar's name and prefix: the name alone when it fits, else split at a '/' so that the prefix
// holds at most 155 bytes and the name at most 100.
StatusOr<std::pair<std::string, std::string>> SplitName(const std::string& name) {
  if (name.size() <= kNameBytes) return std::make_pair(std::string(), name);
  for (size_t slash = name.find('/'); slash != std::string::npos;
       slash = name.find('/', slash + 1)) {
    if (slash <= kPrefixBytes && name.size() - slash - 1 <= kNameBytes && slash + 1 < name.size()) {
      return std::make_pair(name.substr(0, slash), name.substr(slash + 1));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tar: '", name,
                   "' does not fit a ustar header (a prefix of at most 155 bytes, a '/', then "
                   "a name of at most 100)"));
}

}  // namespace

Status TarWriter::AddDirectory(std::string_view path, unsigned mode, int64_t mtime_s) {
  return AddEntry(path, '5', {}, mode, mtime_s);
}

Status TarWriter::AddFile(std::string_view path, std::string_view contents, unsigned mode,
                          int64_t mtime_s) {
  return AddEntry(path, '0', contents, mode, mtime_s);
}

Status TarWriter::AddEntry(std::string_view path_view, char type, std::string_view contents,
                           unsigned mode, int64_t mtime_s) {
  HUDDLE_RETURN_IF_ERROR(CheckPath(path_view));
  const std::string path(path_view);
  if (mode > 07777) {
    return absl::InvalidArgumentError(absl::StrCat("tar: '", path, "': mode ", mode, " > 07777"));
  }
  if (mtime_s < 0 || static_cast<uint64_t>(mtime_s) > kMaxOctal11 ||
      contents.size() > kMaxOctal11) {
    return absl::InvalidArgumentError(
        absl::StrCat("tar: '", path, "': time or size out of ustar's range"));
  }
  const std::string name = type == '5' ? absl::StrCat(path, "/") : std::string(path);
  HUDDLE_ASSIGN_OR_RETURN(auto split, SplitName(name));
  std::array<char, kBlock> h{};
  Put(h, kName, split.second);
  PutOctal(h, kMode, mode);
  PutOctal(h, kUid, 0);
  PutOctal(h, kGid, 0);
  PutOctal(h, kSize, contents.size());
  PutOctal(h, kMtime, static_cast<uint64_t>(mtime_s));
  Put(h, kType, std::string_view(&type, 1));
  Put(h, kMagic, std::string_view("ustar\0", 6));
  Put(h, kVersion, "00");
  Put(h, kUname, "root");
  Put(h, kGname, "root");
  PutOctal(h, kDevMajor, 0);
  PutOctal(h, kDevMinor, 0);
  Put(h, kPrefix, split.first);
  // The checksum: the unsigned sum of the header's bytes with its own field as spaces, written
  // as six octal digits, a NUL and a space.
  std::memset(h.data() + kChecksum.offset, ' ', kChecksum.width);
  uint64_t sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::string checksum(6, '0');
  for (size_t i = 6; i-- > 0; sum >>= 3) checksum[i] = static_cast<char>('0' + (sum & 7));
  Put(h, kChecksum, checksum + std::string("\0 ", 2));
  data_.append(h.data(), h.size());
  data_.append(contents);
  data_.append((kBlock - contents.size() % kBlock) % kBlock, '\0');
  return absl::OkStatus();
}

std::string TarWriter::Finish() {
  data_.append(2 * kBlock, '\0');
  return std::exchange(data_, {});
}

StatusOr<std::string> Gzip(std::string_view data) {
  if (data.size() > UINT32_MAX) return absl::InvalidArgumentError("gzip: input over 4 GiB");
  z_stream z{};
  // windowBits 15 + 16: a gzip wrapper with zlib's default header (no name, time 0, OS Unix).
  if (deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::InternalError("gzip: deflateInit2 failed");
  }
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  const size_t written = z.total_out;
  deflateEnd(&z);
  if (rc != Z_STREAM_END) {
    return absl::InternalError(absl::StrCat("gzip: deflate failed (", rc, ")"));
  }
  out.resize(written);
  return out;
}

}  // namespace huddle::cli
