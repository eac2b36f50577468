#include "client/python/py_trainer.h"

#include <pybind11/stl.h>

#include <chrono>
#include <utility>

#include "client/python/tensors.h"

namespace huddle::client::python {
namespace py = pybind11;
using namespace pybind11::literals;

// --- PythonGate ---

bool PythonGate::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  ++inside_;
  return true;
}

void PythonGate::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--inside_ == 0) idle_.notify_all();
}

bool PythonGate::closed() {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void PythonGate::CloseAndInterrupt() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  // The GIL is held: the worker is between bytecodes or inside a C call; it sees the exception at
  // its next bytecode. A call that has returned has cleared call_thread_ under the GIL.
  if (call_thread_ != 0) PyThreadState_SetAsyncExc(call_thread_, PyExc_KeyboardInterrupt);
}

void PythonGate::WaitUntilIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return inside_ == 0; });
}

namespace {

// Marks the current Python thread as the one running a trainer method, for the gate's interrupt.
class InterruptibleScope {
 public:
  explicit InterruptibleScope(PythonGate* gate) : gate_(gate) {
    if (gate_ != nullptr) gate_->set_call_thread(PyThread_get_thread_ident());
  }
  ~InterruptibleScope() {
    if (gate_ != nullptr) gate_->set_call_thread(0);
  }
  InterruptibleScope(const InterruptibleScope&) = delete;
  InterruptibleScope& operator=(const InterruptibleScope&) = delete;

 private:
  PythonGate* gate_;
};

// "ValueError: bad batch": a Python exception's type (module-qualified unless a builtin) and text.
std::string TypeAndMessage(const py::error_already_set& e) {
  std::string type = "exception";
  std::string message;
  try {
    const py::handle t = e.type();
    type = py::str(t.attr("__qualname__"));
    const std::string module = py::str(t.attr("__module__"));
    if (module != "builtins") type = module + "." + type;
    message = py::str(e.value());
  } catch (py::error_already_set&) {
    PyErr_Clear();
  }
  return message.empty() ? type : type + ": " + message;
}

// " (client.py:80 in fit)": where the exception was raised, the innermost frame of its traceback.
std::string Where(const py::error_already_set& e) {
  if (!e.trace()) return "";
  try {
    const py::list frames = py::module_::import("traceback").attr("extract_tb")(e.trace());
    if (frames.empty()) return "";
    const py::handle last = frames[frames.size() - 1];
    const std::string file =
        py::str(py::module_::import("os.path").attr("basename")(last.attr("filename")));
    return " (" + file + ":" + std::string(py::str(last.attr("lineno"))) + " in " +
           std::string(py::str(last.attr("name"))) + ")";
  } catch (py::error_already_set&) {
    PyErr_Clear();
    return "";
  }
}

// Prints the exception's traceback to sys.stderr, under a line that says what it did to the round.
void PrintTraceback(const char* method, const py::error_already_set& e) {
  try {
    const py::object stderr_ = py::module_::import("sys").attr("stderr");
    py::print(std::string("huddle_client: Trainer.") + method +
                  " raised (the client reports the call as failed):",
              "file"_a = stderr_);
    py::module_::import("traceback")
        .attr("print_exception")(e.type(), e.value(), e.trace(), "file"_a = stderr_);
    stderr_.attr("flush")();
  } catch (py::error_already_set&) {
    PyErr_Clear();
  }
}

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Where one fit call's time went: waiting for the GIL, the global model into numpy, the Python
// fit, its result back into NamedTensors.
struct FitTimes {
  double gil_s = 0, in_s = 0, python_s = 0, out_s = 0;
};

// One DEBUG line per fit on the `logging` logger "huddle_client": the binding's share of the
// round. Never fails the call.
void LogFitTimes(uint64_t round, const FitTimes& t) {
  try {
    const py::object logger = py::module_::import("logging").attr("getLogger")("huddle_client");
    if (!logger.attr("isEnabledFor")(py::module_::import("logging").attr("DEBUG")).cast<bool>()) {
      return;
    }
    logger.attr("debug")(
        "round %d fit: %.3f s in Trainer.fit, %.4f s in the binding (GIL %.4f s, tensors in "
        "%.4f s, out %.4f s)",
        round, t.python_s, t.gil_s + t.in_s + t.out_s, t.gil_s, t.in_s, t.out_s);
  } catch (py::error_already_set&) {
    PyErr_Clear();
  }
}

[[noreturn]] void NotImplemented(const char* method, const char* signature) {
  throw Error(std::string("Trainer.") + method +
              " is not implemented: a subclass of "
              "huddle_client.Trainer must define " +
              signature);
}

}  // namespace

template <typename Body>
auto PyTrainer::Call(const char* method, Body&& body) const -> decltype(body()) {
  PythonGate* gate = gate_.get();
  const std::string stopping =
      std::string("Trainer.") + method + " not called: the Python client is stopping";
  if (gate != nullptr && !gate->Enter()) throw Error(stopping);
  struct Leave {
    PythonGate* gate;
    ~Leave() {
      if (gate != nullptr) gate->Leave();
    }
  } leave{gate};
  py::gil_scoped_acquire gil;
  if (gate != nullptr && gate->closed()) throw Error(stopping);
  std::string error;
  try {
    return body();
  } catch (py::error_already_set& e) {
    // Raised by the Python method itself.
    if (!e.matches(PyExc_KeyboardInterrupt)) PrintTraceback(method, e);
    error = std::string("Trainer.") + method + " raised " + TypeAndMessage(e) + Where(e);
  } catch (py::builtin_exception& e) {
    // What it returned was not usable (tensors.h's TypeError and ValueError, a failed cast).
    e.set_error();
    py::error_already_set fetched;
    error = std::string("Trainer.") + method +
            " returned an invalid result: " + TypeAndMessage(fetched);
  }
  // Every Python object of the error is gone; only the message leaves, the GIL released.
  throw Error(error);
}

bool PyTrainer::Overrides(const char* method) const {
  return static_cast<bool>(py::get_override(static_cast<const Trainer*>(this), method));
}

int64_t PyTrainer::NumExamplesLocked() const {
  py::function override = py::get_override(static_cast<const Trainer*>(this), "num_examples");
  if (!override) NotImplemented("num_examples", "num_examples(self) -> int");
  InterruptibleScope scope(gate_.get());
  return override().cast<int64_t>();
}

int64_t PyTrainer::num_examples() const {
  return Call("num_examples", [&] { return NumExamplesLocked(); });
}

void PyTrainer::Start(const JobInfo& job) {
  Call("start", [&] {
    py::function override = py::get_override(static_cast<const Trainer*>(this), "start");
    if (!override) return;
    InterruptibleScope scope(gate_.get());
    override(job);
  });
}

FitResult PyTrainer::Fit(const NamedTensors& global, const FitConfig& config) {
  const auto entered = Clock::now();
  return Call("fit", [&] {
    FitTimes times;
    const auto locked = Clock::now();
    times.gil_s = Seconds(entered, locked);
    py::function override = py::get_override(static_cast<const Trainer*>(this), "fit");
    if (!override) NotImplemented("fit", "fit(self, weights, config) -> FitResult");
    py::list weights = TensorsToPython(global);
    const auto called = Clock::now();
    times.in_s = Seconds(locked, called);
    py::object returned;
    {
      InterruptibleScope scope(gate_.get());
      returned = override(std::move(weights), config);
    }
    const auto returned_at = Clock::now();
    times.python_s = Seconds(called, returned_at);
    if (!py::isinstance<PyFitResult>(returned)) {
      throw py::type_error("fit returned a " +
                           std::string(py::str(py::type::handle_of(returned).attr("__name__"))) +
                           ", not a huddle_client.FitResult");
    }
    const PyFitResult& r = returned.cast<const PyFitResult&>();
    FitResult out;
    out.tensors = TensorsFromPython(r.tensors, InfoOf(global));
    out.is_delta = r.is_delta;
    out.num_examples = r.num_examples != 0 ? r.num_examples : NumExamplesLocked();
    out.metrics = r.metrics;
    out.dp_sgd = r.dp_sgd;
    times.out_s = Seconds(returned_at, Clock::now());
    LogFitTimes(config.round, times);
    return out;
  });
}

bool PyTrainer::can_evaluate() const {
  return Call("can_evaluate", [&] {
    py::function override = py::get_override(static_cast<const Trainer*>(this), "can_evaluate");
    if (!override) return Overrides("evaluate");
    InterruptibleScope scope(gate_.get());
    return override().cast<bool>();
  });
}

EvaluateResult PyTrainer::Evaluate(const NamedTensors& model) {
  return Call("evaluate", [&] {
    py::function override = py::get_override(static_cast<const Trainer*>(this), "evaluate");
    if (!override) NotImplemented("evaluate", "evaluate(self, weights) -> EvaluateResult");
    py::object returned;
    {
      InterruptibleScope scope(gate_.get());
      returned = override(TensorsToPython(model));
    }
    if (!py::isinstance<EvaluateResult>(returned)) {
      throw py::type_error("evaluate returned a " +
                           std::string(py::str(py::type::handle_of(returned).attr("__name__"))) +
                           ", not a huddle_client.EvaluateResult");
    }
    return returned.cast<EvaluateResult>();
  });
}

}  // namespace huddle::client::python
