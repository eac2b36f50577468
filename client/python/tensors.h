// Tensors between Python and the client SDK (huddle/client/trainer.h), for the huddle_client
// module.
//
// Into Python, a model (NamedTensors) becomes a list of numpy float32 arrays in the model's order,
// each of the tensor's shape, C-contiguous and writable: a copy that the Python code owns, so it
// may keep the arrays, or alias them (torch.from_numpy), after the call returns.
//
// Out of Python, a trainer's tensors are either
//   - a sequence (any iterable but a mapping: a list, a tuple, dict.values()) in the model's order,
//   - or a mapping name -> tensor holding exactly the model's names;
// each tensor anything that exposes the buffer protocol (numpy arrays, memoryviews, array.array),
// or failing that anything numpy.asarray takes without a copy of its own making (a CPU torch
// tensor that does not require grad: its __array__ is a view). Its dtype must be a floating one
// and its shape exactly the model's (no broadcasting, no reshaping). Values are copied once into
// the result, converted on the way where needed: float32 and float64 in native byte order are
// read in place (strided or not); other floating types (float16, long double, a foreign byte
// order) go through numpy.asarray(dtype=float32) first.
//
// Errors are pybind11's TypeError (not a tensor, not floating) and ValueError (count, names,
// shape), and name the tensor: "tensor 2 of 8, 'conv1.weight': shape (32, 16, 5, 4), the model's
// is (32, 16, 5, 5)".
//
// Every function needs the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "huddle/client/trainer.h"

namespace huddle::client::python {

// A list of numpy float32 arrays, copies of `tensors`' values in their shapes.
pybind11::list TensorsToPython(const NamedTensors& tensors);

// The tensors of `obj`, converted and checked against `expected` (names, shapes, order).
NamedTensors TensorsFromPython(pybind11::handle obj, const std::vector<TensorInfo>& expected);

// The names and shapes of `tensors`.
std::vector<TensorInfo> InfoOf(const NamedTensors& tensors);

// "(16, 1, 5, 5)": a shape as Python writes it (a 1-tuple gets its comma).
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace huddle::client::python
