// StreamingAggregator: exact, order-independent weighted sum of model updates.
//
// The coordinator folds each client's update into the aggregator as it arrives; memory is 12 bytes
// per model parameter (an int64 sum and an int32 partial sum, below), nothing per client. Folding
// the same set of (update, weight) pairs in any order gives a bitwise-identical result, so a job's
// seeds determine its model whatever the arrival order.
//
// How: exact fixed-point integer accumulation. With S = fraction_bits(), each value x of an update
// with weight w becomes the integer term
//     q = round_half_even(double(x) * double(w) * 2^S),
// a function of (x, w) alone, and the accumulator of each parameter is the int64 sum of its terms.
// Integer addition is associative, so the sum does not depend on the order of the folds.
//   S = 51 - ceil(log2(max_weight)) - ceil(log2(max_abs_value)),
// which keeps every |q| <= 2^51 (needed by the vectorised double -> int64 conversion).
//
// Precision: each term is off by at most 2^-(S+1) from w * x (for weights up to 2^29; above that
// double(x) * double(w) itself rounds, adding up to 2^-(S+2)), so a weighted mean is off by at most
// that much divided by the smallest weight, before the final rounding to float. With the defaults
// (max_weight 2^24, max_abs_value 1024) S = 17: an error of at most 3.8e-6 at weight 1.
// Tighter bounds buy precision: e.g. max_abs_value = the clip norm and max_weight = 1 under
// client-level DP give S = 51 - ceil(log2(clip norm)).
//
// Storage: each parameter's sum is an int64 plus an int32 partial sum. A fold adds a chunk of
// 16384 values to the int32 partial sums and then checks the chunk's running bound (the largest
// term it could have added, summed since the partial sums were last emptied); when that bound
// shows an overflow was possible, the wrapped additions are undone exactly and the terms go to the
// int64 sums, emptying the partial sums into them first when the terms are small enough that
// this pays. Terms too large for the partial sums (e.g. DP's many fraction bits) then go to the
// int64 sums directly. Integer sums are exact either way,
// so where a term lands changes no result, only the memory traffic: 12 bytes a value in the
// int32 path (the float read, the int32 read and written) against 20 in the int64 path, where
// memcpy moves 12 (bench/aggregation_bench).
//
// Capacity: the aggregator keeps a running bound, the sum over folded updates of
// w * ceil(max_abs_value * 2^S) (>= that update's largest |q|), and refuses a fold that would push
// it past 2^62; no accumulator can then overflow. At the defaults that is 2048 folds at weight
// 2^24, or 2^35 folds at weight 1.
//
// Requirements: the default floating-point rounding mode (round to nearest) in the calling thread.
// Flush-to-zero / denormals-are-zero do not change any result (all terms are far from subnormal).
//
// Thread-safety: none. One thread folds at a time; const methods may run concurrently with each
// other but not with Fold/Reset.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"

namespace huddle::aggregation {

struct AggregatorOptions {
  // Largest accepted weight (e.g. an example count). In [1, 2^53].
  int64_t max_weight = int64_t{1} << 24;
  // Largest accepted |value| in an update. In [2^-64, 2^51], and
  // ceil(log2(max_weight)) + ceil(log2(max_abs_value)) <= 51 (so that S >= 0).
  double max_abs_value = 1024.0;
  // S itself, when >= 0 (e.g. so that the grid 2^-S is a privacy noise grid); it must still keep
  // ceil(log2(max_weight)) + ceil(log2(max_abs_value)) + S <= 51. -1: derived as above.
  int fraction_bits = -1;
};

class StreamingAggregator {
 public:
  // `layout`: the float32 tensors every update must have, in order. InvalidArgument for an empty
  // layout, a non-float32 tensor, an invalid shape or options out of range; ResourceExhausted if
  // the accumulators cannot be allocated.
  static StatusOr<StreamingAggregator> Create(ModelLayout layout, AggregatorOptions options = {});

  // Back to empty; keeps the accumulator buffer (no reallocation).
  void Reset();
  // Back to empty with new options (same layout; the buffer is kept). Errors as for Create; on
  // error the aggregator is unchanged.
  Status Reset(const AggregatorOptions& options);

  // Adds integers, in units of 2^-S, to the sums of parameters [offset, offset + units.size())
  // (flat index over the layout): how exact discrete noise joins the sum (privacy/noise.h). Each
  // call raises the capacity bound by max |units|. InvalidArgument for a range outside the
  // layout; ResourceExhausted past the capacity bound (state unchanged on error).
  Status AddUnits(size_t offset, std::span<const int64_t> units);

  // Folds one update: tensors[i] must hold layout()[i].NumElements() floats; weight in
  // [1, max_weight]. The span data is only read during the call.
  // Validates each chunk before adding it: a non-finite value or |value| > max_abs_value makes it
  // subtract exactly what it had added and return InvalidArgument naming the tensor, the
  // element index within it and the value. A wrong tensor count or size, or a weight out of range,
  // is InvalidArgument naming the expected and actual values; a fold past the capacity bound is
  // ResourceExhausted. On any error the sums, count and total weight are unchanged (Finalize
  // gives bitwise the same result).
  Status Fold(std::span<const std::span<const float>> tensors, int64_t weight);
  // As Fold, with every term discounted: each value x adds x * weight * discount (rounded once,
  // as above) while the total weight grows by `weight`, so WeightedMean gives
  // sum_k w_k d_k x_k / sum_k w_k (buffered asynchronous training's staleness factor).
  // `discount` must lie in (0, 1] (InvalidArgument otherwise), so no term exceeds Fold's bound.
  Status Fold(std::span<const std::span<const float>> tensors, int64_t weight, double discount);

  // Updates folded since Create/Reset.
  int64_t count() const { return count_; }
  // Sum of their weights (exact).
  int64_t total_weight() const { return total_weight_; }

  // out[i] = (sum_k w_k x_k[i]) / divisor, computed from the exact integer sums in double and
  // rounded to float. `divisor` must be finite and > 0 (InvalidArgument otherwise). `out` is
  // resized to the layout (names and shapes), reusing its buffers when they already fit. A result
  // outside the float range is OutOfRange naming the tensor and element (out is then unspecified).
  // The result is a deterministic function of the folded set and the divisor.
  Status Finalize(double divisor, TensorList* out) const;

  // Finalize(total_weight()); FailedPrecondition if nothing has been folded.
  Status WeightedMean(TensorList* out) const;

  const ModelLayout& layout() const { return layout_; }
  // Number of parameters (accumulators) in the layout.
  size_t size() const { return acc_.size(); }
  // S in the formula above.
  int fraction_bits() const { return fraction_bits_; }

 private:
  StreamingAggregator(ModelLayout layout, AggregatorOptions options, int fraction_bits);
  void SetOptions(const AggregatorOptions& options, int fraction_bits);

  // Adds the terms of the n values at x to the sums of parameters [offset, offset + n), which form
  // chunk `chunk`: into the int32 partial sums when their bound has room (emptying them into the
  // int64 sums first when that pays), else into the int64 sums. False, with nothing added, if a
  // value is non-finite or above max_abs_value.
  bool AddChunk(const float* x, size_t n, double scale, size_t offset, size_t chunk);
  // Subtracts the terms of tensors[0, tensor) and of tensors[tensor][0, end): undoes a partial
  // fold.
  void RollBack(std::span<const std::span<const float>> tensors, size_t tensor, size_t end,
                double scale);

  ModelLayout layout_;
  AggregatorOptions options_;
  int fraction_bits_ = 0;
  std::vector<size_t> offsets_;        // offsets_[i]: first accumulator of tensor i
  std::vector<size_t> chunk_offsets_;  // chunk_offsets_[i]: first chunk of tensor i
  // Each sum is int64(acc_[i] + uint64(narrow_[i])): two's-complement int64 sums stored as
  // uint64_t, so that rolling back a term added to narrow_ by subtracting it from acc_ wraps
  // harmlessly; and int32 partial sums, each chunk's bounded by narrow_bound_[chunk] < 2^31.
  std::vector<uint64_t> acc_;
  std::vector<int32_t> narrow_;
  std::vector<int64_t> narrow_bound_;
  // 1 where the chunk's last fold went to the int64 sums (its terms were too large): the next
  // fold goes there first too, instead of trying the partial sums and undoing. Kept by Reset.
  std::vector<uint8_t> chunk_wide_;
  uint32_t abs_bits_limit_ = 0;  // internal::AbsBitsLimit(max_abs_value)
  int64_t unit_bound_ = 0;       // ceil(max_abs_value * 2^S): bound on |q| / w
  int64_t bound_ = 0;            // running capacity bound, <= 2^62
  int64_t count_ = 0;
  int64_t total_weight_ = 0;
};

}  // namespace huddle::aggregation
