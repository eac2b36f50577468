// Tensors and parameter lists: the unit of data every module exchanges.
//
// A model's parameters are an ordered list of named float32 tensors (`TensorList`). The wire
// carries each tensor as one raw frame described by a `TensorSpec`; `ModelLayout` is the list of
// specs a round expects, against which every incoming update is validated.
//
// Thread-safety: plain values; no internal synchronisation.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace huddle {

// Element type of a tensor frame: float32 for models and updates; unsigned integers only for the
// words of a securely aggregated update (aggregation/secagg/), which the codec accepts on that
// message alone.
enum class DType : uint8_t { kFloat32 = 1, kUint32 = 2, kUint64 = 3, kUint8 = 4 };

const char* DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

// Name, dtype and shape of one tensor (no data).
struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;

  // Product of the dimensions (1 for a scalar). Shapes are validated before this is called.
  int64_t NumElements() const;
  int64_t ByteLength() const { return NumElements() * static_cast<int64_t>(DTypeSize(dtype)); }
  bool operator==(const TensorSpec&) const = default;
};

// "[128,784]"
std::string ShapeString(std::span<const int64_t> shape);

// A named float32 tensor that owns its data (row-major).
struct Tensor {
  TensorSpec spec;
  std::vector<float> data;

  Tensor() = default;
  Tensor(std::string name, std::vector<int64_t> shape);  // zero-filled
  const std::string& name() const { return spec.name; }
  int64_t NumElements() const { return static_cast<int64_t>(data.size()); }
};

using TensorList = std::vector<Tensor>;
using ModelLayout = std::vector<TensorSpec>;

ModelLayout LayoutOf(const TensorList& tensors);
int64_t TotalElements(const ModelLayout& layout);

// Checks that `shape` is a valid tensor shape: every dimension >= 1, rank <= 8, and at most
// `max_elements` elements in total (no overflow on the way). `what` names the tensor in errors.
Status ValidateShape(std::span<const int64_t> shape, int64_t max_elements, const std::string& what);

// Returns the index of the first non-finite value in `values`, or -1 if all are finite.
int64_t FirstNonFinite(std::span<const float> values);
// InvalidArgument naming `what`, the tensor and the element when any value of `list` is not finite.
Status CheckFinite(const TensorList& list, absl::string_view what);

}  // namespace huddle
