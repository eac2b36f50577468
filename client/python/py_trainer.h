// The Python side of huddle::client::Trainer (huddle/client/trainer.h): the trampoline that lets a
// Python subclass of huddle_client.Trainer be driven by the client SDK's Run.
//
// The SDK calls a trainer from its own worker thread, one call at a time, while run()'s calling
// thread waits with the GIL released (run.h). Each call therefore:
//   1. passes the gate (PythonGate): once run() has been interrupted no call enters Python again;
//   2. takes the GIL (pybind11::gil_scoped_acquire: the worker gets a Python thread state);
//   3. looks up the Python override (pybind11::get_override) and calls it, the model's tensors
//      given as numpy float32 copies (tensors.h) and the result converted back while the GIL is
//      still held;
//   4. turns every Python exception into huddle::client::Error, whose message carries the
//      exception's type and message and where it was raised ("Trainer.fit raised ValueError: bad
//      batch (client.py:80 in fit)"), with the full traceback printed to sys.stderr. The Python
//      exception object (pybind11::error_already_set) is destroyed there, under the GIL: nothing
//      that holds a Python reference ever leaves the call, so the agent may copy, log and destroy
//      the error on any thread without the GIL. A failed fit or evaluate fails that round for
//      this client (the agent's rule); a failed start refuses the job.
//   5. fit only: logs at DEBUG on the `logging` logger "huddle_client" where the call's time went
//      ("round 3 fit: 12.301 s in Trainer.fit, 0.0021 s in the binding (GIL 0.0001 s, tensors in
//      0.0004 s, out 0.0016 s)"): the binding's overhead per round.
//
// Methods a subclass does not define: num_examples and fit are required (Error otherwise);
// start does nothing; can_evaluate is true when the subclass defines evaluate.
#pragma once

#include <pybind11/pybind11.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "huddle/client/client.h"
#include "huddle/client/trainer.h"

namespace huddle::client::python {

// What a Python fit() returns (huddle_client.FitResult): FitResult's fields with the tensors
// still Python objects, converted and checked against the round's model when fit returns.
struct PyFitResult {
  pybind11::object tensors = pybind11::list();  // see tensors.h for what is accepted
  bool is_delta = false;
  int64_t num_examples = 0;  // 0: the trainer's num_examples()
  std::map<std::string, double> metrics;
  std::optional<DpSgdReport> dp_sgd;
};

// Between run()'s calling thread and the trainer's calls on the SDK's worker thread. Once closed,
// no call enters Python; CloseAndInterrupt also raises KeyboardInterrupt inside a Python call in
// progress, so that a long fit ends at its next bytecode instead of at its natural end.
class PythonGate {
 public:
  // Worker, before taking the GIL: false once the gate is closed (the call must not go on).
  bool Enter();
  // Worker, after the call, whether or not it entered Python.
  void Leave();
  // Worker, with the GIL held: whether the gate closed while the call waited for the GIL.
  bool closed();
  // Worker, with the GIL held: the Python thread id running a trainer method (0: none).
  void set_call_thread(unsigned long id) { call_thread_ = id; }
  // run()'s thread, with the GIL held: closes the gate and interrupts the call in progress.
  void CloseAndInterrupt();
  // run()'s thread, with the GIL released: returns once no call is inside the gate.
  void WaitUntilIdle();

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  bool closed_ = false;
  int inside_ = 0;
  unsigned long call_thread_ = 0;  // guarded by the GIL
};

class PyTrainer : public Trainer {
 public:
  int64_t num_examples() const override;
  void Start(const JobInfo& job) override;
  FitResult Fit(const NamedTensors& global, const FitConfig& config) override;
  bool can_evaluate() const override;
  EvaluateResult Evaluate(const NamedTensors& model) override;

  // run() gates every call while it runs (nullptr: calls go straight to Python). GIL held.
  const std::shared_ptr<PythonGate>& gate() const { return gate_; }
  void set_gate(std::shared_ptr<PythonGate> gate) { gate_ = std::move(gate); }

  // Whether the Python class defines `method` itself (GIL held).
  bool Overrides(const char* method) const;

 private:
  // Runs `body` (which needs the GIL) as the trainer's `method`, as the header comment describes.
  template <typename Body>
  auto Call(const char* method, Body&& body) const -> decltype(body());
  // The Python num_examples(), the GIL held.
  int64_t NumExamplesLocked() const;

  std::shared_ptr<PythonGate> gate_;
};

}  // namespace huddle::client::python
