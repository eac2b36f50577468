#include "proto/codec.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "huddle.pb.h"
#include "proto/internal/convert.h"

namespace huddle::wire {
namespace {

using internal::BodyFromProto;
using internal::BodyToProto;
using internal::CheckString;
using internal::DTypeFromProto;
using internal::DTypeToProto;
using internal::Malformed;

// Buffers for tensors that arrive in several chunks. A freed buffer is kept for the next tensor of
// the same size (every update of a job has the same shapes), so each reassembly is one memcpy
// rather than a fresh mapping that page-faults on every 4 KiB (measured: 3/4 of the cost of
// reassembling a 40 MB update). At most kMaxCached buffers (8 updates in flight: a freed buffer
// past the cap is unmapped and the next update faults in fresh pages) and kMaxCachedBytes are kept.
class ReassemblyPool {
 public:
  static ReassemblyPool& Get() {
    static auto* pool = new ReassemblyPool;  // never destroyed: buffers may be freed at exit
    return *pool;
  }

  std::shared_ptr<float[]> Take(size_t floats) {
    float* buffer = nullptr;
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].first == floats) {
          buffer = free_[i].second;
          cached_bytes_ -= floats * sizeof(float);
          free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
    }
    if (buffer == nullptr) buffer = new float[floats];  // not zero-filled: fully overwritten
    return std::shared_ptr<float[]>(buffer, [this, floats](float* p) { Give(p, floats); });
  }

 private:
  static constexpr size_t kMaxCached = 8;
  static constexpr size_t kMaxCachedBytes = size_t{512} << 20;

  void Give(float* p, size_t floats) {
    {
      absl::MutexLock lock(&mu_);
      if (free_.size() < kMaxCached && cached_bytes_ + floats * sizeof(float) <= kMaxCachedBytes) {
        free_.emplace_back(floats, p);
        cached_bytes_ += floats * sizeof(float);
        return;
      }
    }
    delete[] p;
  }

  absl::Mutex mu_;
  std::vector<std::pair<size_t, float*>> free_ ABSL_GUARDED_BY(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

bool CarriesTensors(MessageType t) {
  return t == MessageType::kFitInstruction || t == MessageType::kFitResult ||
         t == MessageType::kEvaluateInstruction || t == MessageType::kSecAggMaskedInput ||
         t == MessageType::kSecAggData;
}

// The element types a message's tensors may have: a model's floats, secure aggregation's words
// (one width for the whole message), or a secure-aggregation stage's bytes.
Status CheckDType(MessageType t, pb::DType d, pb::DType first, const std::string& what) {
  if (t == MessageType::kSecAggData) {
    if (d != pb::DTYPE_UINT8) {
      return Malformed(absl::StrCat(what, " has dtype ", static_cast<int>(d),
                                    ": a secure-aggregation stage's frame is uint8 (4)"));
    }
    return absl::OkStatus();
  }
  if (t != MessageType::kSecAggMaskedInput) {
    if (d != pb::DTYPE_FLOAT32) {
      return Malformed(
          absl::StrCat(what, " has dtype ", static_cast<int>(d), ", expected float32 (1)"));
    }
    return absl::OkStatus();
  }
  if ((d != pb::DTYPE_UINT32 && d != pb::DTYPE_UINT64) || d != first) {
    return Malformed(absl::StrCat(what, " has dtype ", static_cast<int>(d),
                                  ": a masked input's words are all uint32 (2) or all uint64 (3)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncodeHeader(const Message& msg) {
  pb::Header h;
  h.set_protocol_version(msg.protocol_version);
  h.set_round(msg.round);
  h.set_sender(msg.sender);
  for (const TensorPayload& t : msg.tensors) {
    auto* spec = h.add_tensors();
    spec->set_name(t.spec.name);
    spec->set_dtype(DTypeToProto(t.spec.dtype));
    for (int64_t d : t.spec.shape) spec->add_shape(d);
    spec->set_byte_length(t.bytes.size());
  }
  BodyToProto(msg.body, &h);
  return h.SerializeAsString();
}

StatusOr<Message> Decode(std::span<const Frame> frames, const CodecLimits& limits) {
  if (frames.empty()) return Malformed("no frames");
  const Frame& head = frames[0];
  if (head.bytes.size() > limits.max_header_bytes) {
    return Malformed(
        absl::StrCat("header is ", head.bytes.size(), " bytes, limit ", limits.max_header_bytes));
  }
  pb::Header h;
  if (!h.ParseFromArray(head.bytes.data(), static_cast<int>(head.bytes.size()))) {
    return Malformed("header does not parse as a protobuf Header");
  }
  if (h.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("protocol version mismatch: peer speaks version ", h.protocol_version(),
                     ", this build speaks version ", kProtocolVersion));
  }
  HUDDLE_RETURN_IF_ERROR(CheckString(h.sender(), limits.max_string_bytes, "sender"));
  HUDDLE_ASSIGN_OR_RETURN(Body body, BodyFromProto(h, limits));

  Message msg;
  msg.protocol_version = h.protocol_version();
  msg.round = h.round();
  msg.sender = h.sender();
  msg.body = std::move(body);

  const size_t n = static_cast<size_t>(h.tensors_size());
  if (n > limits.max_tensors) {
    return Malformed(absl::StrCat("header lists ", n, " tensors, limit ", limits.max_tensors));
  }
  if (frames.size() > limits.max_frames) {
    return Malformed(absl::StrCat(frames.size(), " frames, limit ", limits.max_frames));
  }
  if (n > 0 && !CarriesTensors(msg.type())) {
    return Malformed(absl::StrCat(MessageTypeName(msg.type()), " must not carry tensors"));
  }
  if (n == 0 && frames.size() > 1) {
    return Malformed(
        absl::StrCat("header lists no tensors but ", frames.size() - 1, " tensor frames follow"));
  }
  if (msg.type() == MessageType::kSecAggData &&
      (n != 1 || h.tensors(0).name() != "secagg" || h.tensors(0).shape_size() != 1)) {
    return Malformed("secagg_data carries exactly one frame, 'secagg', of one dimension");
  }
  msg.tensors.reserve(n);
  size_t next_frame = 1;
  for (size_t i = 0; i < n; ++i) {
    const pb::TensorSpec& s = h.tensors(static_cast<int>(i));
    const std::string what = absl::StrCat("tensor ", i, " ('", s.name().substr(0, 64), "')");
    HUDDLE_RETURN_IF_ERROR(CheckString(s.name(), limits.max_string_bytes, what + " name"));
    if (s.name().empty()) return Malformed(absl::StrCat("tensor ", i, " has an empty name"));
    HUDDLE_RETURN_IF_ERROR(CheckDType(msg.type(), s.dtype(), h.tensors(0).dtype(), what));
    std::vector<int64_t> shape(s.shape().begin(), s.shape().end());
    // Also cap so the byte length (elements x 8) cannot overflow, whatever the configured limit.
    constexpr int64_t kMaxAddressableElements =
        std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(uint64_t));
    Status shape_ok =
        ValidateShape(shape, std::min(limits.max_tensor_elements, kMaxAddressableElements), what);
    if (!shape_ok.ok()) return Malformed(std::string(shape_ok.message()));
    TensorPayload p;
    p.spec.name = s.name();
    p.spec.dtype = DTypeFromProto(s.dtype());
    p.spec.shape = std::move(shape);
    const uint64_t expected = static_cast<uint64_t>(p.spec.ByteLength());
    if (s.byte_length() != expected) {
      return Malformed(absl::StrCat(what, " with shape ", ShapeString(p.spec.shape), " needs ",
                                    expected, " bytes; header says ", s.byte_length()));
    }
    // The shape bounds `expected`, so the chunk count is small; the frames must all be there.
    const size_t chunk_bytes = limits.chunk_bytes;
    const size_t chunks = ChunkCount(expected, chunk_bytes);
    if (frames.size() - next_frame < chunks) {
      return Malformed(absl::StrCat(what, " of ", expected, " bytes needs ", chunks,
                                    " frame(s); only ", frames.size() - next_frame, " remain"));
    }
    for (size_t c = 0; c < chunks; ++c) {
      const size_t want = c + 1 < chunks ? chunk_bytes : expected - c * chunk_bytes;
      const size_t got = frames[next_frame + c].bytes.size();
      if (got != want) {
        return Malformed(absl::StrCat(what, " with shape ", ShapeString(p.spec.shape), ": frame ",
                                      c + 1, " of ", chunks, " has ", got, " bytes, expected ",
                                      want));
      }
    }
    const Frame& f = frames[next_frame];
    if (chunks == 1 && reinterpret_cast<uintptr_t>(f.bytes.data()) % alignof(float) == 0) {
      p.bytes = f.bytes;
      p.owner = f.owner;
    } else {
      // Misaligned or chunked: one copy into contiguous, aligned memory (not zero-filled first).
      std::shared_ptr<float[]> copy = chunks == 1
                                          ? std::shared_ptr<float[]>(new float[(expected + 3) / 4])
                                          : ReassemblyPool::Get().Take((expected + 3) / 4);
      auto* dst = reinterpret_cast<std::byte*>(copy.get());
      for (size_t c = 0; c < chunks; ++c) {
        const Frame& part = frames[next_frame + c];
        std::memcpy(dst + c * chunk_bytes, part.bytes.data(), part.bytes.size());
      }
      p.bytes = std::span<const std::byte>(dst, expected);
      p.owner = std::move(copy);
    }
    next_frame += chunks;
    msg.tensors.push_back(std::move(p));
  }
  if (next_frame != frames.size()) {
    return Malformed(absl::StrCat("the header's ", n, " tensors take ", next_frame - 1,
                                  " frames but ", frames.size() - 1, " tensor frames follow"));
  }
  return msg;
}

std::vector<std::span<const std::byte>> Chunks(std::span<const std::byte> bytes,
                                               size_t chunk_bytes) {
  std::vector<std::span<const std::byte>> out;
  const size_t n = ChunkCount(bytes.size(), chunk_bytes);
  out.reserve(n);
  for (size_t c = 0; c < n; ++c) {
    const size_t begin = c * chunk_bytes;
    out.push_back(bytes.subspan(begin, std::min(chunk_bytes, bytes.size() - begin)));
  }
  return out;
}

std::vector<Frame> EncodeToFrames(const Message& msg, size_t chunk_bytes) {
  std::vector<Frame> frames;
  auto header = std::make_shared<std::string>(EncodeHeader(msg));
  frames.push_back(Frame{header, std::as_bytes(std::span<const char>(*header))});
  for (const TensorPayload& t : msg.tensors) {
    for (std::span<const std::byte> chunk : Chunks(t.bytes, chunk_bytes)) {
      auto copy = std::make_shared<std::vector<std::byte>>(chunk.begin(), chunk.end());
      frames.push_back(Frame{copy, std::span<const std::byte>(*copy)});
    }
  }
  return frames;
}

}  // namespace huddle::wire
