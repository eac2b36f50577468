#include "client/python/run.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "client/python/py_trainer.h"

namespace huddle::client::python {
namespace py = pybind11;

namespace {

using std::chrono::milliseconds;

constexpr milliseconds kSignalPoll{100};
constexpr milliseconds kStopWait{10000};

// Run's end, shared with the thread running it (which may outlive run() after an interrupt).
struct RunOutcome {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr error;
  std::atomic<bool> stop{false};

  void Finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    error = std::move(e);
    finished = true;
    cv.notify_all();
  }
  // Whether Run has returned within `timeout`.
  bool WaitFor(milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [this] { return finished; });
  }
};

// After an interrupt, should Run not return within kStopWait, it still runs on a detached thread,
// and would use the SDK's static objects (its logger) after exit() had destroyed them: the process
// would crash on its way out. So the process's exit, once Python has finalized (Py_Exit ->
// exit(status)), ends at an on_exit handler, registered after those objects and therefore run
// before their destructors, which flushes stdio and _exits with the same status.
void ExitBeforeStaticDestructors() {
  static std::once_flag once;
  std::call_once(once, [] {
    on_exit(
        [](int status, void*) {
          std::fflush(nullptr);
          std::_Exit(status);
        },
        nullptr);
  });
}

}  // namespace

void RunPython(py::handle trainer_handle, const ClientOptions& client_options) {
  auto* trainer = dynamic_cast<PyTrainer*>(&trainer_handle.cast<Trainer&>());
  if (trainer == nullptr) throw Error("run: the trainer is not a huddle_client.Trainer");
  if (trainer->gate() != nullptr) throw Error("run: this trainer is already running");
  // Our own reference: the thread running Run must never see the trainer die.
  py::object keep = py::reinterpret_borrow<py::object>(trainer_handle);
  auto gate = std::make_shared<PythonGate>();
  auto outcome = std::make_shared<RunOutcome>();
  ClientOptions options = client_options;
  options.stop = &outcome->stop;
  trainer->set_gate(gate);

  std::thread worker([trainer, options, outcome] {
    std::exception_ptr error;
    try {
      Run(*trainer, options);
    } catch (...) {
      error = std::current_exception();
    }
    outcome->Finish(error);
  });

  bool interrupted = false;
  while (true) {
    bool finished;
    {
      py::gil_scoped_release nogil;
      finished = outcome->WaitFor(kSignalPoll);
    }
    if (finished) break;
    if (PyErr_CheckSignals() != 0) {
      interrupted = true;
      break;
    }
  }

  if (!interrupted) {
    {
      py::gil_scoped_release nogil;
      worker.join();
    }
    trainer->set_gate(nullptr);
    if (outcome->error) std::rethrow_exception(outcome->error);
    return;
  }

  // A signal handler raised (KeyboardInterrupt): stop the client, then raise it here.
  py::error_already_set raised;
  gate->CloseAndInterrupt();
  outcome->stop = true;
  bool finished;
  {
    py::gil_scoped_release nogil;
    gate->WaitUntilIdle();
    finished = outcome->WaitFor(kStopWait);
  }
  if (finished) {
    {
      py::gil_scoped_release nogil;
      worker.join();
    }
    trainer->set_gate(nullptr);
  } else {
    // Run goes on without Python (the gate stays closed) until the process exits; it keeps its
    // reference to the trainer.
    worker.detach();
    keep.release();
    ExitBeforeStaticDestructors();
  }
  throw raised;
}

}  // namespace huddle::client::python
