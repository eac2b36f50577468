#include "client/python/tensors.h"

#include <pybind11/numpy.h>

#include <bit>
#include <cstring>
#include <functional>
#include <numeric>
#include <string_view>

namespace huddle::client::python {
namespace py = pybind11;
using namespace pybind11::literals;

namespace {

// A buffer view that is released when it goes out of scope.
class BufferView {
 public:
  BufferView() = default;
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  ~BufferView() { Release(); }

  // Asks `obj` for a strided, formatted, possibly read-only view; false (and no Python error set)
  // when it has none.
  bool Acquire(py::handle obj) {
    Release();
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      return false;
    }
    held_ = true;
    return true;
  }
  void Release() {
    if (held_) PyBuffer_Release(&view_);
    held_ = false;
  }
  const Py_buffer& view() const { return view_; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// What a buffer's element type is to us.
enum class Element { kFloat32, kFloat64, kOtherFloating, kNotFloating };

// The struct-module format of one element, e.g. "f", "<d", "=e".
Element Classify(const char* format) {
  std::string_view f = format != nullptr ? format : "B";
  bool native = true;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<' || f[0] == '>' || f[0] == '!')) {
    const bool little = f[0] == '<';
    const bool big = f[0] == '>' || f[0] == '!';
    native = (!little && !big) || (little == (std::endian::native == std::endian::little));
    f.remove_prefix(1);
  }
  if (f.size() != 1) return Element::kNotFloating;  // complex ("Zf"), records, ...
  switch (f[0]) {
    case 'f':
      return native ? Element::kFloat32 : Element::kOtherFloating;
    case 'd':
      return native ? Element::kFloat64 : Element::kOtherFloating;
    case 'e':
    case 'g':
      return Element::kOtherFloating;
    default:
      return Element::kNotFloating;
  }
}

// "tensor 2 of 8, 'conv1.weight'": how errors name a tensor.
std::string Label(size_t index, size_t count, const std::string& name) {
  return "tensor " + std::to_string(index) + " of " + std::to_string(count) + ", '" + name + "'";
}

std::string TypeName(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

// How an object's element type reads in an error: its dtype if it has one, else the format.
std::string DtypeOf(py::handle obj, const char* format) {
  if (py::hasattr(obj, "dtype")) return py::str(obj.attr("dtype"));
  return std::string("buffer format '") + (format != nullptr ? format : "B") + "'";
}

// Copies the view's elements (type T, any strides) into out, in C order.
template <typename T>
void CopyStrided(const Py_buffer& v, float* out) {
  const int ndim = v.ndim;
  const auto* base = static_cast<const char*>(v.buf);
  if (ndim == 0) {
    T x;
    std::memcpy(&x, base, sizeof(T));
    out[0] = static_cast<float>(x);
    return;
  }
  if (PyBuffer_IsContiguous(&v, 'C') != 0) {
    const Py_ssize_t n = v.len / static_cast<Py_ssize_t>(sizeof(T));
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(out, base, static_cast<size_t>(v.len));
    } else {
      for (Py_ssize_t i = 0; i < n; ++i) {
        T x;
        std::memcpy(&x, base + i * static_cast<Py_ssize_t>(sizeof(T)), sizeof(T));
        out[i] = static_cast<float>(x);
      }
    }
    return;
  }
  // An odometer over the leading dimensions; the last one is the inner loop.
  std::vector<Py_ssize_t> index(static_cast<size_t>(ndim), 0);
  const Py_ssize_t inner = v.shape[ndim - 1];
  const Py_ssize_t inner_stride = v.strides[ndim - 1];
  while (true) {
    const char* row = base;
    for (int d = 0; d < ndim - 1; ++d) row += index[static_cast<size_t>(d)] * v.strides[d];
    for (Py_ssize_t i = 0; i < inner; ++i) {
      T x;
      std::memcpy(&x, row + i * inner_stride, sizeof(T));
      *out++ = static_cast<float>(x);
    }
    int d = ndim - 2;
    for (; d >= 0; --d) {
      if (++index[static_cast<size_t>(d)] < v.shape[d]) break;
      index[static_cast<size_t>(d)] = 0;
    }
    if (d < 0) return;
  }
}

// One tensor: `obj` checked against `info` and copied into `out` (its values and shape).
void ConvertTensor(py::handle obj, const TensorInfo& info, const std::string& label,
                   NamedTensor* out) {
  py::object array = py::reinterpret_borrow<py::object>(obj);
  BufferView buffer;
  if (!buffer.Acquire(array)) {
    // No buffer protocol (a torch tensor): numpy's view of it, through __array__ and friends.
    try {
      array = py::module_::import("numpy").attr("asarray")(obj);
    } catch (py::error_already_set& e) {
      const std::string type = py::str(e.type().attr("__name__"));
      const std::string message = py::str(e.value());
      throw py::type_error(label + ": a " + TypeName(obj) + " cannot be read as an array (" + type +
                           ": " + message + ")");
    }
    if (!buffer.Acquire(array)) {
      throw py::type_error(label + ": numpy.asarray gave no buffer for a " + TypeName(obj));
    }
  }
  Element element = Classify(buffer.view().format);
  if (element == Element::kNotFloating) {
    throw py::type_error(label + ": dtype " + DtypeOf(array, buffer.view().format) +
                         " is not a floating type; tensors are float32 (e.g. .astype(\"float32\")"
                         " or .float())");
  }
  std::vector<int64_t> shape(buffer.view().shape, buffer.view().shape + buffer.view().ndim);
  if (shape != info.shape) {
    throw py::value_error(label + ": shape " + ShapeString(shape) + ", the model's is " +
                          ShapeString(info.shape));
  }
  if (element == Element::kOtherFloating) {
    // float16, long double, a foreign byte order: numpy converts, then the copy below.
    buffer.Release();
    py::module_ numpy = py::module_::import("numpy");
    array = numpy.attr("asarray")(array, "dtype"_a = numpy.attr("float32"));
    if (!buffer.Acquire(array)) throw py::type_error(label + ": numpy gave no float32 buffer");
    element = Element::kFloat32;
  }
  const int64_t count =
      std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  out->name = info.name;
  out->shape = std::move(shape);
  out->values.resize(static_cast<size_t>(count));
  if (count == 0) return;
  if (element == Element::kFloat32) {
    CopyStrided<float>(buffer.view(), out->values.data());
  } else {
    CopyStrided<double>(buffer.view(), out->values.data());
  }
}

std::string NameList(const std::vector<TensorInfo>& expected) {
  std::string s;
  for (size_t i = 0; i < expected.size() && i < 6; ++i) {
    s += (i > 0 ? ", " : "") + expected[i].name;
  }
  if (expected.size() > 6) s += ", ...";
  return s;
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::vector<TensorInfo> InfoOf(const NamedTensors& tensors) {
  std::vector<TensorInfo> out;
  out.reserve(tensors.size());
  for (const NamedTensor& t : tensors) out.push_back({t.name, t.shape});
  return out;
}

py::list TensorsToPython(const NamedTensors& tensors) {
  py::list out;
  for (const NamedTensor& t : tensors) {
    const std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    py::array_t<float, py::array::c_style> array(shape);
    if (static_cast<size_t>(array.size()) != t.values.size()) {
      throw py::value_error("tensor '" + t.name + "' has " + std::to_string(t.values.size()) +
                            " values for shape " + ShapeString(t.shape));
    }
    if (!t.values.empty()) {
      std::memcpy(array.mutable_data(), t.values.data(), t.values.size() * sizeof(float));
    }
    out.append(std::move(array));
  }
  return out;
}

NamedTensors TensorsFromPython(py::handle obj, const std::vector<TensorInfo>& expected) {
  const size_t n = expected.size();
  NamedTensors out(n);
  if (py::isinstance(obj, py::module_::import("collections.abc").attr("Mapping"))) {
    const py::object mapping = py::reinterpret_borrow<py::object>(obj);
    for (size_t i = 0; i < n; ++i) {
      const py::str key(expected[i].name);
      if (!mapping.contains(key)) {
        throw py::value_error("tensor " + std::to_string(i) + " of " + std::to_string(n) + ", '" +
                              expected[i].name + "', is missing from the mapping");
      }
      const py::object item = mapping[key];
      ConvertTensor(item, expected[i], Label(i, n, expected[i].name), &out[i]);
    }
    if (py::len(mapping) != n) {
      std::string extra;
      for (py::handle key : mapping) {
        const std::string name = py::str(key);
        bool known = false;
        for (const TensorInfo& info : expected) known = known || info.name == name;
        if (!known) extra += (extra.empty() ? "'" : ", '") + name + "'";
      }
      throw py::value_error("the mapping has " + std::to_string(py::len(mapping)) +
                            " tensors, the model " + std::to_string(n) +
                            " (not the model's: " + extra + ")");
    }
    return out;
  }
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) ||
      PyObject_CheckBuffer(obj.ptr()) != 0) {
    throw py::type_error(
        "expected the model's tensors (a list in the model's order, or a dict "
        "name -> tensor), got one " +
        TypeName(obj));
  }
  py::list items;
  try {
    items = py::list(py::reinterpret_borrow<py::object>(obj));
  } catch (py::error_already_set&) {
    throw py::type_error(
        "expected the model's tensors (a list in the model's order, or a dict "
        "name -> tensor), got a value of type " +
        TypeName(obj));
  }
  if (items.size() != n) {
    throw py::value_error("got " + std::to_string(items.size()) + " tensors, the model has " +
                          std::to_string(n) + " (" + NameList(expected) + ")");
  }
  for (size_t i = 0; i < n; ++i) {
    ConvertTensor(items[i], expected[i], Label(i, n, expected[i].name), &out[i]);
  }
  return out;
}

}  // namespace huddle::client::python
