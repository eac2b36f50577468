#include "common/tensor.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_join.h"

namespace huddle {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kUint32:
      return "uint32";
    case DType::kUint64:
      return "uint64";
    case DType::kUint8:
      return "uint8";
  }
  return "unknown";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kUint32:
      return 4;
    case DType::kUint64:
      return 8;
    case DType::kUint8:
      return 1;
  }
  return 0;
}

int64_t TensorSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

Tensor::Tensor(std::string name, std::vector<int64_t> shape) {
  spec.name = std::move(name);
  spec.shape = std::move(shape);
  data.assign(static_cast<size_t>(spec.NumElements()), 0.0f);
}

ModelLayout LayoutOf(const TensorList& tensors) {
  ModelLayout layout;
  layout.reserve(tensors.size());
  for (const Tensor& t : tensors) layout.push_back(t.spec);
  return layout;
}

int64_t TotalElements(const ModelLayout& layout) {
  int64_t n = 0;
  for (const TensorSpec& s : layout) n += s.NumElements();
  return n;
}

Status ValidateShape(std::span<const int64_t> shape, int64_t max_elements,
                     const std::string& what) {
  constexpr size_t kMaxRank = 8;
  if (shape.size() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", shape.size(), " exceeds the maximum of ", kMaxRank));
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": shape ", ShapeString(shape), " has a dimension < 1"));
    }
    if (n > max_elements / d) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": shape ", ShapeString(shape),
                                                     " exceeds the limit of ", max_elements,
                                                     " elements"));
    }
    n *= d;
  }
  return absl::OkStatus();
}

int64_t FirstNonFinite(std::span<const float> values) {
  // Branch-free scan in blocks so the common all-finite case vectorises.
  constexpr size_t kBlock = 1024;
  for (size_t base = 0; base < values.size(); base += kBlock) {
    const size_t end = std::min(values.size(), base + kBlock);
    bool bad = false;
    for (size_t i = base; i < end; ++i) bad |= !std::isfinite(values[i]);
    if (bad) {
      for (size_t i = base; i < end; ++i) {
        if (!std::isfinite(values[i])) return static_cast<int64_t>(i);
      }
    }
  }
  return -1;
}

Status CheckFinite(const TensorList& list, absl::string_view what) {
  for (const Tensor& t : list) {
    const int64_t bad = FirstNonFinite(t.data);
    if (bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " tensor '", t.name(), "' element ", bad, " is ", t.data[bad]));
    }
  }
  return absl::OkStatus();
}

}  // namespace huddle
