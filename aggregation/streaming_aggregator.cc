#include "aggregation/streaming_aggregator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <new>
#include <string>

#include "absl/strings/str_format.h"
#include "kernels/exact_sum.h"
#include "kernels/exact_sum_math.h"

namespace huddle::aggregation {
namespace {

constexpr int kTermBits = 51;                          // every |q| <= 2^51
constexpr int64_t kMaxBound = int64_t{1} << 62;        // capacity: sum of term bounds
constexpr int64_t kMaxWeightLimit = int64_t{1} << 53;  // weights convert to double exactly
constexpr int64_t kMaxElements = int64_t{1} << 40;
// Fold works in chunks, so that a bad value stops it early and the rollback stays short, and so
// that a chunk whose terms must move from the int32 partial sums to the int64 sums is re-read from
// cache. A chunk's partial sums carry one running bound on their magnitude.
constexpr size_t kChunk = size_t{1} << 14;
constexpr int64_t kNarrowMax = (int64_t{1} << 31) - 1;
// Above this term bound a fold that does not fit the partial sums goes to the int64 sums instead of
// emptying them first: emptying costs a pass over both, worth it when at least 32 folds follow.
constexpr int64_t kNarrowRefill = int64_t{1} << 26;

int CeilLog2(int64_t n) {  // n >= 1
  return n == 1 ? 0 : 64 - std::countl_zero(static_cast<uint64_t>(n - 1));
}

int CeilLog2(double x) {  // x > 0, finite
  int e = 0;
  const double m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return m == 0.5 ? e - 1 : e;
}

std::string DescribeBadValue(const std::string& tensor, size_t index, float value, double bound) {
  const std::string where = absl::StrCat("tensor '", tensor, "' element ", index, " is ");
  if (std::isnan(value)) return absl::StrCat(where, "NaN");
  if (std::isinf(value)) return absl::StrCat(where, value > 0 ? "inf" : "-inf");
  return absl::StrFormat("%s%.9g, %s the bound %s%g (max_abs_value)", where, value,
                         value > 0 ? "above" : "below", value > 0 ? "" : "-", bound);
}

// The largest S the options allow (see the header), or why they are invalid.
StatusOr<int> CheckOptions(const AggregatorOptions& options) {
  if (options.max_weight < 1 || options.max_weight > kMaxWeightLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_weight ", options.max_weight, " is out of range [1, 2^53]"));
  }
  const double mav = options.max_abs_value;
  if (!(mav >= std::ldexp(1.0, -64) && mav <= std::ldexp(1.0, kTermBits))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_abs_value %g is out of range [2^-64, 2^51]", mav));
  }
  const int max_bits = kTermBits - CeilLog2(options.max_weight) - CeilLog2(mav);
  if (max_bits < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_weight %d times max_abs_value %g exceeds 2^51: the fixed-point sum would have %d "
        "fraction bits (must be >= 0)",
        options.max_weight, mav, max_bits));
  }
  if (options.fraction_bits > max_bits) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fraction_bits %d is too many for max_weight %d and max_abs_value %g (at most %d)",
        options.fraction_bits, options.max_weight, mav, max_bits));
  }
  return max_bits;
}

}  // namespace

StatusOr<StreamingAggregator> StreamingAggregator::Create(ModelLayout layout,
                                                          AggregatorOptions options) {
  HUDDLE_ASSIGN_OR_RETURN(const int max_bits, CheckOptions(options));
  const int fraction_bits = options.fraction_bits >= 0 ? options.fraction_bits : max_bits;
  if (layout.empty()) return absl::InvalidArgumentError("layout has no tensors");
  int64_t total = 0;
  for (const TensorSpec& spec : layout) {
    if (spec.dtype != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "' has dtype ",
                                                     DTypeName(spec.dtype), ", expected float32"));
    }
    HUDDLE_RETURN_IF_ERROR(
        ValidateShape(spec.shape, kMaxElements, absl::StrCat("tensor '", spec.name, "'")));
    total += spec.NumElements();
    if (total > kMaxElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout has more than ", kMaxElements, " elements"));
    }
  }
  StreamingAggregator agg(std::move(layout), options, fraction_bits);
  try {
    agg.acc_.assign(static_cast<size_t>(total), 0);
    agg.narrow_.assign(static_cast<size_t>(total), 0);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate accumulators for ", total, " parameters"));
  }
  return agg;
}

StreamingAggregator::StreamingAggregator(ModelLayout layout, AggregatorOptions options,
                                         int fraction_bits)
    : layout_(std::move(layout)) {
  offsets_.reserve(layout_.size());
  chunk_offsets_.reserve(layout_.size());
  size_t offset = 0;
  size_t chunks = 0;
  for (const TensorSpec& spec : layout_) {
    const auto n = static_cast<size_t>(spec.NumElements());
    offsets_.push_back(offset);
    chunk_offsets_.push_back(chunks);
    offset += n;
    chunks += (n + kChunk - 1) / kChunk;
  }
  narrow_bound_.assign(chunks, 0);
  chunk_wide_.assign(chunks, 0);
  SetOptions(options, fraction_bits);
}

void StreamingAggregator::SetOptions(const AggregatorOptions& options, int fraction_bits) {
  options_ = options;
  fraction_bits_ = fraction_bits;
  abs_bits_limit_ = kernels::AbsBitsLimit(options_.max_abs_value);
  // max_abs_value * 2^S <= 2^(51 - ceil(log2(max_weight))): exact, and fits int64.
  unit_bound_ = static_cast<int64_t>(std::ceil(std::ldexp(options_.max_abs_value, fraction_bits)));
}

void StreamingAggregator::Reset() {
  std::fill(acc_.begin(), acc_.end(), 0);
  std::fill(narrow_.begin(), narrow_.end(), 0);
  std::fill(narrow_bound_.begin(), narrow_bound_.end(), 0);
  bound_ = 0;
  count_ = 0;
  total_weight_ = 0;
}

Status StreamingAggregator::Reset(const AggregatorOptions& options) {
  HUDDLE_ASSIGN_OR_RETURN(const int max_bits, CheckOptions(options));
  SetOptions(options, options.fraction_bits >= 0 ? options.fraction_bits : max_bits);
  Reset();
  return absl::OkStatus();
}

Status StreamingAggregator::AddUnits(size_t offset, std::span<const int64_t> units) {
  if (offset > acc_.size() || units.size() > acc_.size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("units [", offset, ", ", offset + units.size(),
                                                   ") lie outside the layout's ", acc_.size(),
                                                   " parameters"));
  }
  uint64_t max_abs = 0;
  for (int64_t u : units)
    max_abs = std::max(max_abs, u < 0 ? 0 - static_cast<uint64_t>(u) : static_cast<uint64_t>(u));
  if (max_abs > static_cast<uint64_t>(kMaxBound - bound_)) {
    return absl::ResourceExhaustedError(absl::StrCat("aggregator is full: adding units up to ",
                                                     max_abs, " could overflow the sum"));
  }
  uint64_t* acc = acc_.data() + offset;
  for (size_t i = 0; i < units.size(); ++i) acc[i] += static_cast<uint64_t>(units[i]);
  bound_ += static_cast<int64_t>(max_abs);
  return absl::OkStatus();
}

Status StreamingAggregator::Fold(std::span<const std::span<const float>> tensors, int64_t weight) {
  return Fold(tensors, weight, 1.0);
}

Status StreamingAggregator::Fold(std::span<const std::span<const float>> tensors, int64_t weight,
                                 double discount) {
  if (!(discount > 0 && discount <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("discount ", discount, " is out of range (0, 1]"));
  }
  if (weight < 1 || weight > options_.max_weight) {
    return absl::InvalidArgumentError(absl::StrCat("weight ", weight, " is out of range [1, ",
                                                   options_.max_weight, "] (max_weight)"));
  }
  if (tensors.size() != layout_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update has ", tensors.size(), " tensors, the layout expects ", layout_.size()));
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t expected = layout_[t].NumElements();
    if (static_cast<int64_t>(tensors[t].size()) != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t, " ('", layout_[t].name, "') has ", tensors[t].size(),
                       " values, the layout expects ", expected, " (shape ",
                       ShapeString(layout_[t].shape), ")"));
    }
  }
  // unit_bound_ * weight <= 2^51: no overflow.
  const int64_t term_bound = unit_bound_ * weight;
  if (term_bound > kMaxBound - bound_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "aggregator is full: folding weight ", weight, " after ", count_, " updates (total weight ",
        total_weight_,
        ") could overflow the exact sum; Finalize and Reset, or lower max_abs_value/max_weight"));
  }

  const double scale = std::ldexp(static_cast<double>(weight), fraction_bits_) * discount;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::span<const float> x = tensors[t];
    for (size_t begin = 0, chunk = chunk_offsets_[t]; begin < x.size(); begin += kChunk, ++chunk) {
      const size_t n = std::min(kChunk, x.size() - begin);
      if (AddChunk(x.data() + begin, n, scale, offsets_[t] + begin, chunk)) continue;
      size_t bad = begin;
      while (kernels::exact_sum_math::AbsBits(x[bad]) <= static_cast<int32_t>(abs_bits_limit_)) {
        ++bad;
      }
      RollBack(tensors, t, begin, scale);
      return absl::InvalidArgumentError(
          DescribeBadValue(layout_[t].name, bad, x[bad], options_.max_abs_value));
    }
  }
  bound_ += term_bound;
  total_weight_ += weight;
  ++count_;
  return absl::OkStatus();
}

bool StreamingAggregator::AddChunk(const float* x, size_t n, double scale, size_t offset,
                                   size_t chunk) {
  uint64_t* wide = acc_.data() + offset;
  int32_t* narrow = narrow_.data() + offset;
  if (chunk_wide_[chunk] != 0) {
    const uint32_t max_abs_bits = kernels::AddFixedPoint(x, n, scale, wide);
    if (max_abs_bits > abs_bits_limit_) {
      kernels::SubtractFixedPoint(x, n, scale, wide);
      return false;
    }
    // Try the partial sums again next time if terms this small would fit them.
    const int64_t term_bound = kernels::TermBound(max_abs_bits, scale);
    chunk_wide_[chunk] =
        term_bound > kNarrowRefill && term_bound > kNarrowMax - narrow_bound_[chunk];
    return true;
  }
  // Optimistically into the partial sums, in one pass that also finds the largest value; if the
  // chunk's bound then shows a partial sum could have left the int32 range, the (possibly wrapped)
  // additions are undone exactly and the terms go elsewhere.
  const uint32_t max_abs_bits = kernels::AddFixedPointNarrow(x, n, scale, narrow);
  if (max_abs_bits > abs_bits_limit_) {
    kernels::SubtractFixedPointNarrow(x, n, scale, narrow);
    return false;
  }
  const int64_t term_bound = kernels::TermBound(max_abs_bits, scale);
  int64_t& bound = narrow_bound_[chunk];
  if (term_bound <= kNarrowMax - bound) {
    bound += term_bound;
    return true;
  }
  kernels::SubtractFixedPointNarrow(x, n, scale, narrow);
  if (term_bound <= kNarrowRefill) {
    kernels::MoveNarrowToWide(narrow, n, wide);
    kernels::AddFixedPointNarrow(x, n, scale, narrow);
    bound = term_bound;
  } else {
    // Terms this large would fill the partial sums again within a few folds.
    kernels::AddFixedPoint(x, n, scale, wide);
    chunk_wide_[chunk] = 1;
  }
  return true;
}

void StreamingAggregator::RollBack(std::span<const std::span<const float>> tensors, size_t tensor,
                                   size_t end, double scale) {
  // Every term is subtracted from the int64 sums, wherever it was added: the sum of the two parts
  // is restored exactly (uint64 arithmetic wraps), and a partial sum's running bound, left as it
  // was, still bounds it.
  for (size_t t = 0; t <= tensor; ++t) {
    const size_t n = t == tensor ? end : tensors[t].size();
    kernels::SubtractFixedPoint(tensors[t].data(), n, scale, acc_.data() + offsets_[t]);
  }
}

Status StreamingAggregator::Finalize(double divisor, TensorList* out) const {
  if (!(divisor > 0) || !std::isfinite(divisor)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("divisor %g must be finite and > 0", divisor));
  }
  out->resize(layout_.size());
  const double inv_scale = std::ldexp(1.0, -fraction_bits_);
  for (size_t t = 0; t < layout_.size(); ++t) {
    Tensor& tensor = (*out)[t];
    if (tensor.spec != layout_[t]) tensor.spec = layout_[t];
    tensor.data.resize(static_cast<size_t>(layout_[t].NumElements()));
    const int64_t bad =
        kernels::FixedPointToFloat(acc_.data() + offsets_[t], narrow_.data() + offsets_[t],
                                   tensor.data.size(), inv_scale, divisor, tensor.data.data());
    if (bad >= 0) {
      return absl::OutOfRangeError(absl::StrFormat(
          "tensor '%s' element %d: the sum divided by %g is outside the float range",
          layout_[t].name, bad, divisor));
    }
  }
  return absl::OkStatus();
}

Status StreamingAggregator::WeightedMean(TensorList* out) const {
  if (count_ == 0) {
    return absl::FailedPreconditionError("weighted mean of an empty aggregator (nothing folded)");
  }
  return Finalize(static_cast<double>(total_weight_), out);
}

}  // namespace huddle::aggregation
